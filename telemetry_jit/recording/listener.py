"""What the recorder tells whoever follows compilations (totals, metrics, the console, alerts, loggers): each
compilation, and how long the first step of each stage took and how much of it was compiling (a 40-second first
step told as "38 s compiling, 2 s running")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from telemetry_jit.records import AttributeValue, CompileRecord, CompileResources
from telemetry_jit.schema import StepAttr


@dataclass
class FirstStep:
    """The first step of a stage (training, validation, ...): its wall time and the compiles in it."""

    stage: str
    global_step: int
    batch_index: int | None
    start_ns: int
    end_ns: int = 0
    compile_ms: float = 0.0
    compilations: int = 0
    # seconds compiling forward graphs (dynamo's frames) and backward graphs, and inductor's part of both
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def wall_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            StepAttr.STAGE: self.stage,
            StepAttr.GLOBAL_STEP: self.global_step,
            StepAttr.WALL_MS: round(self.wall_ms, 3),
            StepAttr.COMPILE_MS: round(self.compile_ms, 3),
            StepAttr.COMPILATIONS: self.compilations,
            # outside compiling: running the step, and what torch does not count as compiling
            StepAttr.OTHER_MS: round(max(self.wall_ms - self.compile_ms, 0.0), 3),
        }
        if self.batch_index is not None:
            attributes[StepAttr.BATCH_INDEX] = self.batch_index
        attributes.update({StepAttr.phase_time(phase): round(s, 6) for phase, s in self.phases_s.items()})
        return attributes


class FirstSteps:
    """Measures the first step after the stage changes; driven by the recorder at each step."""

    def __init__(self) -> None:
        self._stage = ""
        self._open: FirstStep | None = None

    def batch_started(self, stage: str, global_step: int, batch_index: int | None) -> FirstStep | None:
        """A batch begins; the first step that just ended, if one was measured."""
        if self._open is None and stage == self._stage:  # most steps: no clock to read
            return None
        now = time.time_ns()
        finished = self._close(now)
        if stage != self._stage:
            self._stage = stage
            self._open = FirstStep(stage, global_step, batch_index, now)
        return finished

    def batch_ended(self) -> None:
        """The batch running ended (where the adapter says so: Lightning's batch-end hooks): a first step's wall time
        ends here, not at the next batch's start (Lightning's hooks and the next batch's loading in between). Its
        compiles are taken at the next batch's start, which closes it."""
        step = self._open
        if step is not None and not step.end_ns:  # most batches: nothing open
            step.end_ns = time.time_ns()

    def loop_ended(self) -> FirstStep | None:
        """The loop ended (a stage of one step ends with it)."""
        return self._close(time.time_ns())

    def recorded(self, record: CompileRecord) -> None:
        step = self._open
        if step is None or record.start_ns < step.start_ns or (step.end_ns and record.start_ns >= step.end_ns):
            return
        step.compile_ms += record.duration_ms
        step.compilations += 1
        kind = "backward" if record.trigger == "lazy_backward" else "forward"
        step.phases_s[kind] = step.phases_s.get(kind, 0.0) + record.duration_ms / 1000
        if "inductor" in record.phase_times_s:
            step.phases_s["inductor"] = step.phases_s.get("inductor", 0.0) + record.phase_times_s["inductor"]

    def _close(self, now: int) -> FirstStep | None:
        step, self._open = self._open, None
        if step is not None and not step.end_ns:  # its batch's end not said: the next batch's start
            step.end_ns = now
        return step


class CompileListener:
    """Told of compilations while a run is recorded; every method does nothing unless overridden.
    ``compile_started``, ``compile_measured`` and ``compile_finished`` run inside torch's compile callbacks:
    keep them cheap, never raise."""

    def compile_started(self, description: str) -> None:
        """``description`` names the code (and a recompile's reason) in words."""

    def compile_measured(self, resources: CompileResources) -> None:
        """What the compilation ending cost the host (just before ``compile_finished``)."""

    def compile_finished(self) -> None:
        """The compilation that began last ended."""

    def compile_progress(self, description: str, elapsed_s: float, phase: str) -> None:
        """The compilation that began last still runs, ``elapsed_s`` in, inside torch's ``phase`` ('' unknown):
        called every ``recording.progress.PROGRESS_EVERY_S`` seconds from a timer thread."""

    def recorded(self, record: CompileRecord) -> None:
        """Once per compilation: ``record.context`` says where training was, ``record.cause`` why it recompiled."""

    def first_step(self, step: FirstStep) -> None:
        """Once per stage, when its first step has been measured."""
