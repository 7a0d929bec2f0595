"""Live console messages while training runs: slow compilations, slow first steps, recompile storms, frames
that run eagerly from now on."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable

from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.breaks import gist, recompile_owner, user_location
from telemetry_jit.causes import CAUSES, Classified, normalize_reason
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import Notices
from telemetry_jit.recording.listener import CompileListener, FirstStep
from telemetry_jit.records import CompileRecord, CompileResources, first_step_line
from telemetry_jit.terminal import clean, shown

_log = logging.getLogger("telemetry_jit")
LARGE_COMPILE_BYTES = 2**30  # a compile whose host memory grows this much is said, however fast
_PRINT = call_site("console.print", "printing a live console line (the progress bar's print, or your print_fn)")


def say_line(print_fn: Callable[[str], object], line: str) -> None:
    """``line`` to the console through ``print_fn``, cleaned (names and torch's reasons come from code and
    data); when ``print_fn`` fails (a closed progress bar, a user's print_fn), the ``telemetry_jit`` logger."""
    line = clean(line)
    if _PRINT.call(print_fn, line) is FAILED:
        _log.warning(line)


class CompileConsole(CompileListener):
    """Say what is compiling when a compilation runs longer than ``threshold_s``, and how long it took; how a
    first step that long was spent; and, once per frame, a recompile storm (``storm_recompiles`` recompiles
    within ``storm_steps`` steps) with its cause and fix. Fast compilations stay quiet. Lines go to
    ``print_fn`` (the trainer callback passes the progress bar's ``print``), else the ``telemetry_jit`` logger."""

    def __init__(
        self,
        threshold_s: float = 1.0,
        storm_recompiles: int = 4,
        storm_steps: int = 100,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        self.threshold_s = threshold_s
        self.storm_recompiles = storm_recompiles
        self.storm_steps = storm_steps
        self.print_fn = print_fn
        # stage -> the name a first step's line gives it in this run (the trainer callback names a
        # validation run by Trainer.validate "validate()", as the summary does)
        self.stage_names: dict[str, str] = {}
        self._timer: threading.Timer | None = None
        self._announced = False
        self._started = 0.0
        self._what = ""
        self._raising: BaseException | None = None
        self._resources: CompileResources | None = None
        # frame id -> (step, cause, stage) of its last recompiles
        self._recent: dict[str, deque[tuple[int, Classified | None, str]]] = defaultdict(
            lambda: deque(maxlen=self.storm_recompiles)
        )
        self._notices = Notices()

    def __reduce__(self) -> tuple[type[CompileConsole], tuple[float, int, int]]:
        # into a spawned rank go the thresholds; it prints through its own progress bar or logger
        return CompileConsole, (self.threshold_s, self.storm_recompiles, self.storm_steps)

    def _say(self, message: str) -> None:
        say_line(self.print_fn or _log.warning, message)

    def compile_started(self, description: str) -> None:
        self.compile_finished()
        self._what, self._started, self._announced = description, time.perf_counter(), False
        self._resources = None
        self._raising = sys.exc_info()[1]  # an exception being handled already (a compile inside an except block)
        self._timer = threading.Timer(self.threshold_s, self._announce)
        self._timer.daemon = True
        self._timer.start()

    def _announce(self) -> None:
        self._announced = True
        self._say(f"telemetry-jit: compiling {self._what} ...")

    def compile_measured(self, resources: CompileResources) -> None:
        self._resources = resources

    def compile_progress(self, description: str, elapsed_s: float, phase: str) -> None:
        where = f", in torch's {phase}" if phase else ""
        seconds = f"{elapsed_s:.1f}" if elapsed_s < 10 else f"{elapsed_s:.0f}"
        self._say(f"telemetry-jit: still compiling {description}: {seconds} s so far{where}")

    def compile_finished(self) -> None:
        timer, self._timer = self._timer, None
        if timer is None:
            return
        timer.cancel()
        resources, self._resources = self._resources, None
        large = resources is not None and resources.host_peak_bytes >= LARGE_COMPILE_BYTES
        if self._announced or large:
            cost = f": {resources.words()}" if resources is not None else ""
            seconds = time.perf_counter() - self._started
            # torch ends a compile's callbacks in a finally: an exception in flight there is the compile's own
            error = sys.exc_info()[1]
            if error is not None and error is not self._raising:
                why = gist(f"{type(error).__name__}: {error}", 300)
                self._say(f"telemetry-jit: compiling {self._what} failed after {seconds:.1f} s{cost}: {why}")
            else:
                self._say(f"telemetry-jit: compiled {self._what} in {seconds:.1f} s{cost}")

    def first_step(self, step: FirstStep) -> None:
        if step.wall_ms >= self.threshold_s * 1000 and step.compilations:
            stage = self.stage_names.get(step.stage, step.stage)
            line = first_step_line(stage, step.global_step, step.wall_ms, step.compile_ms, step.phases_s)
            self._say(f"telemetry-jit: {line}")

    def recorded(self, record: CompileRecord) -> None:
        """Watch for a frame that keeps recompiling."""
        if not record.is_frame_recompile or (record.cause is not None and record.cause.expected):
            return  # the expected one-time price (a first stage switch, callers of shared code) is no storm
        global_step = record.context.global_step if record.context is not None else 0
        recent = self._recent[record.frame_id]
        recent.append((global_step, record.cause, record.context.stage if record.context is not None else ""))
        if len(recent) < self.storm_recompiles or recent[-1][0] - recent[0][0] > self.storm_steps:
            return
        causes = Counter(cause.cause for _, cause, _ in recent if cause is not None)
        if not causes or causes.most_common(1)[0][0] == "stage_switch":
            return  # switching stages: the expected price, not a storm
        owner = recompile_owner(record.frame, record.location)
        said = []  # each cause apart, with the fix for the stage its recompiles happened in
        for name, count in causes.most_common():
            cause = CAUSES[name]
            subject, stage = next(
                (c.subject, stage) for _, c, stage in reversed(recent) if c is not None and c.cause == name
            )
            fix = f"{cause.title} ({subject}). Fix: {cause.fix_for(stage, owner)} ({cause.doc})"
            said.append(fix if len(causes) == 1 else f"{count} of them: {fix}")
        frame = (
            f"{record.frame or record.frame_id} ({shown(record.location) if record.location else 'unknown location'})"
        )
        self._notices.warn(
            record.frame_id,
            f"telemetry-jit: recompile storm: {frame} recompiled {len(recent)} times within "
            f"{recent[-1][0] - recent[0][0]} steps: " + "; ".join(said),
            origin=user_location((*record.callers, record.location)),
        )


class EagerFallbackAlert(CompileListener):
    """Warn once per frame that runs eagerly from now on (its recompile limit hit, or its compile failed under
    ``suppress_errors``): torch says so only in one log line."""

    def __init__(self) -> None:
        self._notices = Notices()

    def recorded(self, record: CompileRecord) -> None:
        step = record.context.global_step if record.context is not None else 0
        where = shown(record.location) if record.location else "unknown location"  # as the summary writes it
        if record.fell_back_to_eager and not record.recompile_limit_hit:
            self._notices.warn(
                record.frame_id,
                f"telemetry-jit: compiling {record.frame or 'a frame'} ({where}) "
                f"failed at step {step} and it runs eagerly from now on, without compilation: "
                f"{gist(record.failure, 300) or 'torch gave no reason'}. `telemetry-jit check "
                "--no-eager-fallback` fails such a run.",
                origin=record.location,
            )
        if not record.recompile_limit_hit:
            return
        behind = record.cause.behind if record.cause is not None else ""
        if behind in CAUSES:
            stage = record.context.stage if record.context is not None else ""
            fix = CAUSES[behind].fix_for(stage, recompile_owner(record.frame, record.location))
            why = f"its recompiles were mostly: {CAUSES[behind].title}. Fix that: {fix}"
        else:
            why = f"its last recompile: {normalize_reason(record.recompile_reason) or 'unknown'}. Fix what changes"
        limit, value = torch_compat.recompile_limit(record.failure)
        self._notices.warn(
            record.frame_id,
            f"telemetry-jit: {record.frame or 'a frame'} ({where}) hit "
            f"torch._dynamo.config.{limit} ({value}) at step {step} and runs "
            f"eagerly from now on, without compilation; {why} ({CAUSES['recompile_limit'].doc}). Raising the limit "
            "only postpones it.",
            origin=record.location,
        )
