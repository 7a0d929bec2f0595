"""A run's answers: for every recompile its cause, cost and fix; for every graph break whose code it is
in, the user's line that led there and torch's own guidance; how long the first step of each stage took.

Computed from the spans of one run (:func:`diagnose`), for the text summary, ``summary --json``, the
HTML report, ``diff`` and ``check`` alike. Files written before an attribute existed are diagnosed
with what they hold, and :attr:`Diagnosis.lacks` says what they could not tell.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.reader import EventRecord, SpanRecord, TelemetryRun, number
from telemetry_jit.diagnosis import (
    CAUSES,
    Classified,
    RecompileClassifier,
    break_fix,
    owner_of,
    parse_break,
    short,
    user_location,
)
from telemetry_jit.records import is_frame_recompile
from telemetry_jit.schema import CompileAttr, GraphBreakAttr, JitEventName, JitSpanName, StepAttr, TrainAttr


@dataclass
class CauseRow:
    """The recompiles of one cause in one run."""

    cause: str  # an id of telemetry_jit.diagnosis.CAUSES
    count: int = 0
    expected: int = 0  # of which the expected one-time price (a frame's first switch to a stage, ...)
    compile_ms: float = 0.0  # the recompiles and their backward graphs
    frames: list[str] = field(default_factory=list)  # "frame (file:line)", in order seen
    steps: list[int] = field(default_factory=list)  # global steps they happened at
    reasons: list[str] = field(default_factory=list)  # torch's reasons, normalized, distinct

    @property
    def title(self) -> str:
        return CAUSES[self.cause].title

    @property
    def fix(self) -> str:
        if self.cause == "stage_switch" and self.unexpected:
            return (
                "a frame recompiled on returning to a stage it had compiled for before, so something else changed "
                "as well: torch names only the first guard that failed (see this frame's other recompiles)"
            )
        return CAUSES[self.cause].fix

    @property
    def doc(self) -> str:
        return CAUSES[self.cause].doc

    @property
    def unexpected(self) -> int:
        return self.count - self.expected

    def as_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "count": self.count,
            "expected": self.expected,
            "compile_s": round(self.compile_ms / 1000, 3),
            "frames": self.frames,
            "first_step": self.steps[0] if self.steps else None,
            "steps": self.steps,
            "reasons": self.reasons,
            "fix": self.fix,
            "doc": self.doc,
        }


@dataclass
class BreakGroup:
    """The graph breaks one line of the user's code led to, of one type."""

    location: str  # the innermost line that broke, "file:line"
    user_location: str  # the user's line that led there ("" when the file cannot tell)
    owner: str  # whose code the innermost line is
    type: str
    explanation: str
    hints: list[str]
    doc_url: str
    fix: str
    count: int = 0
    counted_by_torch: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "user_location": self.user_location,
            "owner": self.owner,
            "type": self.type,
            "count": self.count,
            "counted_by_torch": self.counted_by_torch,
            "explanation": self.explanation,
            "hints": self.hints,
            "doc_url": self.doc_url,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class FirstStepRow:
    """The first step of a stage: its wall time, and how much of it was compiling."""

    stage: str
    global_step: int
    wall_ms: float
    compile_ms: float
    phases_s: dict[str, float]

    @property
    def other_ms(self) -> float:
        return max(self.wall_ms - self.compile_ms, 0.0)

    def as_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "global_step": self.global_step,
            "wall_s": round(self.wall_ms / 1000, 3),
            "compile_s": round(self.compile_ms / 1000, 3),
            "other_s": round(self.other_ms / 1000, 3),
            "compile_phases_s": {phase: round(seconds, 3) for phase, seconds in self.phases_s.items()},
        }


@dataclass
class Diagnosis:
    causes: list[CauseRow]  # every recompile in exactly one, costliest first
    breaks: list[BreakGroup]  # by the user's line and type, most first
    first_steps: list[FirstStepRow]
    lacks: list[str]  # what this file could not tell

    @property
    def recompiles(self) -> int:
        return sum(row.count for row in self.causes)

    def as_json(self) -> dict[str, Any]:
        return {
            "recompile_causes": [row.as_json() for row in self.causes],
            "graph_breaks": [group.as_json() for group in self.breaks],
            "first_steps": [step.as_json() for step in self.first_steps],
            "lacks": self.lacks,
        }


_LACKS_POSITIONS = (
    "no batch positions (written by an older telemetry-jit): a smaller last batch is counted as a changing dimension"
)
_LACKS_STACKS = (
    "no call stacks for graph breaks (written by an older telemetry-jit): a break in another package's code is not "
    "traced back to your line"
)


def diagnose(run: TelemetryRun) -> Diagnosis:
    compiles = sorted(run.find(JitSpanName.COMPILATION.value), key=lambda span: span.start_unix_ns)
    lacks = []
    if any(is_recompile(span) for span in compiles) and not any(
        TrainAttr.BATCH_INDEX in span.attributes or CompileAttr.RECOMPILE_CAUSE in span.attributes for span in compiles
    ):
        lacks.append(_LACKS_POSITIONS)
    breaks = [(span, event) for span in compiles for event in span.events if event.name == JitEventName.GRAPH_BREAK]
    if breaks and not any(GraphBreakAttr.OWNER in event.attributes for _, event in breaks):
        lacks.append(_LACKS_STACKS)
    return Diagnosis(_causes(compiles), _break_groups(breaks), _first_steps(run), lacks)


def is_recompile(span: SpanRecord) -> bool:
    """A frame compiled again (:func:`telemetry_jit.records.is_frame_recompile`)."""
    attributes = span.attributes
    return is_frame_recompile(bool(attributes.get(CompileAttr.IS_RECOMPILE)), str(attributes.get(CompileAttr.TRIGGER)))


def frame_label(span: SpanRecord) -> str:
    """``frame (file:line)`` of a compilation span, as tables and comparisons name it."""
    location = short(str(span.attributes.get(CompileAttr.LOCATION) or ""))
    return f"{span.attributes.get(CompileAttr.FRAME) or '?'} ({location})"


def _causes(compiles: list[SpanRecord]) -> list[CauseRow]:
    """Each recompile's cause (as recorded, else classified now, in the order compiles started)."""
    classifier = RecompileClassifier()
    by_id: dict[str, CauseRow] = {}
    rows: dict[tuple[str, bool], CauseRow] = {}  # a stage switch's expected price apart from the rest
    for span in compiles:
        attributes = span.attributes
        compile_id = str(attributes.get(CompileAttr.ID, ""))
        if attributes.get(CompileAttr.TRIGGER) == "lazy_backward":
            if compile_id in by_id and attributes.get(CompileAttr.IS_RECOMPILE):
                by_id[compile_id].compile_ms += span.duration_ms or 0.0
            continue
        classified = _classified(classifier, span)
        if classified is None:
            continue
        row = rows.setdefault((classified.cause, classified.expected), CauseRow(classified.cause))
        row.count += 1
        row.expected += classified.expected
        row.compile_ms += span.duration_ms or 0.0
        label = frame_label(span)
        if label not in row.frames:
            row.frames.append(label)
        step = int(number(attributes.get(TrainAttr.GLOBAL_STEP)))
        if step not in row.steps:
            row.steps.append(step)
        if classified.subject and classified.subject not in row.reasons and len(row.reasons) < 5:
            row.reasons.append(classified.subject)
        by_id[compile_id] = row
    return sorted(rows.values(), key=lambda row: (row.unexpected == 0, -row.compile_ms))


def _classified(classifier: RecompileClassifier, span: SpanRecord) -> Classified | None:
    attributes = span.attributes
    compile_id = str(attributes.get(CompileAttr.ID, ""))
    observed = classifier.observe(
        compile_id.rsplit("/", 1)[0],
        str(attributes.get(TrainAttr.STAGE) or ""),
        reason=str(attributes.get(CompileAttr.RECOMPILE_REASON) or ""),
        is_recompile=is_recompile(span),
        batch_index=_int_or_none(attributes.get(TrainAttr.BATCH_INDEX)),
        batches=_int_or_none(attributes.get(TrainAttr.BATCHES)),
        limit_hit=any(event.is_error and "recompile limit" in str(event.attributes) for event in span.events),
        step=_int_or_none(attributes.get(TrainAttr.GLOBAL_STEP)),
    )
    recorded = attributes.get(CompileAttr.RECOMPILE_CAUSE)
    if observed is None or recorded not in CAUSES:
        return observed
    return Classified(str(recorded), observed.subject, bool(attributes.get(CompileAttr.RECOMPILE_EXPECTED)))


def _int_or_none(value: object) -> int | None:
    figure = number(value, default=math.nan)
    return None if math.isnan(figure) else int(figure)


def _break_groups(breaks: list[tuple[SpanRecord, EventRecord]]) -> list[BreakGroup]:
    groups: dict[tuple[str, str, str], BreakGroup] = {}
    for _, event in breaks:
        attributes = event.attributes
        location = str(attributes.get(GraphBreakAttr.LOCATION) or "")
        reason = str(attributes.get(GraphBreakAttr.REASON_FULL) or attributes.get(GraphBreakAttr.REASON) or "")
        text = parse_break(reason)
        owner = str(attributes.get(GraphBreakAttr.OWNER) or owner_of(location))
        stack = attributes.get(GraphBreakAttr.STACK)
        user_line = str(attributes.get(GraphBreakAttr.USER_LOCATION) or "") or user_location(
            [*stack, location] if isinstance(stack, list) else [location]
        )
        kind = str(attributes.get(GraphBreakAttr.TYPE) or text.type)
        key = (user_line or location, kind, location)
        group = groups.get(key)
        if group is None:
            group = groups[key] = BreakGroup(
                location=location,
                user_location=user_line,
                owner=owner,
                type=kind,
                explanation=str(attributes.get(GraphBreakAttr.EXPLANATION) or text.explanation),
                hints=[str(hint) for hint in attributes.get(GraphBreakAttr.HINTS) or text.hints],
                doc_url=str(attributes.get(GraphBreakAttr.DOC_URL) or text.doc_url),
                fix=str(attributes.get(GraphBreakAttr.FIX) or break_fix(owner, text, user_line, location)),
            )
        group.count += 1
        group.counted_by_torch += bool(attributes.get(GraphBreakAttr.COUNTED_BY_TORCH, True))
    return sorted(groups.values(), key=lambda group: (group.owner != "user", -group.count))


def _first_steps(run: TelemetryRun) -> list[FirstStepRow]:
    steps = []
    for span in run.spans.values():
        for event in span.events:
            if event.name != JitEventName.FIRST_STEP:
                continue
            attributes = event.attributes
            prefix = StepAttr.phase_time("")[: -len("_s")]
            phases: dict[str, float] = defaultdict(float)
            for name, value in attributes.items():
                if name.startswith(prefix) and name.endswith("_s"):
                    phases[name[len(prefix) : -len("_s")]] += number(value)
            steps.append(
                (
                    event.time_unix_ns,
                    FirstStepRow(
                        str(attributes.get(StepAttr.STAGE, "")),
                        int(number(attributes.get(StepAttr.GLOBAL_STEP))),
                        number(attributes.get(StepAttr.WALL_MS)),
                        number(attributes.get(StepAttr.COMPILE_MS)),
                        dict(phases),
                    ),
                )
            )
    return [row for _, row in sorted(steps, key=lambda item: item[0])]
