"""What a telemetry file holds, once read (``analysis/reader.py`` reads it): runs, their spans and events, and how
each run ended: what every surface says first, and what ``check`` refuses to judge (docs/ci-gate.md)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from telemetry_jit.breaks import gist
from telemetry_jit.schema import (
    FILE_FORMAT,
    LOOP_SPAN_NAMES,
    CompileAttr,
    JitEventName,
    JitSpanName,
    TrainAttr,
    TrainingSpanName,
)

if TYPE_CHECKING:
    from telemetry_jit.analysis.digest import RunDigest


@dataclass
class EventRecord:
    name: str
    time_unix_ns: int
    attributes: dict[str, Any]
    is_error: bool = False


@dataclass
class SpanRecord:
    span_id: str
    name: str
    parent_id: str | None
    start_unix_ns: int
    end_unix_ns: int | None = None  # None: the span never ended (process killed or still running)
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)

    @property
    def duration_ms(self) -> float | None:
        return None if self.end_unix_ns is None else (self.end_unix_ns - self.start_unix_ns) / 1e6

    @property
    def compile_ms(self) -> float | None:
        """A compilation span's compile time: its ``compile.duration_ms`` (torch's own ``duration_us``, shorter than
        the span, whose ends are torch's window around the compile), else the span's length (a file from before)."""
        said = number(self.attributes.get(CompileAttr.DURATION_MS), default=-1.0)
        return said if said >= 0 else self.duration_ms


@dataclass
class FileDamage:
    """Lines of a file the reader could not read, skipped and counted: what is missing from the runs in it."""

    bad_lines: int = 0  # lines that are no record (not JSON, binary, too long, nested too deep)
    first_bad_line: int = 0
    first_reason: str = ""
    cut_short: bool = False  # the last line ends mid-record: the writer was killed, or its disk filled

    def __bool__(self) -> bool:
        return bool(self.bad_lines or self.cut_short)

    def words(self) -> str:
        parts = []
        if self.bad_lines:
            parts.append(
                f"{self.bad_lines} line(s) could not be read and were skipped (first: line {self.first_bad_line}, "
                f"{self.first_reason})"
            )
        if self.cut_short:
            parts.append("the last line is cut short (the writer was killed mid-record, or its disk filled)")
        return "; ".join(parts)


@dataclass
class TelemetryRun:
    """Everything one process wrote in one run."""

    run_id: str
    rank: int
    node: str = ""
    pid: int = 0
    world_size: int = 1  # ranks in its job, as its records say
    last_unix_ns: int = 0  # the latest time any of its records holds: where a run cut short is known to
    first_unix_ns: int = 0  # the earliest start its spans hold: when it began (0: none)
    spans: dict[str, SpanRecord] = field(default_factory=dict)
    lost_records: int = 0  # records the writer could not put in the file (disk full, say), by its count
    # what telemetry could not do, as the writer's last record says (None: it never wrote one: killed, or older)
    health: dict[str, Any] | None = None
    damage: FileDamage | None = None  # lines of its file that could not be read
    # why its file holds only part of it (its file was deleted or moved away mid-run, and created again); "" whole
    fragment: str = ""
    first_line: int = 0  # its first and last line in its file: runs whose lines interleave were written at once
    last_line: int = 0
    file_format: str = FILE_FORMAT  # or "nv-one-logger"
    lacks: list[str] = field(default_factory=list)  # what this file's format cannot tell
    # its compilations as aggregates, folded as they are read (with ``digest``, its compilation spans are not kept)
    digest: RunDigest | None = None
    # spans (ended) and events beyond what the reader keeps (reader.MAX_SPANS, MAX_EVENTS), by name: counted, not kept
    spans_not_kept: Counter[str] = field(default_factory=Counter)
    events_not_kept: Counter[str] = field(default_factory=Counter)
    # events of spans whose start is not in the file (it was deleted mid-run), until the span's end record
    _early_events: dict[str, list[EventRecord]] = field(default_factory=dict, repr=False)
    _pending: SpanRecord | None = field(default=None, repr=False)  # a compilation whose events may follow
    # events kept by name: how many, and the list holding the latest (replaced by a later one beyond MAX_EVENTS)
    _events_kept: dict[str, tuple[int, list[EventRecord]]] = field(default_factory=dict, repr=False)

    def find(self, name: str) -> list[SpanRecord]:
        return [span for span in self.spans.values() if span.name == name]

    def events(self, name: str, spans: Iterable[SpanRecord] | None = None) -> Iterator[EventRecord]:
        """Its events called ``name``, on whichever span (of ``spans``, where given)."""
        spans = self.spans.values() if spans is None else spans
        return (event for span in spans for event in span.events if event.name == name)

    # public: read_telemetry's users walk the tree (docs/telemetry.md, "parent links")
    @property
    def roots(self) -> list[SpanRecord]:
        return [span for span in self.spans.values() if span.parent_id not in self.spans]

    def parent(self, span: SpanRecord) -> SpanRecord | None:
        return self.spans.get(span.parent_id) if span.parent_id else None


def add_new(values: list[Any], value: object, limit: int) -> None:
    """Add ``value`` (not ``""`` or ``None``) to ``values`` once, while fewer than ``limit`` are kept."""
    if value not in ("", None) and value not in values and len(values) < limit:
        values.append(value)


def number(value: object, default: float = 0.0) -> float:
    """A figure read from a file: the number it holds, or ``default`` where the file holds something else
    (a string, ``null``, NaN or an infinity): a damaged or hand-edited file must not end the analysis."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) else default


State = Literal["finished", "failed", "interrupted", "killed", "incomplete", "empty"]
_INTERRUPTIONS = ("KeyboardInterrupt", "SIGTERM", "SignalException", "SystemExit")
_WORK = frozenset(LOOP_SPAN_NAMES) - {TrainingSpanName.APPLICATION}  # the loops that train or evaluate


@dataclass(frozen=True)
class RunStatus:
    """How a run ended: ``finished``, ``failed`` (it raised), ``interrupted`` (Ctrl-C, SIGTERM), ``killed`` (loops
    never ended, file never closed), ``incomplete`` (records missing) or ``empty`` (it trained nothing)."""

    state: State
    detail: str  # what happened, in words

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def headline(self) -> str:
        """The first line every surface shows for a run that did not finish (``""`` for one that did)."""
        if self.finished:
            return ""
        if self.state == "empty":
            return f"this run TRAINED NOTHING: {self.detail}; there are no figures to judge"
        return f"this run {self.state.upper()}: {self.detail}; the figures below cover what was recorded before"

    def as_json(self) -> dict[str, Any]:
        return {"state": self.state, "detail": self.detail}


def run_status(run: TelemetryRun) -> RunStatus:
    """How ``run`` ended, from what its file holds."""
    loops = sorted((span for span in run.spans.values() if span.name in LOOP_SPAN_NAMES), key=lambda s: s.start_unix_ns)
    for span in loops:
        errors = [event for event in span.events if event.is_error]
        if errors:
            message = str(errors[0].attributes.get("error_message") or errors[0].name)
            state: State = "interrupted" if message.startswith(_INTERRUPTIONS) else "failed"
            return RunStatus(state, f"{gist(message)} (in its {span.name})")
    if run.fragment:
        return RunStatus("incomplete", f"this file holds part of the run: {run.fragment}")
    unended = sorted({span.name for span in loops if span.end_unix_ns is None})
    if unended and run.health is None and run.file_format != "nv-one-logger":
        return RunStatus(
            "killed",
            f"its {', '.join(unended)} never ended and its file has no closing record (the process was killed, its "
            "disk filled, or it still runs)",
        )
    if unended:
        return RunStatus("incomplete", f"telemetry closed without ending its {', '.join(unended)}")
    if run.damage:
        return RunStatus("incomplete", run.damage.words())
    if run.lost_records:
        return RunStatus("incomplete", f"{run.lost_records} record(s) could not be written to its file")
    # empty where the run ran no loop: a fit said it trained nothing (and no training loop followed), or no loop and
    # no compilation is in the file at all (no fit ran)
    names = {span.name for span in run.spans.values()}
    said = list(run.events(JitEventName.TRAINED_NOTHING, run.find(TrainingSpanName.APPLICATION)))
    if said and TrainingSpanName.TRAINING_LOOP not in names:
        return RunStatus("empty", f"fit ran no training step ({said[-1].attributes.get('reason', 'no reason given')})")
    compiled = bool(run.digest and run.digest.compilations) or JitSpanName.COMPILATION in names
    # a loop with no loop spans of its own (a plain loop's, Fabric's) counts its batches in its summaries
    ran = any(number(e.attributes.get(TrainAttr.BATCHES_RUN)) for e in run.events(JitEventName.COMPILE_SUMMARY))
    if names.isdisjoint(_WORK) and not compiled and not ran:
        return RunStatus(
            "empty",
            "it recorded no training, validation or test loop and no compilation (no fit ran, or it stopped before "
            "its first step: an empty dataset, max_steps=0, limit_train_batches=0, max_epochs=0)",
        )
    return RunStatus("finished", "")
