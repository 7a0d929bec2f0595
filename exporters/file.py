"""A crash-safe JSON Lines exporter for nv-one-logger spans and events.

Each record is one line, one ``write(2)`` on an ``O_APPEND`` file: a process killed at any moment leaves lines that
all parse. A short or failed write is cut back off and counted (``records_lost``, written once writing works). A file
deleted or moved away mid-run is created again at the path (first record ``continues``; the moved one's last,
``moved_on``). The exporter owns its descriptor or holds none, never a number it gave up. File policy: never clobber;
append only to a file telemetry-jit wrote; each rank its own file (``name.rank<R>.jsonl``), which a process that
learns its rank late (rank 0 of a DDP launch) moves to. docs/telemetry.md and docs/reliability.md say the rest.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter, ExportError
from typing_extensions import override

from telemetry_jit.identity import IdentityTracker
from telemetry_jit.identity import run_id as job_run_id
from telemetry_jit.notices import Notices
from telemetry_jit.schema import FILE_FORMAT, FILE_FORMAT_VERSION, RecordKey, rank_file

from .finished import FinishedSpan, unix_ns

_RUN_START = {"kind": "run_start", "format": FILE_FORMAT, "format_version": FILE_FORMAT_VERSION}
# the first record of a file created again at the path while the run wrote it: the records before are elsewhere
_CONTINUES = "the run's file was deleted or moved away while it wrote it; its earlier records are not in this file"
_MOVED_ON = "this file was deleted or moved away while the run wrote it; the run's later records went to a new file"
_REOPEN_EVERY_S = 1.0  # a path that cannot be opened again is tried at most this often (not at every record)


def _compact_json_encoder() -> Callable[[Any], str]:
    """Compact JSON; json's C encoder built once where it is the same as ``JSONEncoder.encode`` (which builds it
    again for every record, about 1 us of the 5 a record takes here)."""
    reference = json.JSONEncoder(separators=(",", ":"), default=str).encode
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return reference
    try:
        encoder = make(None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
        sample = {"a": [1, 2.5, "\u00e9\n", True, None], "b": {"c": float("inf")}}
        if "".join(encoder(sample, 0)) != reference(sample):
            return reference
    except Exception:  # noqa: BLE001 - another Python's private API: the public encoder then
        return reference
    return lambda value: "".join(encoder(value, 0))


_encode = _compact_json_encoder()
_id_text = functools.lru_cache(maxsize=4096)(str)  # a span's id is written with each of its records


class FileExporter(BaseExporter):
    """Write spans and events as JSON Lines to ``path`` (its folder created if missing).

    Args:
        run_id: identifies this run's records; by default the job's run id, shared by its ranks.
        identity: where the rank, world size and node on every record come from (``configure`` shares one).

    Raises:
        ValueError: ``path`` is a directory, a link, no regular file, or a file telemetry-jit did not write.
        PermissionError: the file or its folder is not writable.

    Example::

        provider.with_exporter(FileExporter("runs/telemetry.jsonl"))
    """

    never_blocks = True

    def __init__(
        self, path: str | os.PathLike[str], run_id: str | None = None, identity: IdentityTracker | None = None
    ) -> None:
        super().__init__()
        # absolute now: a later os.chdir (Hydra's) must not move the file mid-run
        self.base_path = Path(path).expanduser().absolute()
        self.identity = identity or IdentityTracker()
        me = self.identity.current()
        self.path = rank_file(self.base_path, me.rank, me.world_size)
        self.run_id = run_id or job_run_id()
        self._fd: int | None = None  # None while ready: the file was lost and could not be opened again yet
        self._next_reopen = 0.0  # monotonic time of the next try to open a lost file again
        self._fd_file: tuple[int, int] = (-1, -1)  # the open file's (device, inode): is the path still it?
        self._created = False
        self._identity_version = -1  # the identity fields go on every record; refreshed when it changes
        self._stamp = ""  # the identity fields, encoded once: ',"run":...,"pid":...}' closes every record
        self._lock = threading.Lock()
        # what proves the run whole (docs/reliability.md): every record carries this writer's id and its number in
        # the writer's sequence (from 0, the run_start), and the last, run_end, counts what was written by kind
        self.writer_id = secrets.token_hex(6)
        self._seq = 0
        self._written: Counter[str] = Counter()  # records appended, by kind
        self._whole: set[Any] = set()  # ids of spans written whole at export_start
        self.lost_records = 0  # records a failed write could not put in the file
        self._unreported_losses = 0
        self._notices = Notices()
        # what telemetry could not do, written as the file's last record at close (the session sets it)
        self.health: Callable[[], dict[str, Any]] | None = None
        _check_writable(self.path)

    @property
    def shown_path(self) -> Path:
        """``base_path`` relative to the working folder when inside it."""
        try:
            return self.base_path.relative_to(Path.cwd())
        except (ValueError, OSError):
            return self.base_path

    @override
    def initialize(self) -> None:
        self._created = not self.path.exists()
        try:
            self._open_file(self.path)
        except OSError as error:  # what access() could not foresee: a read-only or virtual file system, root's access
            raise type(error)(
                f"FileExporter cannot create {str(self.path)!r}: {error.strerror or error}. Choose a path in a folder "
                "you can write to, e.g. file='runs/telemetry.jsonl'."
            ) from error
        super().initialize()  # ready: from here until close, records are written or counted as lost
        self._write(_RUN_START)

    @override
    def export_start(self, span: Span) -> None:
        super().export_start(span)
        if span.stop_event is not None:
            # recorded after it ended (a compilation): one complete record, ahead of its events
            self._whole.add(span.id)
            self._write(_nv_span_record(span))
            return
        self._write(
            {
                "kind": "span_start",
                "span_id": _id_text(span.id),
                "parent_id": _parent_id(span),
                "name": span.name_str,
                "start_unix_ns": unix_ns(span.start_event.timestamp),
            }
        )

    @override
    def export_stop(self, span: Span) -> None:
        super().export_stop(span)
        if span.id in self._whole:
            self._whole.discard(span.id)
            return
        if span.stop_event is None:
            raise ExportError(f"span {span.name_str} ({span.id}) was exported as stopped but has no stop event")
        self._write(_nv_span_record(span))

    @override
    def export_event(self, event: Event, span: Span) -> None:
        super().export_event(event, span)
        self._write(_nv_event_record("event", event, span))

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        super().export_error(event, span)
        self._write(_nv_event_record("error", event, span))

    def export_finished_span(self, span: FinishedSpan) -> None:
        self._check_state()
        span_id = str(span.id)
        parent_id = _id_text(span.parent.id) if span.parent is not None else None
        start, end = span.start_unix_ns, span.end_unix_ns
        self._write(
            _span_record(span_id, parent_id, span.name, start, end, span.exported_attributes()),
            *(
                _event_record("error" if e.error else "event", span_id, e.name, e.time_unix_ns, e.exported_attributes())
                for e in span.events
            ),
        )

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        super().export_telemetry_data_error(error)
        self._write({"kind": "telemetry_data_error", "attributes": error.attributes.to_json()})

    @override
    def close(self) -> None:
        with self._lock:
            self._next_reopen = 0.0  # a lost file is tried at once: the health record and the losses' count go last
            if self.ready:
                self._reopen_if_gone()
        if self.health is not None and self.ready:
            try:
                health = {"kind": "health", **self.health()}
            except Exception as error:  # noqa: BLE001 - the account of losses must not lose the file
                health = {"kind": "health", "unknown": repr(error)}
            self._write(health)
        with self._lock:
            if self.ready and not self._report_losses():
                self._warn(
                    "lost at close",
                    f"telemetry-jit: {self.lost_records} telemetry record(s) could not be written to {self.path}.",
                )
            if self.ready and self._fd is not None:
                # the run's last word: what it wrote, by kind; a reader holding fewer knows what is missing
                end = {"kind": "run_end", RecordKey.RECORDS: self._seq, RecordKey.WRITTEN: dict(self._written)}
                self._append(self._line(end), "run_end")
            self._give_up_fd()
            super().close()  # under the lock: a record waiting for it finds the exporter closed

    def _give_up_fd(self) -> None:
        # forget the number first: a number given up is never closed twice
        fd, self._fd, self._fd_file = self._fd, None, (-1, -1)
        if fd is not None:
            os.close(fd)

    def _write(self, *records: dict[str, Any]) -> None:
        """Append ``records`` in one write: all of them, or none (then they are counted as lost)."""
        if self._identity_version != self.identity.version:
            self._follow_identity()
        bodies = [_encode(record)[:-1] for record in records]  # encoded outside the lock; numbered inside it
        with self._lock:
            if not self.ready:
                raise ExportError(f"FileExporter({self.path}) is not open")
            self._reopen_if_gone()
            self._report_losses()
            lines = b"".join(self._stamped(body) for body in bodies)  # a lost record's number is a gap: it is missing
            if self._fd is None or not self._append(lines, *(str(record["kind"]) for record in records)):
                self.lost_records += len(records)
                self._unreported_losses += len(records)

    def _append(self, line: bytes, *kinds: str) -> bool:
        """Append whole lines (records of ``kinds``, counted once written), or leave the file as it was and say why."""
        fd = self._fd
        assert fd is not None, "written only while open"
        written = 0
        try:
            while written < len(line):
                written += os.write(fd, line[written:])
            self._written.update(kinds)
            return True
        except OSError as error:
            if written:
                try:
                    # a part of a line would glue onto the next record (one writer per file: the part is the tail)
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
                except OSError:
                    os.write(fd, b"\n")  # then at least end it: the reader skips it, nothing else
            self._warn(
                f"error {error.errno}",
                f"telemetry-jit: could not write to {self.path} ({error.strerror or error}); telemetry records are "
                "being lost and counted, training goes on. The count is written to the file once it can be.",
            )
            return False

    def _line(self, record: dict[str, Any]) -> bytes:
        """``record``'s line, numbered (under the lock: numbers follow the file's order)."""
        return self._stamped(_encode(record)[:-1])

    def _stamped(self, body: str) -> bytes:
        seq, self._seq = self._seq, self._seq + 1
        return f'{body},"{RecordKey.SEQ}":{seq}{self._stamp}'.encode()

    def _report_losses(self) -> bool:
        """Write the count of records lost since it was last written; whether none is left unwritten."""
        lost = self._unreported_losses
        if (
            lost
            and self._fd is not None
            and self._append(self._line({"kind": "records_lost", "count": lost}), "records_lost")
        ):
            self._unreported_losses = 0
        return not self._unreported_losses

    def _reopen_if_gone(self) -> None:
        """Open the file again where the path no longer leads to it; where that fails, hold no descriptor and
        count the records lost until it works."""
        fd = self._fd
        if fd is not None:
            try:
                now_at_path = os.stat(self.path)
                same = (now_at_path.st_dev, now_at_path.st_ino) == self._fd_file
            except OSError as error:
                same = error.errno not in (errno.ENOENT, errno.ENOTDIR)
            if same:
                return
            self._warn(
                "gone",
                f"telemetry-jit: {self.path} was deleted or moved while this run was writing it; "
                "the records that follow go to a new file at the same path.",
            )
            self._append(
                self._line({"kind": "moved_on", "detail": _MOVED_ON}), "moved_on"
            )  # the moved file's last word
            self._give_up_fd()
            self._next_reopen = 0.0
        if time.monotonic() < self._next_reopen:
            return
        try:
            self._open_file(self.path)
        except (OSError, ValueError) as error:
            self._next_reopen = time.monotonic() + _REOPEN_EVERY_S
            self._warn(
                "cannot reopen",
                f"telemetry-jit: cannot create {self.path} again ({getattr(error, 'strerror', None) or error}); "
                "telemetry records are being lost and counted, training goes on. The count is written to the file "
                "once it can be.",
            )
            return
        self._append(self._line({**_RUN_START, "continues": _CONTINUES}), "run_start")

    def _open_file(self, path: Path) -> None:
        assert self._fd is None, "one descriptor at a time"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open(path)
        opened = os.fstat(fd)
        self._fd, self._fd_file = fd, (opened.st_dev, opened.st_ino)

    def _warn(self, kind: str, message: str) -> None:
        self._notices.warn(kind, message, every_rank=True)

    def _follow_identity(self) -> None:
        """Move to this rank's file once the process learns its rank, taking this run's records along."""
        self._identity_version = self.identity.version
        me = self.identity.current()
        stamp = {RecordKey.WRITER: self.writer_id, "run": self.run_id, **asdict(me), "pid": os.getpid()}
        self._stamp = "," + _encode(stamp)[1:] + "\n"
        target = rank_file(self.base_path, me.rank, me.world_size)
        with self._lock:
            if target == self.path or not self.ready:
                return
            self._give_up_fd()
            source, self.path = self.path, target
            try:
                if self._created and not target.exists():
                    os.replace(source, target)
                else:
                    marker = _encode({"run": self.run_id})[1:-1].encode()  # "run":"<id>" as the records write it
                    with open(source, "rb") as old, open(target, "ab") as new:
                        new.writelines(line for line in old if marker in line)
            except OSError as error:
                self._warn(
                    "cannot move",
                    f"telemetry-jit: could not move this run's records from {source} to {target} ({error}); "
                    "what follows goes to the rank file.",
                )
            try:
                self._open_file(target)
            except (OSError, ValueError):
                self._next_reopen = 0.0  # the next record tries again, and counts what it loses meanwhile


def _open(path: Path) -> int:
    # never through a link planted at the path while the run writes (the last part only); never blocking on
    # a FIFO planted there (O_NONBLOCK), and only a regular file is kept
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{str(path)!r} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holds_telemetry(path: Path) -> bool:
    """Whether ``path`` is empty or opens with a telemetry-jit record (the file policy: append only there)."""
    with path.open("rb") as handle:
        first = handle.readline(4096)
    if not first.strip():
        return True
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") == "run_start" and record.get("format") == FILE_FORMAT


def _parent_id(span: Span) -> str | None:
    return _id_text(span.parent_span.id) if span.parent_span is not None else None


def _span_record(
    span_id: str, parent_id: str | None, name: str, start_unix_ns: int, end_unix_ns: int, attributes: Any
) -> dict[str, Any]:
    return {
        "kind": "span",
        "span_id": span_id,
        "parent_id": parent_id,
        "name": name,
        "start_unix_ns": start_unix_ns,
        "end_unix_ns": end_unix_ns,
        "attributes": attributes,
    }


def _event_record(kind: str, span_id: str, name: str, time_unix_ns: int, attributes: Any) -> dict[str, Any]:
    return {"kind": kind, "span_id": span_id, "name": name, "time_unix_ns": time_unix_ns, "attributes": attributes}


def _nv_span_record(span: Span) -> dict[str, Any]:
    start, stop = unix_ns(span.start_event.timestamp), unix_ns(span.stop_event.timestamp)
    return _span_record(_id_text(span.id), _parent_id(span), span.name_str, start, stop, span.attributes.to_json())


def _nv_event_record(kind: str, event: Event, span: Span) -> dict[str, Any]:
    return _event_record(kind, _id_text(span.id), event.name_str, unix_ns(event.timestamp), event.attributes.to_json())


def _check_writable(path: Path) -> None:
    if path.is_symlink():
        raise ValueError(
            f"FileExporter path {str(path)!r} is a symbolic link: telemetry-jit writes only to a regular file, so that "
            "a link cannot send its records into another file. Pass the file itself (a folder on the way may be one)."
        )
    if path.exists() and not path.is_file():  # a FIFO would block the open, a device is no file to append to
        example = path / "telemetry.jsonl" if path.is_dir() else "runs/telemetry.jsonl"
        raise ValueError(
            f"FileExporter path {str(path)!r} is a {_file_type(path)}, not a regular file: telemetry-jit appends "
            f"only to a regular file (it does not open this one). Pass a file path such as {str(example)!r}."
        )
    if path.exists():
        if not os.access(path, os.W_OK):
            raise PermissionError(
                f"FileExporter cannot write to {str(path)!r}: permission denied. Choose a writable path."
            )
        if not _holds_telemetry(path):
            raise ValueError(
                f"FileExporter path {str(path)!r} is a file that telemetry-jit did not write (its first line is not a "
                "telemetry-jit record), so nothing is appended to it. Choose another path, or move that file away."
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


def _file_type(path: Path) -> str:
    names = {stat.S_IFDIR: "directory", stat.S_IFIFO: "FIFO (named pipe)", stat.S_IFSOCK: "socket"}
    names |= {stat.S_IFCHR: "device", stat.S_IFBLK: "device"}
    return names.get(stat.S_IFMT(path.stat().st_mode), "special file")
