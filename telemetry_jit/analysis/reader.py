"""Load a telemetry file back into spans with their events and parent links: telemetry-jit's own format, or
nv-one-logger's ``FileExporter`` (no parent links, no run id, millisecond timestamps: parents are inferred from
time, and :attr:`TelemetryRun.lacks` says what the file could not tell). What the commands read (:func:`load`):
files and folders (their ``*.jsonl``), and which run of each to show: the last started (never an older one that
looks better), with a note on how to pick another."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from telemetry_jit.analysis.digest import RunDigest
from telemetry_jit.analysis.runs import (
    EventRecord,
    FileDamage,
    SpanRecord,
    TelemetryRun,
    WriterTally,
    missing_ranks,
)
from telemetry_jit.identity import short_run_id
from telemetry_jit.notices import say
from telemetry_jit.schema import FILE_FORMAT_VERSION, RANK_FILE, JitSpanName, RecordKey, TrainingSpanName


class TelemetryFileError(ValueError):
    """The file is not a readable telemetry-jit file."""


def read_telemetry(
    path: str | os.PathLike[str],
    skip_spans: Collection[str] = (),
    digest: bool = False,
    *,
    max_runs: int | None = None,
    run_id: str | None = None,
    max_rows: int | None = None,
) -> RunsRead:
    """Every run in ``path`` (``"-"``: standard input), in file order, read in bounded memory: compilations are
    folded into :attr:`TelemetryRun.digest` as read (with ``digest``, not kept as spans); the first
    :data:`MAX_SPANS` spans and :data:`MAX_EVENTS` events of each name are kept, the rest counted. A line that is
    no record is skipped and counted (:attr:`TelemetryRun.damage`, one warning per file). ``skip_spans``: span
    names not to keep (:data:`ITERATION_SPANS`, exported by the million), recognised without being parsed.
    ``max_runs`` (default :data:`MAX_RUNS`): runs held at once; beyond it the least recently written are let go,
    counted in :attr:`RunsRead.left_out` (never the last started, nor the last started whose id starts with
    ``run_id``). ``max_rows`` (default :data:`~telemetry_jit.analysis.digest.MAX_ROWS`): frames and graph-break
    places each run's digest gives a row of their own, the rest counted in one.

    Raises:
        FileNotFoundError: no such file.
        TelemetryFileError: the file is empty or is not a telemetry-jit file.
    """
    left_out = RunsLeftOut(MAX_RUNS if max_runs is None else max_runs, run_id, max_rows)
    if str(path) == "-":
        return _read(Path("<stdin>"), sys.stdin.buffer, skip_spans, digest, left_out)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No telemetry file at {str(path)!r}.")
    with path.open("rb") as handle:
        return _read(path, handle, skip_spans, digest, left_out)


MAX_LINE_BYTES = 64 * 2**20  # one record; a compile span is a few KB, the longest torch text a few hundred KB
MAX_SPANS = 25_000  # spans kept per run (loops, checkpoints, ...): a fit has a handful, a long run one per epoch
MAX_EVENTS = 1_000  # events kept per run of each name (the first ones, the last of them the latest said)
MAX_EVENT_NAMES = 100  # names of events kept, and names spans and events are counted by (the rest as one)
MAX_RUNS = 1000  # runs of one file held at once (a file every job appends to holds thousands): the rest counted
RunKey = tuple[str, int, int]  # run id, rank and pid: one process of one run
Runs = dict[RunKey, TelemetryRun]
Writers = dict[str, WriterTally]  # a file's writers, by id: their numbered records (what proves a run whole)
# the writer's stamp closes every record: its number and id come first in it (exporters/file.py writes them so)
_STAMP = re.compile(
    rb',"' + RecordKey.SEQ.encode() + rb'":(\d{1,18}),"' + RecordKey.WRITER.encode() + rb'":"([0-9a-f]{1,32})"'
)
_KIND = re.compile(rb'\{"kind":"([a-z_]{1,32})"')


@dataclass
class RunsLeftOut:
    """The runs of a file let go while it was read (beyond ``max_runs`` held at once, the least recently written
    first): counted, with their records read after (a run let go is never read again as a new one)."""

    max_runs: int = MAX_RUNS
    run_id: str | None = None  # the last started run whose id starts with it is never let go
    max_rows: int | None = None  # the rows each run's digest keeps (RunDigest.max_rows), None: its default
    runs: int = 0
    records: int = 0  # records of runs let go, met after they were
    written_at_once: int = 0  # of the runs let go, those whose lines interleave with another run's
    _chosen: RunKey | None = None
    # the latest 10 x max_runs let go, to know them again (ordered: the oldest dropped in O(1), as a dict cannot)
    _gone: OrderedDict[RunKey, None] = field(default_factory=OrderedDict)
    _gone_writers: OrderedDict[str, None] = field(default_factory=OrderedDict)  # their writers, as many at most

    def new_run(self, runs: Runs, key: RunKey, writers: Writers) -> bool:
        """Whether a run first met now is to be read: not one let go; room made for it by letting others go (their
        writers' tallies with them)."""
        if key in self._gone:
            self.records += 1
            return False
        if len(runs) >= self.max_runs:
            self._let_go(runs, writers)
        if self.run_id is not None and key[0].startswith(self.run_id):
            self._chosen = key
        return True

    def writer_gone(self, writer: str) -> bool:
        """Whether ``writer``'s run was let go (its record, met now, is counted)."""
        gone = writer in self._gone_writers
        self.records += gone
        return gone

    def _let_go(self, runs: Runs, writers: Writers) -> None:
        # half at a time, so that the sort is paid once per max_runs / 2 new runs
        last = next(reversed(runs))
        held = [key for key in runs if key != last and key != self._chosen]
        held.sort(key=lambda key: runs[key].last_line)
        together = {id(run) for run in written_at_once(list(runs.values()))}
        for key in held[: max(1, self.max_runs // 2)]:
            self.written_at_once += id(runs[key]) in together
            for writer in runs.pop(key).writers:
                writers.pop(writer, None)
                self._gone_writers[writer] = None
            self._gone[key] = None
            self.runs += 1
        for gone in (self._gone, self._gone_writers):
            while len(gone) > 10 * self.max_runs:
                gone.popitem(last=False)


class RunsRead(list[TelemetryRun]):
    """The runs of a file :func:`read_telemetry` kept, in file order, and those it let go (:attr:`left_out`)."""

    def __init__(self, runs: Iterable[TelemetryRun] = (), left_out: RunsLeftOut | None = None) -> None:
        super().__init__(runs)
        self.left_out = left_out if left_out is not None else RunsLeftOut()  # each its own: it is counted into

    @property
    def total(self) -> int:
        """Every run the file holds, those let go included."""
        return len(self) + self.left_out.runs


def _read(path: Path, handle: BinaryIO, skip_spans: Collection[str], digest: bool, left_out: RunsLeftOut) -> RunsRead:
    runs: Runs = {}
    writers: Writers = {}
    # one scan of a line for every name skipped (a scan each was a tenth of reading a file of long records)
    names = b"|".join(re.escape(str(name).encode()) for name in skip_spans)
    skipped = re.compile(b'"name":"(?:' + names + b')"').search if skip_spans else None
    damage = FileDamage()
    line = 0
    readline = handle.readline
    # the hot loop: a line's cost beyond json.loads is kept to a few C-level tests (docs/benchmarks.md, "Reading")
    while raw := readline(MAX_LINE_BYTES):
        line += 1
        if len(raw) == MAX_LINE_BYTES and raw[-1] != 10:  # too long (no "\n"): read no further, its bytes dropped
            while (rest := readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            raw = b"\x00too long"  # the marker _parse says is too long
        if skipped is not None and skipped(raw):
            _tally_skipped(raw, writers, left_out)
            continue
        record = _parse(path, raw, line, damage, runs_so_far=bool(runs))
        if record is None:
            continue
        try:
            _read_record(path, line, record, runs, skip_spans, digest, writers, left_out)
        except OverflowError:  # a number no integer holds ("rank": 1e400): a bad line, counted
            _count_bad(damage, line, "a number out of range")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, TelemetryFileError):
                raise
            kind = record.get("kind", record.get("type"))
            raise TelemetryFileError(f"{str(path)!r} line {line}: malformed {kind!r} record ({error!r}).") from None
    if line == 0:
        raise TelemetryFileError(f"{str(path)!r} is empty: the run wrote no telemetry.")
    if not runs:
        raise TelemetryFileError(f"{str(path)!r} holds no complete telemetry record.")
    if damage:
        say(f"{path}: {damage.words()}.")
    for run in runs.values():
        _fold_pending(run)
        run._early_events.clear()
        run.damage = damage if damage else None
        if run.file_format == "nv-one-logger":
            _infer_parents(run)
        digest_of(run)
    return RunsRead(runs.values(), left_out)


ITERATION_SPANS = (
    TrainingSpanName.TRAINING_ITERATION,
    TrainingSpanName.VALIDATION_ITERATION,
    "testing_single_iteration",
)


def _parse(path: Path, raw: bytes, number: int, damage: FileDamage, runs_so_far: bool) -> dict[str, Any] | None:
    """One line's record; ``None`` for a line that is not one (counted in ``damage``)."""
    try:  # the common case first: a record, UTF-8 (no NUL where json.loads would guess UTF-16 or 32)
        record = json.loads(raw)
        if type(record) is dict and b"\x00" not in raw[:4]:
            # strict JSON in UTF-8 holds no control byte unescaped: this is what _CONTROL_BYTES would have passed
            return _valid_text(record) if b"\\u" in raw and _ESCAPED_SURROGATE.search(raw) else record
    except (ValueError, RecursionError, MemoryError):
        pass  # said below
    if raw.isspace():
        return None
    reason = ""
    record = None
    if raw.startswith(b"\x00too long"):
        reason = f"longer than {MAX_LINE_BYTES // 2**20} MiB"
    elif _CONTROL_BYTES.search(raw):  # JSON text holds none of them unescaped
        reason = "binary data"
    else:
        try:
            record = json.loads(raw)
            if _ESCAPED_SURROGATE.search(raw):
                record = _valid_text(record)
        except UnicodeDecodeError:
            reason = "binary data"
        except ValueError:
            reason = "not valid JSON"
        except RecursionError:
            reason = "nested too deep to be a record"
        except MemoryError:
            reason = "too large to read"
    if not reason and isinstance(record, dict):
        return record
    reason = reason or "not a record (a JSON object)"
    if not raw.endswith(b"\n") and reason == "not valid JSON":
        damage.cut_short = True  # the last line, ending mid-record
        return None
    if not runs_so_far:
        raise TelemetryFileError(f"{str(path)!r} is not a telemetry-jit JSON Lines file (line {number}: {reason}).")
    _count_bad(damage, number, reason)
    return None


def _tally_skipped(raw: bytes, writers: Writers, left_out: RunsLeftOut) -> None:
    """Count a record read without being parsed (a per-iteration span) in its writer's numbers: the last stamp of
    the line is its writer's (a string in the record holds no unescaped quote, so it cannot fake one)."""
    at = raw.rfind(b',"' + RecordKey.SEQ.encode() + b'":')
    stamp = _STAMP.match(raw, at) if at >= 0 else None
    kind = _KIND.match(raw)
    if stamp is None or kind is None:
        return
    writer = stamp.group(2).decode()
    if writer not in writers and left_out.writer_gone(writer):
        return
    tally = writers.setdefault(writer, WriterTally(writer))
    tally.add(int(stamp.group(1)), kind.group(1).decode())
    tally.iterations += 1


def _count_bad(damage: FileDamage, number: int, reason: str) -> None:
    damage.bad_lines += 1
    if damage.bad_lines == 1:
        damage.first_bad_line, damage.first_reason = number, reason


def _read_record(
    path: Path,
    number: int,
    record: dict[str, Any],
    runs: Runs,
    skip_spans: Collection[str],
    digest: bool,
    writers: Writers,
    left_out: RunsLeftOut,
) -> None:
    if "kind" in record and "run" in record:
        # one process of one run: a file appended to by the same job twice holds two
        key = (str(record["run"]), int(record.get("rank", 0)), int(record.get("pid", 0)))
        run = runs.get(key)
        if run is None:
            if not left_out.new_run(runs, key, writers):
                return
            run = runs[key] = TelemetryRun(key[0], key[1], str(record.get("node", "")), key[2], first_line=number)
            if left_out.max_rows is not None:
                run.digest = RunDigest(max_rows=left_out.max_rows)
        run.last_line = number
        if isinstance(world_size := record.get("world_size"), int):
            run.world_size = max(run.world_size, world_size)
        if record["kind"] == "run_start" and int(record.get("format_version", 1)) > FILE_FORMAT_VERSION:
            raise TelemetryFileError(
                f"{str(path)!r} was written in telemetry-jit file format {record['format_version']}, newer than this "
                f"telemetry-jit reads ({FILE_FORMAT_VERSION}): upgrade telemetry-jit to read it."
            )
        _number(run, record, writers)
        if record.get("name") in skip_spans:
            return
        _apply(run, record, digest)
    elif record.get("type") in _NV_ONE_LOGGER_TYPES:
        key = (f"nv-one-logger-{record.get('pid', 0)}", 0, 0)
        if key not in runs:
            runs[key] = TelemetryRun(run_id=key[0], rank=0, file_format="nv-one-logger", lacks=list(_NV_LACKS))
        _apply_nv_one_logger(runs[key], record)
    else:
        raise TelemetryFileError(
            f"{str(path)!r} is not a telemetry file: line {number} is neither a telemetry-jit record "
            "('kind'/'run') nor an nv-one-logger FileExporter record ('type')."
        )


def _number(run: TelemetryRun, record: dict[str, Any], writers: Writers) -> None:
    """Count ``record`` in its writer's numbers, where it carries one (format 2 on)."""
    writer, seq = record.get(RecordKey.WRITER), record.get(RecordKey.SEQ)
    if not isinstance(writer, str) or isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        run.unnumbered += 1
        return
    tally = run.writers.get(writer)
    if tally is None:
        tally = run.writers[writer] = writers.setdefault(writer, WriterTally(writer))
    kind = str(record["kind"])
    tally.add(seq, kind)
    tally.iterations += kind == "span" and record.get("name") in ITERATION_SPANS
    if kind == "run_end":
        tally.closed(record, seq)


# JSON may escape a lone surrogate (torch text from a file name that is not UTF-8, say); decoded, it is
# a str no stream, HTML page or JSON file can encode
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_valid_text(item) for item in value]
    if isinstance(value, dict):
        return {_valid_text(key): _valid_text(item) for key, item in value.items()}
    return value


_RECORD_KEYS = frozenset(
    ("kind", "run", "rank", "local_rank", "world_size", "node", "pid", RecordKey.WRITER, RecordKey.SEQ)
)
_NV_ONE_LOGGER_TYPES = frozenset(("start", "stop", "complete", "event", "application_error", "telemetry_data_error"))
_NV_LACKS = (
    "no parent links: each span is put under the innermost span whose time contains it",
    "millisecond timestamps only",
    "no run id or rank: nv-one-logger's FileExporter holds one run per file",
)


def _ms(event: dict[str, Any]) -> int:
    return int(event["attributes"]["timestamp_msec"]) * 1_000_000


def _apply_nv_one_logger(run: TelemetryRun, record: dict[str, Any]) -> None:
    kind = record["type"]
    if kind in ("start", "complete", "stop"):
        span = run.spans.get(record["id"])
        if span is None:
            start = _ms(record["start_event"] if "start_event" in record else record["stop_event"])
            span = SpanRecord(record["id"], record["name"], None, start, events=run._early_events.pop(record["id"], []))
            _keep(run, span, ended=kind != "start")
        span.attributes.update(record.get("attributes") or {})
        if kind != "start":
            span.end_unix_ns = _ms(record["stop_event"])
    elif kind in ("event", "application_error"):
        event = record["event"]
        said = EventRecord(event["name"], _ms(event), event.get("attributes", {}), kind == "application_error")
        _attach(run, record["span_id"], said)


def _interned(value: Any) -> Any:
    return sys.intern(value) if type(value) is str and len(value) <= 64 else value


def _ns(value: object) -> int:
    """A timestamp (nanoseconds): a whole number, or the record is malformed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"a timestamp must be a number of nanoseconds, got {value!r}")
    return int(value)


def _attributes(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"attributes must be an object, got {type(value).__name__}")
    return value


_EARLY_EVENTS_KEPT = 10_000  # spans whose events came before their start record (a file re-created mid-run)


def _attach(run: TelemetryRun, span_id: str, event: EventRecord) -> None:
    """Give ``event`` to its span, or hold it until the span's record comes (a bounded number: the events
    of spans that are not kept never find theirs)."""
    span = run.spans.get(span_id)
    if span is not None:
        _hold(run, span.events, event)
    elif len(run.spans) < MAX_SPANS and (span_id in run._early_events or len(run._early_events) < _EARLY_EVENTS_KEPT):
        _hold(run, run._early_events.setdefault(span_id, []), event)
    else:
        _count(run.events_not_kept, event.name)


def _hold(run: TelemetryRun, events: list[EventRecord], event: EventRecord) -> None:
    """Put ``event`` in ``events``; beyond :data:`MAX_EVENTS` of its name it replaces the latest (counted as not
    kept), so a run's last word (the steps its last loop reached) is kept."""
    kept, latest = run._events_kept.get(event.name, (0, events))
    if kept >= MAX_EVENTS:
        at = next(i for i in range(len(latest) - 1, -1, -1) if latest[i].name == event.name)
        del latest[at]
        kept -= 1
        _count(run.events_not_kept, event.name)
    elif not kept and len(run._events_kept) >= MAX_EVENT_NAMES:
        _count(run.events_not_kept, event.name)
        return
    events.append(event)
    run._events_kept[event.name] = (kept + 1, events)


def _keep(run: TelemetryRun, span: SpanRecord, ended: bool) -> None:
    """Keep ``span`` among the run's spans, unless :data:`MAX_SPANS` are: then count it (once: when it ended)."""
    if len(run.spans) < MAX_SPANS:
        run.spans[span.span_id] = span
    elif ended:
        _count(run.spans_not_kept, span.name)


def _count(counts: Counter[str], name: str) -> None:
    counts[name if name in counts or len(counts) < MAX_EVENT_NAMES else "(other names)"] += 1


def _fold_pending(run: TelemetryRun) -> None:
    pending, run._pending = run._pending, None
    if pending is not None:
        run.digest = run.digest or RunDigest()
        run.digest.add(pending, run.spans)


def digest_of(run: TelemetryRun) -> RunDigest:
    """The run's digest: the one folded while reading, else made now from its compilation spans."""
    if run.digest is None:
        run.digest = RunDigest()
        for span in sorted(run.find(JitSpanName.COMPILATION), key=lambda s: s.start_unix_ns):
            run.digest.add(span, run.spans)
    return run.digest


def _infer_parents(run: TelemetryRun) -> None:
    """Each span's parent: the innermost other span (not a compilation) whose time contains it."""
    forever = float("inf")
    # sorted so that a span comes after every span that contains it; the open ones form a stack
    spans = sorted(run.spans.values(), key=lambda s: (s.start_unix_ns, -(s.end_unix_ns or forever)))
    open_spans: list[SpanRecord] = []
    for span in spans:
        end = span.end_unix_ns or forever
        while open_spans and (open_spans[-1].end_unix_ns or forever) < end:
            open_spans.pop()
        if open_spans:
            span.parent_id = open_spans[-1].span_id
        if span.name != JitSpanName.COMPILATION.value:
            open_spans.append(span)


def _apply(run: TelemetryRun, record: dict[str, Any], digest: bool) -> None:
    kind = record["kind"]
    pending = run._pending
    if kind in ("event", "error"):
        event = EventRecord(
            str(record["name"]), _ns(record["time_unix_ns"]), _attributes(record.get("attributes", {})), kind == "error"
        )
        run.last_unix_ns = max(run.last_unix_ns, event.time_unix_ns)
        if pending is not None and record["span_id"] == pending.span_id:
            # a compilation's events follow its record; kept with it only where it is kept
            if pending.span_id in run.spans:
                _hold(run, pending.events, event)
                return
            pending.events.append(event)  # for the digest only
            if not digest:  # a compilation read to be kept, beyond the spans kept
                _count(run.events_not_kept, event.name)
            return
        _fold_pending(run)
        _attach(run, record["span_id"], event)
        return
    _fold_pending(run)
    if kind in ("span_start", "span"):
        span = run.spans.get(record["span_id"])
        if span is None:
            start = _ns(record["start_unix_ns"])
            span = SpanRecord(str(record["span_id"]), str(record["name"]), record.get("parent_id"), start)
            span.events = run._early_events.pop(record["span_id"], [])
            if kind == "span" and span.name == JitSpanName.COMPILATION:
                run._pending = span  # folded into the digest once its events have come
            if not (digest and run._pending is span):  # with the digest, never kept
                _keep(run, span, ended=kind == "span")
        run.last_unix_ns = max(run.last_unix_ns, span.start_unix_ns)
        run.first_unix_ns = min(run.first_unix_ns or span.start_unix_ns, span.start_unix_ns)
        if kind == "span":
            span.end_unix_ns = _ns(record["end_unix_ns"])
            span.attributes = _attributes(record.get("attributes", {}))
            if run.spans.get(span.span_id) is span:  # kept: its names (and short texts) held once, not per span
                span.attributes = {sys.intern(name): _interned(value) for name, value in span.attributes.items()}
            run.last_unix_ns = max(run.last_unix_ns, span.end_unix_ns)
    elif kind == "run_start" and record.get("continues"):
        run.fragment = str(record["continues"])
    elif kind == "moved_on":
        run.fragment = str(record.get("detail", "its file was moved away while it wrote it"))
    elif kind == "records_lost":
        run.lost_records += int(record["count"])
    elif kind == "health":
        run.health = {key: value for key, value in record.items() if key not in _RECORD_KEYS}


@dataclass
class Loaded:
    runs: list[TelemetryRun] = field(default_factory=list)  # the runs to show, in rank order within a file set
    paths: list[Path] = field(default_factory=list)  # the files read
    notes: list[str] = field(default_factory=list)  # what the user should know about the choice of runs
    errors: list[str] = field(default_factory=list)  # files that could not be read, each said
    doubtful_ranks: list[str] = field(default_factory=list)  # ranks that cannot be what they claim, each said
    concurrent: list[str] = field(default_factory=list)  # files written by several processes at once, each said


def _rank_order(path: Path) -> tuple[str, int]:
    match = RANK_FILE.search(path.name)
    return (path.name[: match.start()] if match else path.stem, int(match.group(1)) if match else -1)


def load(
    arguments: Sequence[str | Path], *, all_runs: bool = False, run_id: str | None = None, digest: bool = True
) -> Loaded:
    """Read the files ``arguments`` name: of each, its last run, every run, or the run whose id starts
    with ``run_id``. Per-iteration spans are not kept (the analysis needs none of them)."""
    loaded = Loaded()
    for path in map(Path, arguments):  # a folder: the *.jsonl files in it, rank files in rank order
        loaded.paths += sorted(path.glob("*.jsonl"), key=_rank_order) if path.is_dir() else [path]
    if not loaded.paths:
        loaded.errors.append(f"no telemetry file in {', '.join(map(str, arguments))}")
    held: dict[Path, list[TelemetryRun]] = {}
    for path in loaded.paths:
        try:
            runs = held[path] = read_telemetry(path, skip_spans=ITERATION_SPANS, digest=digest, run_id=run_id)
        except (FileNotFoundError, TelemetryFileError, OSError) as error:
            loaded.errors.append(str(error))
            continue
        ids = _ids(runs)
        if run_id is not None:
            chosen = [run for run in runs if run.run_id.startswith(run_id)]
            if not chosen:
                loaded.errors.append(f"{path} holds no run {run_id!r} (it holds {ids})")
            elif problem := _not_one_writer(chosen, run_id):
                loaded.errors.append(f"{path}: {problem}")
            loaded.runs.extend(chosen[-1:])
        elif all_runs or len(runs) == 1:
            loaded.runs.extend(runs)
        else:
            # the last started (its first record is the file's last first record): the run the user just ran,
            # finished or not, never an older one that looks better
            loaded.runs.append(runs[-1])
            loaded.notes.append(
                f"{path} holds {runs.total} runs ({ids}); showing the last started (--all-runs for all, --run ID for "
                "one)"
            )
        left = runs.left_out
        if left.runs:
            loaded.notes.append(
                f"{path}: {left.runs} of its runs (the least recently written) were counted, not read: more than "
                f"{left.max_runs} are held at once"
            )
        if run_id is None and ((at_once := written_at_once(runs)) or left.written_at_once):
            which = ", ".join(f"run {short_run_id(run.run_id)} (pid {run.pid})" for run in at_once[:_IDS_SAID])
            if len(at_once) + left.written_at_once > _IDS_SAID:
                which += f" and {len(at_once) + left.written_at_once - min(len(at_once), _IDS_SAID)} more"
            loaded.concurrent.append(
                f"{path} holds runs of {len(at_once) + left.written_at_once} processes written at the same time "
                f"({which}): two processes wrote one file, so which run is yours cannot be told; give each process "
                "its own file, or pick one with --run ID"
            )
    if run_id is None and not all_runs:
        _one_job_per_rank_set(loaded, held)
    loaded.doubtful_ranks = rank_problems(loaded.runs)
    loaded.notes += loaded.doubtful_ranks + loaded.concurrent
    # a job's rank files are whole only together (check refuses a part, exit 3)
    loaded.notes += [f"not the whole job: missing {absent}" for absent in missing_ranks(loaded.runs)]
    return loaded


_IDS_SAID = 10  # run ids said in a note; the rest counted


def _ids(runs: RunsRead) -> str:
    """The runs' ids as a note says them: each, or past :data:`_IDS_SAID` the last started and how many more."""
    ids = [short_run_id(run.run_id) for run in runs[-_IDS_SAID:]]
    if runs.total <= _IDS_SAID:
        return ", ".join(ids)
    return f"{runs.total - len(ids)} earlier, then the last {len(ids)} started: {', '.join(ids)}"


def _not_one_writer(chosen: Sequence[TelemetryRun], run_id: str) -> str:
    """Why ``--run run_id`` names no one run of a file (``chosen``: its runs whose id starts so), or ""."""
    named = sorted({run.run_id for run in chosen})
    if len(named) > 1:
        return f"--run {run_id!r} names {len(named)} runs ({', '.join(named)}): give more of the id"
    writers = Counter(run.rank for run in chosen)
    rank, count = writers.most_common(1)[0]
    if count < 2:
        return ""
    which = ", ".join(
        f"pid {run.pid}{f' on {run.node}' if run.node else ''} from line {run.first_line}"
        for run in chosen
        if run.rank == rank
    )
    return (
        f"run {short_run_id(named[0])} is shared by {count} writers ({which}): several processes wrote under one "
        "id (a launcher's job id reused, a run resumed into the same file), so which one --run means cannot be "
        "told; see each with --all-runs, and give each its own TELEMETRY_JIT_RUN_ID or file"
    )


def _one_job_per_rank_set(loaded: Loaded, held: dict[Path, list[TelemetryRun]]) -> None:
    """Of the rank files of one name (``t.rank0.jsonl``, ...), show the ranks of the newest job; a rank file holding
    no run of it is an earlier job's: said and left out, never read as a rank of this job."""
    sets: dict[tuple[Path, str], list[Path]] = {}
    instead: dict[int, TelemetryRun | None] = {}  # id of a run of another job -> its file's run of the job
    for path in held:
        if RANK_FILE.search(path.name):
            sets.setdefault((path.parent, _rank_order(path)[0]), []).append(path)
    for paths in sets.values():
        every = [run for path in paths for run in held[path]]
        if len(paths) < 2 or len({run.run_id for run in every}) < 2:
            continue
        job = max(every, key=lambda run: run.first_unix_ns).run_id
        for path in paths:
            of_job = [run for run in held[path] if run.run_id == job]
            if not of_job and held[path]:
                loaded.notes.append(
                    f"{path} holds no run of job {short_run_id(job)}, the newest in its rank files: an earlier "
                    "job's rank file, left out (--run ID picks a job)"
                )
            # the file's shown run, where another job's: in place by this job's run of the file, or left out
            instead.update({id(run): of_job[-1] if of_job else None for run in held[path] if run.run_id != job})
    shown = (instead.get(id(run), run) for run in loaded.runs)
    loaded.runs = [run for run in shown if run is not None]


def written_at_once(runs: Sequence[TelemetryRun]) -> list[TelemetryRun]:
    """The runs of ``runs`` (one file's) whose lines interleave with another's: processes that wrote at once."""
    at_once: dict[int, TelemetryRun] = {}
    reaching: TelemetryRun | None = None  # of the runs begun so far, the one whose lines reach furthest
    for run in sorted(runs, key=lambda run: run.first_line):
        if reaching is not None and run.first_line < reaching.last_line:
            at_once[id(reaching)], at_once[id(run)] = reaching, run
        if reaching is None or run.last_line > reaching.last_line:
            reaching = run
    return sorted(at_once.values(), key=lambda run: run.first_line)


def rank_problems(runs: Sequence[TelemetryRun]) -> list[str]:
    """Ranks that cannot be what they claim: one rank of a run written by two processes, or a rank beyond
    its job's size."""
    problems = []
    seen: dict[tuple[str, int], TelemetryRun] = {}
    for run in runs:
        if run.rank >= run.world_size > 1 or run.rank < 0:
            problems.append(
                f"run {short_run_id(run.run_id)}: rank {run.rank} is no rank of a job of {run.world_size} ranks "
                "(its launcher's rank variables were wrong)"
            )
        other = seen.get((run.run_id, run.rank))
        if other is not None and other.pid != run.pid:
            problems.append(
                f"run {short_run_id(run.run_id)}: rank {run.rank} was written by two processes (pids {other.pid} and "
                f"{run.pid}); the later is shown, and a comparison of ranks cannot tell which is the rank"
            )
        seen[(run.run_id, run.rank)] = run
    return problems
