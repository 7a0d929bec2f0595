"""Load a telemetry file back into spans with their events and parent links.

Two formats are read, told apart by their records: telemetry-jit's own (``FileExporter`` of this
package) and nv-one-logger's ``FileExporter``. The latter has no parent links, no run id and
millisecond timestamps: parents are inferred from time (each span hangs under the innermost span
that contains it), and :attr:`TelemetryRun.lacks` says what the file could not tell.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from telemetry_jit.notices import say
from telemetry_jit.schema import FILE_FORMAT, FILE_FORMAT_VERSION, JitSpanName, TrainingSpanName


class TelemetryFileError(ValueError):
    """The file is not a readable telemetry-jit file."""


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
    spans: dict[str, SpanRecord] = field(default_factory=dict)
    data_errors: list[dict[str, Any]] = field(default_factory=list)
    lost_records: int = 0  # records the writer could not put in the file (disk full, say), by its count
    # what telemetry could not do, as the writer's last record says (None: it never wrote one: killed, or older)
    health: dict[str, Any] | None = None
    damage: FileDamage | None = None  # lines of its file that could not be read
    file_format: str = FILE_FORMAT  # or "nv-one-logger"
    lacks: list[str] = field(default_factory=list)  # what this file's format cannot tell
    # events of spans whose start is not in the file (it was deleted mid-run), until the span's end record
    _early_events: dict[str, list[EventRecord]] = field(default_factory=dict, repr=False)

    def find(self, name: str) -> list[SpanRecord]:
        return [span for span in self.spans.values() if span.name == name]

    @property
    def roots(self) -> list[SpanRecord]:
        return [span for span in self.spans.values() if span.parent_id not in self.spans]

    def parent(self, span: SpanRecord) -> SpanRecord | None:
        return self.spans.get(span.parent_id) if span.parent_id else None


def number(value: object, default: float = 0.0) -> float:
    """A figure read from a file: the number it holds, or ``default`` where the file holds something else
    (a string, ``null``, NaN or an infinity): a damaged or hand-edited file must not end the analysis."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) else default


def read_telemetry(path: str | os.PathLike[str], skip_spans: Collection[str] = ()) -> list[TelemetryRun]:
    """Read every run in ``path`` (``"-"``: standard input), in file order, a line at a time: memory grows
    with what is kept, not with the file.

    A line that is no record (not JSON, binary data, longer than :data:`MAX_LINE_BYTES`, nested too deep) is
    skipped and counted, and a last line cut short is skipped: the runs say what was lost
    (:attr:`TelemetryRun.damage`), and one warning per file says it. ``skip_spans``: span names not to keep
    (with their events), e.g. the per-iteration spans a long run exports by the million
    (:data:`ITERATION_SPANS`); their lines are recognised without being parsed.

    Raises:
        FileNotFoundError: no such file.
        TelemetryFileError: the file is empty or is not a telemetry-jit file.
    """
    if str(path) == "-":
        return _read(Path("<stdin>"), sys.stdin.buffer, skip_spans)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No telemetry file at {str(path)!r}.")
    with path.open("rb") as handle:
        return _read(path, handle, skip_spans)


MAX_LINE_BYTES = 64 * 2**20  # one record; a compile span is a few KB, the longest torch text a few hundred KB


def _read(path: Path, handle: BinaryIO, skip_spans: Collection[str]) -> list[TelemetryRun]:
    runs: dict[tuple[str, int, int], TelemetryRun] = {}
    skipped = tuple(f'"name":"{name}"'.encode() for name in skip_spans)
    damage = FileDamage()
    number = 0
    for number, raw in _lines(handle):  # noqa: B007 - the count is read after the loop
        if skipped and any(needle in raw for needle in skipped):
            continue
        record = _parse(path, raw, number, damage, runs_so_far=bool(runs))
        if record is None:
            continue
        try:
            _read_record(path, number, record, runs, skip_spans)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, TelemetryFileError):
                raise
            kind = record.get("kind", record.get("type"))
            raise TelemetryFileError(f"{str(path)!r} line {number}: malformed {kind!r} record ({error!r}).") from None
    if number == 0:
        raise TelemetryFileError(f"{str(path)!r} is empty: the run wrote no telemetry.")
    if not runs:
        raise TelemetryFileError(f"{str(path)!r} holds no complete telemetry record.")
    if damage:
        say(f"{path}: {damage.words()}.")
    for run in runs.values():
        run._early_events.clear()
        run.damage = damage if damage else None
        if run.file_format == "nv-one-logger":
            _infer_parents(run)
    return list(runs.values())


def _lines(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each line; a line longer than :data:`MAX_LINE_BYTES` is read no further
    (its bytes are dropped as they come) and given as ``b""``."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES):
        number += 1
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield number, b"\x00too long"
            continue
        yield number, raw


ITERATION_SPANS = (
    TrainingSpanName.TRAINING_ITERATION,
    TrainingSpanName.VALIDATION_ITERATION,
    "testing_single_iteration",
)


def _parse(path: Path, raw: bytes, number: int, damage: FileDamage, runs_so_far: bool) -> dict[str, Any] | None:
    """One line's record; ``None`` for a line that is not one (counted in ``damage``)."""
    if not raw.strip():
        return None
    reason = ""
    record: Any = None
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
    if not reason and not isinstance(record, dict):
        reason = "not a record (a JSON object)"
    if not reason:
        return record
    if not raw.endswith(b"\n") and reason == "not valid JSON":
        damage.cut_short = True  # the last line, ending mid-record
        return None
    if not runs_so_far:
        raise TelemetryFileError(f"{str(path)!r} is not a telemetry-jit JSON Lines file (line {number}: {reason}).")
    damage.bad_lines += 1
    if damage.bad_lines == 1:
        damage.first_bad_line, damage.first_reason = number, reason
    return None


def _read_record(
    path: Path,
    number: int,
    record: dict[str, Any],
    runs: dict[tuple[str, int, int], TelemetryRun],
    skip_spans: Collection[str],
) -> None:
    if "kind" in record and "run" in record:
        # one process of one run: a file appended to by the same job twice holds two
        key = (str(record["run"]), int(record.get("rank", 0)), int(record.get("pid", 0)))
        run = runs.get(key)
        if run is None:
            run = runs[key] = TelemetryRun(run_id=key[0], rank=key[1], node=str(record.get("node", "")), pid=key[2])
        world_size = record.get("world_size")
        if isinstance(world_size, int) and world_size > run.world_size:
            run.world_size = world_size
        _check_version(path, record)
        if record.get("name") in skip_spans:
            return
        _apply(run, record)
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


def _check_version(path: Path, record: dict[str, Any]) -> None:
    if record["kind"] == "run_start" and int(record.get("format_version", 1)) > FILE_FORMAT_VERSION:
        raise TelemetryFileError(
            f"{str(path)!r} was written in telemetry-jit file format {record['format_version']}, newer than this "
            f"telemetry-jit reads ({FILE_FORMAT_VERSION}): upgrade telemetry-jit to read it."
        )


_RECORD_KEYS = frozenset(("kind", "run", "rank", "local_rank", "world_size", "node", "pid"))
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
            span = run.spans[record["id"]] = SpanRecord(
                span_id=record["id"],
                name=record["name"],
                parent_id=None,
                start_unix_ns=_ms(record["start_event"]) if "start_event" in record else _ms(record["stop_event"]),
                events=run._early_events.pop(record["id"], []),
            )
        span.attributes.update(record.get("attributes") or {})
        if kind != "start":
            span.end_unix_ns = _ms(record["stop_event"])
    elif kind in ("event", "application_error"):
        event = record["event"]
        _attach(
            run,
            record["span_id"],
            EventRecord(event["name"], _ms(event), event.get("attributes", {}), kind == "application_error"),
        )
    else:
        run.data_errors.append(record.get("event", {}).get("attributes", {}))


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
        span.events.append(event)
    elif span_id in run._early_events or len(run._early_events) < _EARLY_EVENTS_KEPT:
        run._early_events.setdefault(span_id, []).append(event)


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


def _apply(run: TelemetryRun, record: dict[str, Any]) -> None:
    kind = record["kind"]
    if kind in ("span_start", "span"):
        span = run.spans.get(record["span_id"])
        if span is None:
            span = run.spans[record["span_id"]] = SpanRecord(
                span_id=str(record["span_id"]),
                name=str(record["name"]),
                parent_id=record.get("parent_id"),
                start_unix_ns=_ns(record["start_unix_ns"]),
                events=run._early_events.pop(record["span_id"], []),
            )
        run.last_unix_ns = max(run.last_unix_ns, span.start_unix_ns)
        if kind == "span":
            span.end_unix_ns = _ns(record["end_unix_ns"])
            span.attributes = _attributes(record.get("attributes", {}))
            run.last_unix_ns = max(run.last_unix_ns, span.end_unix_ns)
    elif kind in ("event", "error"):
        event = EventRecord(
            str(record["name"]), _ns(record["time_unix_ns"]), _attributes(record.get("attributes", {})), kind == "error"
        )
        run.last_unix_ns = max(run.last_unix_ns, event.time_unix_ns)
        _attach(run, record["span_id"], event)
    elif kind == "records_lost":
        run.lost_records += int(record["count"])
    elif kind == "health":
        run.health = {key: value for key, value in record.items() if key not in _RECORD_KEYS}
    elif kind == "telemetry_data_error":
        run.data_errors.append(record.get("attributes", {}))
