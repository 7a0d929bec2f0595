"""A crash-safe JSON Lines exporter for nv-one-logger spans and events.

Every record is one line, written with a single ``write(2)`` on a file opened with ``O_APPEND``,
so a process killed at any moment (SIGKILL included) leaves a file whose complete lines all parse
and that holds every span that ended before the kill. Records carry parent links, so the span
tree can be rebuilt (``telemetry_jit.read_telemetry``).

File policy: never clobber. A file that exists is appended to; every record carries the run id,
so runs sharing a file stay apart. With ``WORLD_SIZE > 1`` each rank writes its own file
(``name.rank<R>.jsonl``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.exporter.exporter import BaseExporter, ExportError
from overrides import override

FORMAT = "telemetry-jit"
FORMAT_VERSION = 1


def _unix_ns(timestamp: TracingTimestamp) -> int:
    return round(timestamp.seconds_since_epoch * 1e9)


def _distributed_identity() -> tuple[int, int]:
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0)
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return rank, world_size


def rank_path(path: Path, rank: int, world_size: int) -> Path:
    """``path`` itself for a single process, ``stem.rank<R>.suffix`` beside it otherwise."""
    if world_size <= 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class FileExporter(BaseExporter):
    """Write spans and events as JSON Lines to ``path``.

    Args:
        path: the file to append to. Its folder is created if missing.
        run_id: identifies this run's records; a fresh UUID by default.

    Raises:
        ValueError: ``path`` is a directory.
        PermissionError: the file or its folder is not writable.

    Example::

        provider.with_exporter(FileExporter("runs/telemetry.jsonl"))
    """

    def __init__(self, path: str | os.PathLike[str], run_id: str | None = None) -> None:
        super().__init__()
        self.rank, self.world_size = _distributed_identity()
        self.path = rank_path(Path(path).expanduser(), self.rank, self.world_size)
        self.run_id = run_id or uuid.uuid4().hex
        self._fd: int | None = None
        self._lock = threading.Lock()
        _check_writable(self.path)

    @override
    def initialize(self) -> None:
        super().initialize()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self._write(
            {
                "kind": "run_start",
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "host": socket.gethostname(),
                "world_size": self.world_size,
            }
        )

    @override
    def export_start(self, span: Span) -> None:
        super().export_start(span)
        self._write(
            {
                "kind": "span_start",
                "span_id": str(span.id),
                "parent_id": _parent_id(span),
                "name": span.name_str,
                "start_unix_ns": _unix_ns(span.start_event.timestamp),
            }
        )

    @override
    def export_stop(self, span: Span) -> None:
        super().export_stop(span)
        stop_event = span.stop_event
        if stop_event is None:
            raise ExportError(f"span {span.name_str} ({span.id}) was exported as stopped but has no stop event")
        self._write(
            {
                "kind": "span",
                "span_id": str(span.id),
                "parent_id": _parent_id(span),
                "name": span.name_str,
                "start_unix_ns": _unix_ns(span.start_event.timestamp),
                "end_unix_ns": _unix_ns(stop_event.timestamp),
                "attributes": span.attributes.to_json(),
            }
        )

    @override
    def export_event(self, event: Event, span: Span) -> None:
        super().export_event(event, span)
        self._write(_event_record("event", event, span))

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        super().export_error(event, span)
        self._write(_event_record("error", event, span))

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        super().export_telemetry_data_error(error)
        self._write({"kind": "telemetry_data_error", "attributes": error.attributes.to_json()})

    @override
    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        super().close()

    def _write(self, record: dict[str, Any]) -> None:
        record["run"] = self.run_id
        record["rank"] = self.rank
        record["pid"] = os.getpid()
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ExportError(f"FileExporter({self.path}) is not open")
            os.write(self._fd, line)


def _parent_id(span: Span) -> str | None:
    return str(span.parent_span.id) if span.parent_span is not None else None


def _event_record(kind: str, event: Event, span: Span) -> dict[str, Any]:
    return {
        "kind": kind,
        "span_id": str(span.id),
        "name": event.name_str,
        "time_unix_ns": _unix_ns(event.timestamp),
        "attributes": event.attributes.to_json(),
    }


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise ValueError(
            f"FileExporter path {str(path)!r} is a directory; "
            f"pass a file path such as {str(path / 'telemetry.jsonl')!r}."
        )
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PermissionError(
                f"FileExporter cannot write to {str(path)!r}: permission denied. Choose a writable path."
            )
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(
            f"FileExporter cannot create {str(path)!r}: {str(parent)!r} is not a writable directory. "
            "Choose a writable path."
        )
