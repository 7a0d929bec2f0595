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
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
class TelemetryRun:
    """Everything one process wrote in one run."""

    run_id: str
    rank: int
    node: str = ""
    pid: int = 0
    spans: dict[str, SpanRecord] = field(default_factory=dict)
    data_errors: list[dict[str, Any]] = field(default_factory=list)
    lost_records: int = 0  # records the writer could not put in the file (disk full, say), by its count
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
    """Read every run in ``path``, in file order, a line at a time: memory grows with what is kept, not
    with the file.

    A truncated last line (a process killed mid-write) is skipped with a warning. ``skip_spans``: span
    names not to keep (with their events), e.g. the per-iteration spans a long run exports by the million
    (:data:`ITERATION_SPANS`); their lines are recognised without being parsed.

    Raises:
        FileNotFoundError: no such file.
        TelemetryFileError: the file is empty or is not a telemetry-jit file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No telemetry file at {str(path)!r}.")
    runs: dict[tuple[str, int, int], TelemetryRun] = {}
    skipped = tuple(f'"name":"{name}"'.encode() for name in skip_spans)
    number = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):  # noqa: B007 - the count is read after the loop
            if skipped and any(needle in raw for needle in skipped):
                continue
            record = _parse(path, raw, number, complete=raw.endswith(b"\n"), runs_so_far=bool(runs))
            if record is None:
                continue
            try:
                _read_record(path, number, record, runs, skip_spans)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                if isinstance(error, TelemetryFileError):
                    raise
                kind = record.get("kind", record.get("type"))
                raise TelemetryFileError(
                    f"{str(path)!r} line {number}: malformed {kind!r} record ({error!r})."
                ) from None
    if number == 0:
        raise TelemetryFileError(f"{str(path)!r} is empty: the run wrote no telemetry.")
    if not runs:
        raise TelemetryFileError(f"{str(path)!r} holds no complete telemetry record.")
    for run in runs.values():
        run._early_events.clear()
        if run.file_format == "nv-one-logger":
            _infer_parents(run)
    return list(runs.values())


ITERATION_SPANS = (
    TrainingSpanName.TRAINING_ITERATION,
    TrainingSpanName.VALIDATION_ITERATION,
    "testing_single_iteration",
)


def _parse(path: Path, raw: bytes, number: int, complete: bool, runs_so_far: bool) -> dict[str, Any] | None:
    """One line's record; ``None`` (with a warning) for a line that is not one."""
    if not raw.strip():
        return None
    try:
        record = json.loads(raw)
        if _ESCAPED_SURROGATE.search(raw):
            record = _valid_text(record)
    except (json.JSONDecodeError, UnicodeDecodeError):
        if not complete:
            say(f"{path}: last line {number} is truncated and was skipped.")
            return None
        if not runs_so_far:
            raise TelemetryFileError(f"{str(path)!r} is not a telemetry-jit JSON Lines file (line {number}).") from None
        say(f"{path}: line {number} is not valid JSON and was skipped.")
        return None
    if not isinstance(record, dict):
        raise TelemetryFileError(f"{str(path)!r} is not a telemetry-jit JSON Lines file (line {number}).")
    return record


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
        if kind == "span":
            span.end_unix_ns = _ns(record["end_unix_ns"])
            span.attributes = _attributes(record.get("attributes", {}))
    elif kind in ("event", "error"):
        event = EventRecord(
            str(record["name"]), _ns(record["time_unix_ns"]), _attributes(record.get("attributes", {})), kind == "error"
        )
        _attach(run, record["span_id"], event)
    elif kind == "records_lost":
        run.lost_records += int(record["count"])
    elif kind == "telemetry_data_error":
        run.data_errors.append(record.get("attributes", {}))
