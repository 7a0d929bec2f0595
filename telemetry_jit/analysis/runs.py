"""What a telemetry file holds, once read (``analysis/reader.py`` reads it): runs, their spans and events, and how
each run ended: what every surface says first, and what ``check`` refuses to judge (docs/ci-gate.md)."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from telemetry_jit.breaks import gist
from telemetry_jit.identity import short_run_id
from telemetry_jit.schema import (
    FILE_FORMAT,
    LOOP_SPAN_NAMES,
    NUMBERED_SINCE,
    RECORD_LOSING_SITES,
    CompileAttr,
    JitEventName,
    JitSpanName,
    RecordKey,
    StopAttr,
    TrainAttr,
    TrainingSpanName,
)
from telemetry_jit.terminal import counted

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


MAX_RANGES = 10_000  # runs of consecutive numbers kept per writer; a file cut into more is said to be, not listed


@dataclass
class WriterTally:
    """One writer's numbered records as read (format 2 on): which numbers, of which kinds, and its closing counts.
    Bounded: the numbers as ranges of consecutive ones (a whole file is one range)."""

    writer: str
    ranges: list[list[int]] = field(default_factory=list)  # sorted, disjoint [first, last] of the numbers read
    kinds: Counter[str] = field(default_factory=Counter)  # records read, by kind (run_end's own included)
    repeated: int = 0  # numbers read more than once: lines copied in twice
    scattered: bool = False  # more than MAX_RANGES ranges: numbers no longer kept
    has_start: bool = False  # its number 0, a run_start, was read
    end: dict[str, Any] | None = None  # its run_end's counts (None: never read: killed, still running, cut off)
    end_seq: int = -1
    iterations: int = 0  # per-iteration span records (read without being parsed): batches ran

    def add(self, seq: int, kind: str) -> None:
        """One record read: its number and kind."""
        self.kinds[kind] += 1
        if seq == 0 and kind == "run_start":
            self.has_start = True
        ranges = self.ranges
        if ranges and ranges[-1][1] + 1 == seq:  # the usual case: the next number
            ranges[-1][1] = seq
            return
        at = bisect.bisect_right(ranges, [seq, math.inf])  # the ranges starting at or before seq end here
        if at and ranges[at - 1][1] >= seq:
            self.repeated += 1
            return
        if self.scattered:
            return
        joins_before = at > 0 and ranges[at - 1][1] + 1 == seq
        joins_after = at < len(ranges) and ranges[at][0] - 1 == seq
        if joins_before and joins_after:
            ranges[at - 1][1] = ranges.pop(at)[1]
        elif joins_before:
            ranges[at - 1][1] = seq
        elif joins_after:
            ranges[at][0] = seq
        elif len(ranges) >= MAX_RANGES:
            self.scattered = True
        else:
            ranges.insert(at, [seq, seq])

    def closed(self, record: dict[str, Any], seq: int) -> None:
        """Its run_end was read: the counts it closed with."""
        self.end, self.end_seq = record, seq

    def missing(self) -> list[str]:
        """What of this writer's records the file does not hold, each in words (``[]``: none missing)."""
        if self.scattered:
            return [f"records of writer {self.writer} in more than {MAX_RANGES} pieces (the file was spliced)"]
        parts = []
        first = self.ranges[0][0] if self.ranges else 0
        if first > 0 or not self.has_start:
            parts.append(
                f"the head ({_numbers(0, first - 1)}: its run_start among them; the file was cut in place, as "
                "logrotate's copytruncate does, or its first lines were removed)"
                if first > 0
                else "the head (its run_start)"
            )
        parts += [_numbers(a[1] + 1, b[0] - 1) for a, b in zip(self.ranges, self.ranges[1:], strict=False)]
        written = (self.end or {}).get(RecordKey.WRITTEN)
        if isinstance(written, dict):
            short = [
                counted(int(number(n)) - self.kinds[kind], f"{kind} record")
                for kind, n in sorted(written.items())
                if int(number(n)) > self.kinds[kind]
            ]
            if short:
                parts.append(f"by kind, {', '.join(short)}")
        return parts

    def foreign(self) -> list[str]:
        """Records this writer cannot have written where they are: the file was spliced."""
        parts = []
        last = self.ranges[-1][1] if self.ranges else -1
        if self.end is not None and last > self.end_seq:
            parts.append(f"{counted(last - self.end_seq, 'record')} numbered after its run_end")
        if self.repeated:
            parts.append(f"{counted(self.repeated, 'record')} read twice")
        return parts


def _numbers(first: int, last: int) -> str:
    return f"record {first}" if first == last else f"records {first} to {last}"


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
    # its writers' numbered records (format 2 on: what proves it whole), by writer id; none in an older file
    writers: dict[str, WriterTally] = field(default_factory=dict)
    unnumbered: int = 0  # its records without a number, where others have one: lines put in from elsewhere
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
    missing: tuple[str, ...] = ()  # what of the run the file does not hold, each named (records n to m, ...)
    # why the file cannot prove the run whole: written before records were numbered ("" where it can, or not whole)
    unproven: str = ""
    stopped_early: str = ""  # what ended a loop before its length (max_time, should_stop, ...); "" where none did

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    @property
    def whole(self) -> bool | None:
        """Whether the file proves the run whole: ``None`` for a file written before records were numbered."""
        return None if self.unproven else self.finished

    def headline(self) -> str:
        """The first line every surface shows for a run that did not finish (``""`` for one that did)."""
        if self.finished:
            return ""
        if self.state == "empty":
            return f"this run TRAINED NOTHING: {self.detail}; there are no figures to judge"
        return f"this run {self.state.upper()}: {self.detail}; the figures below cover what was recorded before"

    def notes(self) -> list[str]:
        """What a finished run's reader should know: it stopped early, its file cannot prove it whole."""
        notes = [f"this run STOPPED EARLY: {self.stopped_early}"] if self.stopped_early else []
        return notes + ([f"this run {self.unproven}"] if self.unproven and self.finished else [])

    def as_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "detail": self.detail,
            "whole": self.whole,
            "missing": list(self.missing),
            "unproven": self.unproven,
            "stopped_early": self.stopped_early,
        }


UNPROVEN = (
    f"cannot be proven whole (recorded before telemetry-jit file format {NUMBERED_SINCE}: its records carry no "
    "numbers, and no closing count)"
)


def missing_parts(run: TelemetryRun) -> list[str]:
    """What of ``run`` its file does not hold, each named: numbered records missing (the head, records n to m, by
    kind), records its writer failed to export (the closing health record counts them), compile spans its
    ``compile_summary`` counts and the file lacks."""
    parts = []
    for tally in run.writers.values():
        parts += tally.missing()
    failed_calls = (run.health or {}).get("failed_calls")
    lost_exports = 0
    for site, what in RECORD_LOSING_SITES.items():
        failed = failed_calls.get(site) if isinstance(failed_calls, dict) else None
        count = int(number(failed.get("count"))) if isinstance(failed, dict) else 0
        if count:
            parts.append(f"{counted(count, what)} that failed to export (its health record counts them, at {site})")
            lost_exports += count if what == "compile span" else 0
    held = (run.digest.compilations if run.digest else len(run.find(JitSpanName.COMPILATION))) + run.spans_not_kept[
        JitSpanName.COMPILATION
    ]
    said = max(
        (int(number(e.attributes.get(CompileAttr.COUNT))) for e in run.events(JitEventName.COMPILE_SUMMARY)), default=0
    )
    if said - held > lost_exports:
        parts.append(
            f"{counted(said - held - lost_exports, 'compile span')} (its compile_summary counts {said} compiles, "
            f"the file holds {held})"
        )
    return parts


def spliced_parts(run: TelemetryRun) -> list[str]:
    """Records in ``run``'s file that its writers cannot have put there: the file was spliced."""
    parts = [part for tally in run.writers.values() for part in tally.foreign()]
    if run.writers and run.unnumbered:
        parts.append(f"{counted(run.unnumbered, 'record')} without a number among numbered ones")
    return parts


def missing_ranks(runs: Sequence[TelemetryRun]) -> list[str]:
    """The ranks of each job in ``runs`` that are not among them, as their records' world size counts ranks."""
    missing = []
    jobs: dict[str, list[TelemetryRun]] = {}
    for run in runs:
        jobs.setdefault(run.run_id, []).append(run)
    for run_id, ranks in jobs.items():
        size = max(run.world_size for run in ranks)
        absent = sorted(set(range(size)) - {run.rank for run in ranks})
        if absent:
            listed = ", ".join(map(str, absent[:8])) + (f" and {len(absent) - 8} more" if len(absent) > 8 else "")
            missing.append(
                f"run {short_run_id(run_id)}: rank{'s' if len(absent) > 1 else ''} {listed} of {size} (its records say "
                f"world_size {size}; pass every rank's file, or the folder)"
            )
    return missing


def run_status(run: TelemetryRun) -> RunStatus:
    """How ``run`` ended, from what its file holds; a run whose records are numbered (format 2 on) is finished
    only where they prove it whole: its run_start, every number up to its run_end, the counts run_end gives."""
    loops = sorted((span for span in run.spans.values() if span.name in LOOP_SPAN_NAMES), key=lambda s: s.start_unix_ns)
    for span in loops:
        errors = [event for event in span.events if event.is_error]
        if errors:
            message = str(errors[0].attributes.get("error_message") or errors[0].name)
            state: State = "interrupted" if message.startswith(_INTERRUPTIONS) else "failed"
            return RunStatus(state, f"{gist(message)} (in its {span.name})")
    if run.fragment:
        return RunStatus("incomplete", f"this file holds part of the run: {run.fragment}")
    numbered = bool(run.writers)
    unended = sorted({span.name for span in loops if span.end_unix_ns is None})
    if unended and run.health is None and run.file_format != "nv-one-logger":
        return RunStatus(
            "killed",
            f"its {', '.join(unended)} never ended and its file has no closing record (the process was killed, its "
            "disk filled, or it still runs)",
        )
    spliced = spliced_parts(run)
    if spliced:
        return RunStatus("incomplete", f"its file was spliced: {'; '.join(spliced)}", tuple(spliced))
    missing = tuple(missing_parts(run))
    unclosed = [tally.writer for tally in run.writers.values() if tally.end is None]
    if unclosed and not (missing and missing[0].startswith("the head")):
        return RunStatus(
            "killed",
            "its file has no closing record (run_end): the process was killed after its loops ended (while telemetry "
            "closed, in on_app_end, say), its disk filled, or it still runs",
            ("the closing run_end record", *missing),
        )
    if unended:
        return RunStatus("incomplete", f"telemetry closed without ending its {', '.join(unended)}")
    if run.damage:
        return RunStatus("incomplete", run.damage.words())
    if run.lost_records:
        return RunStatus("incomplete", f"{run.lost_records} record(s) could not be written to its file")
    if missing:
        return RunStatus("incomplete", f"records of it are missing: {'; '.join(missing)}", missing)
    unproven = "" if numbered else UNPROVEN
    stopped = stopped_early(run)
    # empty where the run ran no loop: a fit said it trained nothing (and no training loop followed), or no loop and
    # no compilation is in the file at all (no fit ran)
    names = {span.name for span in run.spans.values()}
    said = list(run.events(JitEventName.TRAINED_NOTHING, run.find(TrainingSpanName.APPLICATION)))
    if said and TrainingSpanName.TRAINING_LOOP not in names:
        return RunStatus("empty", f"fit ran no training step ({said[-1].attributes.get('reason', 'no reason given')})")
    compiled = bool(run.digest and run.digest.compilations) or JitSpanName.COMPILATION in names
    if names.isdisjoint(_WORK) and not compiled and not ran_batches(run):
        return RunStatus(
            "empty",
            "it recorded no training, validation or test loop and no compilation (no fit ran, or it stopped before "
            "its first step: an empty dataset, max_steps=0, limit_train_batches=0, max_epochs=0)",
        )
    return RunStatus("finished", "", unproven=unproven, stopped_early=stopped)


def stopped_early(run: TelemetryRun) -> str:
    """What ended the run's loops before their length (``stopped_early`` events), in words; ``""`` where none."""
    said = []
    for event in run.events(JitEventName.STOPPED_EARLY):
        words = str(event.attributes.get(StopAttr.DETAIL) or event.attributes.get(StopAttr.REASON) or "stopped early")
        if words not in said:
            said.append(words)
    return "; ".join(said)


def ran_batches(run: TelemetryRun) -> bool:
    """Whether the run says it ran a batch, by whichever loop: an iteration span of any framework, counted or kept,
    or a ``compile_summary`` that counts batches run or stands at a step past 0 (a plain loop, Fabric)."""
    if any(tally.iterations for tally in run.writers.values()):
        return True
    return any(
        number(e.attributes.get(TrainAttr.BATCHES_RUN)) or number(e.attributes.get(TrainAttr.GLOBAL_STEP)) > 0
        for e in run.events(JitEventName.COMPILE_SUMMARY)
    )
