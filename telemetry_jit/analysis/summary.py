"""What a run's compile telemetry amounts to (:func:`summarize`): typed results the text, JSON and HTML
renderers share, read from the run's loops and its :class:`~telemetry_jit.analysis.digest.RunDigest`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from telemetry_jit.analysis.cold_start import warm_start_json
from telemetry_jit.analysis.digest import (
    BreakGroup,
    CauseRow,
    Fallback,
    RunDigest,
    loops_around,
    outermost_loop,
    stage_named,
)
from telemetry_jit.analysis.fleet import out_of_step_said
from telemetry_jit.analysis.reader import digest_of
from telemetry_jit.analysis.runs import EventRecord, RunStatus, TelemetryRun, number, run_status
from telemetry_jit.records import CompiledBefore, CompileNotRun, FallbackCost, NotCompiled, Payoff, why_slower
from telemetry_jit.schema import CompileAttr, JitEventName, StepAttr, TrainAttr, TrainingSpanName
from telemetry_jit.terminal import counted, frame_label

LOOP_WORDS = {  # in order: the loop a run is measured by is the first kind it has
    TrainingSpanName.TRAINING_LOOP: "the training loop",
    TrainingSpanName.VALIDATION_LOOP: "the validation loop",
    TrainingSpanName.TESTING_LOOP: "the test loop",
    TrainingSpanName.APPLICATION: "the application",
}
STAGE_WORDS = {
    "sanity_check": "sanity check",
    "validate": "validation",
    "test": "test()",
    "predict": "predict()",
    "tuner": "the Tuner's trials",
    "train": "training",
}
_LACKS_POSITIONS = (
    "no batch positions (written by an older telemetry-jit): a smaller last batch is counted as a changing dimension"
)
_LACKS_STACKS = (
    "no call stacks for graph breaks (written by an older telemetry-jit): a break in another package's code is not "
    "traced back to your line"
)


@dataclass(frozen=True)
class FirstStepRow:
    """The first step of a stage: its wall time, and how much of it was compiling."""

    stage: str  # as digest.stage_named names it: validate() where Trainer.validate ran it by itself
    global_step: int
    wall_ms: float
    compile_ms: float
    phases_s: dict[str, float]
    loop: str = ""  # the span id of the outermost loop it ran in (its fit's training loop)

    def as_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "global_step": self.global_step,
            "wall_s": round(self.wall_ms / 1000, 3),
            "compile_s": round(self.compile_ms / 1000, 3),
            "other_s": round(max(self.wall_ms - self.compile_ms, 0.0) / 1000, 3),
            "compile_phases_s": {phase: round(seconds, 3) for phase, seconds in self.phases_s.items()},
        }


@dataclass
class RunSummary:
    """One run: its status, its loop's wall time and what compiling took of it, and the digest's answers."""

    run: TelemetryRun
    digest: RunDigest
    status: RunStatus
    loop_name: str  # the loop the run is measured by (LOOP_WORDS)
    wall_ms: float  # of that loop (every span of it), to the last record for one that never ended
    application_ms: float  # the whole application span: what compiling outside the loop is counted against
    compile_in_loop_ms: float  # compiling inside that loop
    payoff: Payoff | None = None  # what compiling bought, where the run measured it
    first_steps: list[FirstStepRow] = field(default_factory=list)
    thunder_rows: list[tuple[str, int, int]] = field(default_factory=list)  # thunder's modules: cache misses, hits
    lacks: list[str] = field(default_factory=list)  # what the file could not tell
    last_step: int | None = None  # the global step at the end of the loop (files since compile_summary said it)
    fallbacks: list[Fallback] = field(default_factory=list)  # the digest's, with what each cost where measured
    not_compiled: list[NotCompiled] = field(default_factory=list)  # modules Module.compile() compiled nothing of
    not_run: list[str] = field(default_factory=list)  # compiling switched off, compiled code that never ran: words
    compiled_before: CompiledBefore | None = None  # what the process had compiled when the run began
    loop_ids: tuple[str, ...] = ()  # that loop's spans, in the order they started

    @property
    def loop_count(self) -> int:
        """Spans of that loop: several where fit was called again, or by another trainer, in one application."""
        return max(len(self.loop_ids), 1)

    @property
    def loop_words(self) -> str:
        """``the training loop``, or ``the 3 training loops`` whose figures are said together."""
        words = LOOP_WORDS[self.loop_name]
        return words if self.loop_count <= 1 else f"the {counted(self.loop_count, words.removeprefix('the '))}"

    def loop_numbers(self, loops: Iterable[str]) -> list[int]:
        """Which of several loops (1 for the first) the spans ``loops`` are; none where the run has one."""
        if len(self.loop_ids) <= 1:
            return []
        return sorted(self.loop_ids.index(loop) + 1 for loop in set(loops) if loop in self.loop_ids)

    @property
    def share(self) -> float | None:
        """Compiling inside the loop over the loop's wall time, 0 - 1 (``None`` without a loop)."""
        return min(self.compile_in_loop_ms / self.wall_ms, 1.0) if self.wall_ms > 0 else None

    @property
    def outside_ms(self) -> dict[str, float]:
        """Compiling outside the loop, by stage (sanity check, the Tuner, a validate() after fit, ...), most first."""
        outside: dict[str, float] = defaultdict(float)
        for (stage, loops), ms in self.digest.ms_by_stage_loops.items():
            if self.loop_name not in loops:
                outside[stage] += ms
        return {stage: ms for stage, ms in sorted(outside.items(), key=lambda item: -item[1]) if ms > 0}

    @property
    def causes(self) -> list[CauseRow]:
        """Every recompile in exactly one row, what to fix (costliest first) before the expected price."""
        return sorted(self.digest.causes.values(), key=lambda row: (row.unexpected == 0, -row.compile_ms))

    @property
    def breaks(self) -> list[BreakGroup]:
        """Breaks by place and type, the user's own code first, most first."""
        return sorted(self.digest.breaks.values(), key=lambda group: (group.owner != "user", -group.count))

    @property
    def payoff_sentence(self) -> str:
        """The payoff in one line, with the likely reason when compiling loses (breaks, recompiles in training)."""
        d = self.digest
        why = why_slower(d.train_breaks, d.train_recompiles, d.backends, d.plain_backends)
        return self.payoff.sentence(why) if self.payoff is not None else ""


def summarize(run: TelemetryRun) -> RunSummary:
    digest = digest_of(run)
    loop_name = next((name for name in LOOP_WORDS if run.find(name)), TrainingSpanName.APPLICATION)
    loops = run.find(loop_name)
    end = run.last_unix_ns
    wall_ms = sum(((span.end_unix_ns or end) - span.start_unix_ns) / 1e6 for span in loops)
    applications = run.find(TrainingSpanName.APPLICATION)
    measured = list(run.events(JitEventName.COMPILE_PAYOFF, loops))
    summaries = list(run.events(JitEventName.COMPILE_SUMMARY, loops))
    not_compiled = run.events(JitEventName.MODULE_NOT_COMPILED)  # modules Module.compile() compiled nothing of
    steps = [
        int(number(e.attributes[TrainAttr.GLOBAL_STEP])) for e in summaries if TrainAttr.GLOBAL_STEP in e.attributes
    ]
    lacks = [*run.lacks]
    if digest.recompiles and digest.lacks_positions:
        lacks.append(_LACKS_POSITIONS)
    if digest.break_count and digest.lacks_stacks:
        lacks.append(_LACKS_STACKS)
    return RunSummary(
        run=run,
        digest=digest,
        status=run_status(run),
        loop_name=loop_name,
        wall_ms=wall_ms,
        application_ms=sum(((span.end_unix_ns or end) - span.start_unix_ns) / 1e6 for span in applications),
        compile_in_loop_ms=sum(ms for (_, around), ms in digest.ms_by_stage_loops.items() if loop_name in around),
        payoff=Payoff.from_attributes(measured[-1].attributes) if measured else None,
        first_steps=_first_steps(run),
        thunder_rows=_thunder_rows(summaries),
        lacks=lacks,
        last_step=max(steps, default=None),
        fallbacks=_costed(digest.fallbacks, run),
        # each hooked trainer class says it: each once
        not_compiled=list(dict.fromkeys(NotCompiled.from_attributes(e.attributes) for e in not_compiled)),
        compiled_before=compiled_before(run),
        not_run=list(
            dict.fromkeys(
                CompileNotRun.from_attributes(e.attributes).words() for e in run.events(JitEventName.COMPILE_NOT_RUN)
            )
        ),
        loop_ids=tuple(loop.span_id for loop in sorted(loops, key=lambda loop: loop.start_unix_ns)),
    )


def compiled_before(run: TelemetryRun) -> CompiledBefore | None:
    """What the process had compiled when the run's compile telemetry began (``None``: nothing)."""
    said = next(run.events(JitEventName.COMPILED_BEFORE_RUN), None)
    return CompiledBefore.from_attributes(said.attributes) if said is not None else None


def _costed(fallbacks: list[Fallback], run: TelemetryRun) -> list[Fallback]:
    """The fallbacks with their ``eager_fallback_cost`` (said at each loop's end: the one over most batches)."""
    costs: dict[tuple[str, int], FallbackCost] = {}
    for event in run.events(JitEventName.FALLBACK_COST):
        cost = FallbackCost.from_attributes(event.attributes)
        key = (frame_label(cost.frame, cost.location), cost.step)
        if key not in costs or cost.batches_since >= costs[key].batches_since:
            costs[key] = cost
    return [replace(fallback, cost=costs.get((fallback.frame, fallback.step))) for fallback in fallbacks]


def _first_steps(run: TelemetryRun) -> list[FirstStepRow]:
    prefix = StepAttr.phase_time("")[: -len("_s")]
    said = [
        (event, span) for span in run.spans.values() for event in span.events if event.name == JitEventName.FIRST_STEP
    ]
    rows = []
    for event, span in sorted(said, key=lambda pair: pair[0].time_unix_ns):
        attributes = event.attributes
        phases: dict[str, float] = defaultdict(float)
        for name, value in attributes.items():
            if name.startswith(prefix) and name.endswith("_s"):
                phases[name[len(prefix) : -len("_s")]] += number(value)
        loops = [span, *loops_around(span, run.spans)]  # the loop it was said on, and those around it
        row = FirstStepRow(
            stage_named(str(attributes.get(StepAttr.STAGE, "")), loops),
            int(number(attributes.get(StepAttr.GLOBAL_STEP))),
            number(attributes.get(StepAttr.WALL_MS)),
            number(attributes.get(StepAttr.COMPILE_MS)),
            dict(phases),
            loop=outermost_loop(loops),
        )
        rows.append(row)
    return rows


def _thunder_rows(summaries: list[EventRecord]) -> list[tuple[str, int, int]]:
    """Thunder's modules with their cache misses and hits, as each ``compile_summary`` says them."""
    said = (CompileAttr.THUNDER_MODULES, CompileAttr.THUNDER_CACHE_MISSES, CompileAttr.THUNDER_CACHE_HITS)
    columns = ([event.attributes.get(name, []) for name in said] for event in summaries)
    return [row for modules, misses, hits in columns for row in zip(modules, misses, hits, strict=False)]


def summary_json(run: TelemetryRun) -> dict[str, object]:
    """One run's summary for tools (``telemetry-jit summary --json``; the schema is in docs/telemetry.md)."""
    s = summarize(run)
    d, warm = s.digest, s.digest.warm_start
    return {
        "run_id": run.run_id,
        "rank": run.rank,
        "node": run.node,
        "status": s.status.as_json(),
        "out_of_step": [item.as_json() for item in out_of_step_said(run)],
        "loop": s.loop_name,
        "wall_s": round(s.wall_ms / 1000, 3),
        "application_s": round(s.application_ms / 1000, 3),
        "compile_s": round(d.compile_ms / 1000, 3),
        "compile_in_loop_s": round(s.compile_in_loop_ms / 1000, 3),
        "compile_share_of_loop": round(s.share, 4) if s.share is not None else None,
        "compile_outside_loop_s": {stage: round(ms / 1000, 3) for stage, ms in s.outside_ms.items()},
        "compilations": d.compilations,
        "frame_compiles": d.frame_compiles,
        "backward_graphs": d.backward_graphs,
        "backward_graphs_within_frame_compiles": None if d.backward_within_unknown else d.backward_within,
        "backward_graphs_loaded_within_frame_compiles": d.backward_loaded,
        "thunder_compiles": d.thunder_compiles,
        "recompilations": d.recompiles,
        "graph_break_count": d.break_count,
        "fell_back_to_eager": [
            {**fallback.as_json(), "steps_since": s.last_step - fallback.step if s.last_step is not None else None}
            for fallback in s.fallbacks
        ],
        "not_compiled": [
            {"module": found.module, "class": found.cls, "torch_version": found.torch_version, "fix": found.fix()}
            for found in s.not_compiled
        ],
        "compiled_before_run": s.compiled_before.as_json() if s.compiled_before is not None else None,
        "compiled_code_not_run": s.not_run,
        "failed_compilations": d.failed,
        "first_failed_compilation": (
            {"graph": d.first_failure_graph, "error": d.first_failure} if d.first_failure_graph else None
        ),
        "compile_cache": {
            "lookups": warm.lookups,
            "hits": warm.hits,
            "misses": warm.misses,
            "saved_s": round(warm.saved_s, 3),
        },
        "compile_resources": d.resources.as_json(),
        "warm_start": warm_start_json(run, d.residual, warm.hits, warm.misses, warm.saved_s, d.break_count),
        "loop_count": s.loop_count,
        "recompile_causes": [{**row.as_json(), "loops": s.loop_numbers(row.loops)} for row in s.causes],
        "graph_breaks": [{**group.as_json(), "loops": s.loop_numbers(group.loops)} for group in s.breaks],
        **({"graph_breaks_not_grouped": d.breaks_not_grouped} if d.breaks_not_grouped else {}),
        "first_steps": [{**step.as_json(), "loops": s.loop_numbers([step.loop])} for step in s.first_steps],
        "lacks": s.lacks,
        "payoff": {**s.payoff.attributes(), "sentence": s.payoff_sentence} if s.payoff is not None else None,
        "telemetry_health": run.health,
    }
