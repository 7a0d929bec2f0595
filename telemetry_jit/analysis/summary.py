"""What a run's compile telemetry amounts to (:func:`summarize`): typed results the text, JSON and HTML
renderers share."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from telemetry_jit.analysis.diagnose import Diagnosis, diagnose, frame_label, is_recompile
from telemetry_jit.analysis.reader import EventRecord, SpanRecord, TelemetryRun, number
from telemetry_jit.analysis.status import run_status
from telemetry_jit.diagnosis import short
from telemetry_jit.records import Payoff, why_slower
from telemetry_jit.schema import (
    CompileAttr,
    DdpAttr,
    GraphBreakAttr,
    JitEventName,
    JitSpanName,
    TrainAttr,
    TrainingSpanName,
)


class FrameRow(NamedTuple):
    """One compiled frame (or thunder module): how often and how long it compiled."""

    frame: str
    location: str
    compiles: int
    recompiles: int
    breaks: int
    ms: str


class BreakRow(NamedTuple):
    """One graph-break location and reason, with how often it broke."""

    location: str
    times: int
    reason: str


class ThunderRow(NamedTuple):
    """One thunder-compiled module's cache misses and hits over a loop."""

    module: str
    misses: int
    hits: int


class DdpRow(NamedTuple):
    """One compile that DDPOptimizer split at gradient-bucket boundaries."""

    frame: str
    location: str
    compile: str
    splits: int
    bucket_cap_mb: float


class WarmStart(NamedTuple):
    """What the FX graph and AOTAutograd caches did over a run (torch's counts on each compile span)."""

    hits: int
    misses: int
    saved_s: float  # torch's remote_cache_time_saved_s, summed
    missed_frames: list[str]  # frames that compiled a graph the caches did not have
    unavailable: list[str]  # cache counts this torch does not record
    bypasses: list[str]  # why torch could not use a cache ("fx_graph: <reason>"), distinct

    @property
    def line(self) -> str:
        looked_up = self.hits + self.misses
        kind = "warm start" if self.hits and not self.misses else "cold start" if not self.hits else "partly warm"
        text = f"{self.hits} of {looked_up} graphs from the compile cache ({kind}), {self.saved_s:.1f} s saved"
        if self.missed_frames:
            text += f"; missed: {', '.join(self.missed_frames[:5])}"
        return text


class ReasonRow(NamedTuple):
    times: int
    reason: str


FRAME_HEADERS = FrameRow._fields
BREAK_HEADERS = BreakRow._fields
THUNDER_HEADERS = ThunderRow._fields
DDP_HEADERS = ("frame", "location", "compile", "splits", "bucket cap MB")


@dataclass
class RunSummary:
    run: TelemetryRun
    loop_name: str
    wall_ms: float
    compiles: list[SpanRecord]
    compile_ms: float
    recompiles: list[SpanRecord]
    breaks: list[EventRecord]
    fallbacks: list[SpanRecord]
    limit_hits: int
    errors: list[SpanRecord]
    frame_rows: list[FrameRow] = field(default_factory=list)
    reasons: list[ReasonRow] = field(default_factory=list)  # the top recompile reasons
    break_rows: list[BreakRow] = field(default_factory=list)
    thunder_rows: list[ThunderRow] = field(default_factory=list)
    ddp_rows: list[DdpRow] = field(default_factory=list)
    warm_start: WarmStart = WarmStart(0, 0, 0.0, [], [], [])
    diagnosis: Diagnosis = field(default_factory=lambda: Diagnosis([], [], [], []))
    payoff: Payoff | None = None  # what compiling bought, where the run measured it

    @property
    def payoff_sentence(self) -> str:
        """The payoff in one line, with the likely reason when compiling loses: what runs inside timed
        training steps (breaks of frames compiled in training, recompiles there beyond the expected price)."""
        if self.payoff is None:
            return ""
        training = [span for span in self.compiles if span.attributes.get(TrainAttr.STAGE) == "train"]
        breaks = sum(1 for span in training for event in span.events if event.name == JitEventName.GRAPH_BREAK)
        recompiles = sum(
            is_recompile(span) and not span.attributes.get(CompileAttr.RECOMPILE_EXPECTED) for span in training
        )
        backends = {str(span.attributes.get(CompileAttr.BACKEND) or "") for span in self.compiles}
        return self.payoff.sentence(why_slower(breaks, recompiles, backends))

    @property
    def ddp_splits(self) -> int:
        return sum(row.splits for row in self.ddp_rows)

    @property
    def share(self) -> str:
        return f"{100 * self.compile_ms / self.wall_ms:.1f}%" if self.wall_ms else "n/a"


def _total_ms(spans: Sequence[SpanRecord]) -> float:
    return sum(span.duration_ms or 0.0 for span in spans)


def first_line(text: object) -> str:
    """The first line of ``text``: what a reason is known by when reasons are compared."""
    return str(text).strip().split("\n", 1)[0]


def summarize(run: TelemetryRun) -> RunSummary:
    compiles = sorted(run.find(JitSpanName.COMPILATION.value), key=lambda s: s.start_unix_ns)
    loops = (
        run.find(TrainingSpanName.TRAINING_LOOP)
        or run.find(TrainingSpanName.VALIDATION_LOOP)
        or run.find(TrainingSpanName.APPLICATION)
    )
    fallbacks = [s for s in compiles if s.attributes.get(CompileAttr.FELL_BACK_TO_EAGER)]
    measured = [e for loop in loops for e in loop.events if e.name == JitEventName.COMPILE_PAYOFF.value]
    summary = RunSummary(
        run=run,
        loop_name=loops[0].name if loops else "run",
        # a loop that never ended (the run was killed) counts to the last record the file holds
        wall_ms=sum(((span.end_unix_ns or run.last_unix_ns) - span.start_unix_ns) / 1e6 for span in loops),
        compiles=compiles,
        compile_ms=_total_ms(compiles),
        recompiles=[s for s in compiles if is_recompile(s)],
        breaks=[e for s in compiles for e in s.events if e.name == JitEventName.GRAPH_BREAK.value],
        fallbacks=fallbacks,
        limit_hits=sum(any(e.is_error for e in s.events) for s in fallbacks),
        errors=[s for s in compiles if s.attributes.get(CompileAttr.FAILED) and s not in fallbacks],
        payoff=Payoff.from_attributes(measured[-1].attributes) if measured else None,
    )
    per_frame: dict[tuple[str, str], list[SpanRecord]] = defaultdict(list)
    for span in compiles:
        key = (str(span.attributes.get(CompileAttr.FRAME) or "?"), str(span.attributes.get(CompileAttr.LOCATION) or ""))
        per_frame[key].append(span)
    summary.frame_rows = [
        FrameRow(
            frame,
            short(location),
            len(spans),
            sum(is_recompile(s) for s in spans),
            sum(int(number(s.attributes.get(CompileAttr.GRAPH_BREAKS))) for s in spans),
            f"{_total_ms(spans):.1f}",
        )
        for (frame, location), spans in sorted(per_frame.items(), key=lambda item: -_total_ms(item[1]))
    ]
    reasons = Counter(str(s.attributes.get(CompileAttr.RECOMPILE_REASON) or "unknown") for s in summary.recompiles)
    summary.reasons = [ReasonRow(count, reason) for reason, count in reasons.most_common(5)]
    where = Counter(
        (
            str(e.attributes.get(GraphBreakAttr.LOCATION) or "unknown location"),
            str(e.attributes.get(GraphBreakAttr.REASON)),
        )
        for e in summary.breaks
    )
    summary.break_rows = [BreakRow(short(loc), count, reason) for (loc, reason), count in where.most_common(10)]
    summary.ddp_rows = [
        DdpRow(
            str(span.attributes.get(CompileAttr.FRAME) or "?"),
            short(str(span.attributes.get(CompileAttr.LOCATION) or "")),
            str(span.attributes.get(CompileAttr.ID, "")),
            int(number(event.attributes.get(DdpAttr.SPLITS))),
            round(number(event.attributes.get(DdpAttr.BUCKET_CAP_BYTES)) / 2**20, 2),
        )
        for span in compiles
        for event in span.events
        if event.name == JitEventName.DDP_GRAPH_SPLIT.value
    ]
    summary.warm_start = _warm_start(compiles)
    summary.diagnosis = diagnose(run)
    loop_summaries = [
        e.attributes for loop in loops for e in loop.events if e.name == JitEventName.COMPILE_SUMMARY.value
    ]
    summary.thunder_rows = [
        ThunderRow(*row)
        for attributes in loop_summaries
        for row in zip(
            attributes.get(CompileAttr.THUNDER_MODULES, []),
            attributes.get(CompileAttr.THUNDER_CACHE_MISSES, []),
            attributes.get(CompileAttr.THUNDER_CACHE_HITS, []),
            strict=False,
        )
    ]
    return summary


def _warm_start(compiles: Sequence[SpanRecord]) -> WarmStart:
    hits = misses = 0
    saved = 0.0
    missed: dict[str, None] = {}
    unavailable: dict[str, None] = {}
    bypasses: dict[str, None] = {}
    for span in compiles:
        attributes = span.attributes
        bypasses.update(dict.fromkeys(str(reason) for reason in attributes.get(CompileAttr.CACHE_BYPASSES) or ()))
        for name, value in attributes.items():
            if not name.startswith(CompileAttr.cache("")):
                continue
            if name.endswith("_hits"):
                hits += int(number(value))
            elif name.endswith("_misses") and value:
                misses += int(number(value))
                missed[frame_label(span)] = None
            elif name == CompileAttr.cache("time_saved_s"):
                saved += number(value)
        for fact in attributes.get(CompileAttr.UNAVAILABLE) or ():
            if str(fact).startswith("cache."):
                unavailable[str(fact)] = None
    return WarmStart(hits, misses, saved, list(missed), list(unavailable), list(bypasses))


def summary_json(run: TelemetryRun) -> dict[str, object]:
    """One run's summary for tools (``telemetry-jit summary --json``; the schema is in docs/telemetry.md)."""
    s = summarize(run)
    return {
        "run_id": run.run_id,
        "rank": run.rank,
        "node": run.node,
        "status": run_status(run).as_json(),
        "loop": s.loop_name,
        "wall_s": round(s.wall_ms / 1000, 3),
        "compile_s": round(s.compile_ms / 1000, 3),
        "compilations": len(s.compiles),
        "recompilations": len(s.recompiles),
        "graph_break_count": len(s.breaks),
        "fell_back_to_eager": len(s.fallbacks),
        "failed_compilations": len(s.errors),
        "compile_cache": {"hits": s.warm_start.hits, "misses": s.warm_start.misses, "saved_s": s.warm_start.saved_s},
        **s.diagnosis.as_json(),
        "payoff": {**s.payoff.attributes(), "sentence": s.payoff_sentence} if s.payoff is not None else None,
    }
