"""A crash-safe JSON Lines exporter for nv-one-logger spans and events.

Each record is one line, one ``write(2)`` on an ``O_APPEND`` file: a process killed at any moment leaves lines that
all parse. A short or failed write is cut back off and counted (``records_lost``, written once writing works). A file
deleted or moved away mid-run is created again at the path, or beside it where something else was put there
(first record ``continues``; the moved one's last, ``moved_on``). The exporter owns its descriptor or holds none,
never a number it gave up. File policy (``owned_files``): create exclusively or append only to a file telemetry-jit
wrote, never through a link; each rank its own file (``name.rank<R>.jsonl``), which a process that learns its rank
late (rank 0 of a DDP launch) moves to, or, where something else lies there, stays out of. docs/telemetry.md and
docs/reliability.md say the rest.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
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
from telemetry_jit.owned_files import HEAD_BYTES, NotOurs, OwnKind, open_to_append, refusal
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
        try:
            self._created = self._open_file(self.path)
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
        except NotOurs as refused:  # planted at the path (a link, a device, a user's file): never written through,
            if not self._move_aside(refused):  # and the run's records go on, beside it
                return
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

    def _move_aside(self, refused: NotOurs) -> bool:
        """Go on in a file of this writer's own beside the path something else was put at (created exclusively:
        nothing planted is written through); whether it could."""
        aside = self.path.with_name(f"{self.path.stem}.{self.writer_id}{self.path.suffix}")
        try:
            self._open_file(aside)
        except (OSError, ValueError) as error:
            self._next_reopen = time.monotonic() + _REOPEN_EVERY_S
            self._warn(
                "cannot reopen",
                f"telemetry-jit: {refused}, and {aside} cannot be created ({getattr(error, 'strerror', None) or error})"
                "; telemetry records are being lost and counted, training goes on.",
            )
            return False
        self._warn(
            "moved aside",
            f"telemetry-jit: {refused}, put there while this run wrote it: nothing is written through it; the "
            f"run's records that follow go to {aside}.",
        )
        self.path = aside
        return True

    def _open_file(self, path: Path) -> bool:
        """Hold a descriptor on ``path``: a file created there, or this rank's own file there; whether created."""
        assert self._fd is None, "one descriptor at a time"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, created = open_to_append(path, TELEMETRY_FILE)
        self._hold(fd)
        return created

    def _hold(self, fd: int) -> None:
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
            source, source_file = self.path, self._fd_file
            try:
                fd, created = open_to_append(target, TELEMETRY_FILE)
            except (OSError, ValueError) as error:
                # nothing is lost: the records already written, and those to come, stay in the file it writes
                what = f"is {error.what}" if isinstance(error, NotOurs) else f"cannot be opened ({error})"
                self._warn(
                    "cannot move",
                    f"telemetry-jit: this rank's records stay in {source}, not in its rank file: {target} {what}; "
                    "telemetry-jit writes only to a file it created or wrote before.",
                )
                return
            alone = False  # whether the file it leaves held this run's records alone
            if self._fd is not None:
                try:
                    alone = _copy_run(self._fd, fd, _encode({"run": self.run_id})[1:-1].encode())
                except OSError as error:
                    _undo(target, fd, created)
                    self._warn(
                        "cannot move",
                        f"telemetry-jit: this rank's records stay in {source}: they could not be copied to its rank "
                        f"file {target} ({error.strerror or error}).",
                    )
                    return
            lost_before = self._fd is None  # the file it wrote was lost: its records are not in the rank file
            self._give_up_fd()
            self._hold(fd)
            if alone and self._created and _is_file(source, source_file):
                source.unlink()  # it created it and held this run's records alone, all now in the rank file
            self.path, self._created = target, created
            if lost_before and created:
                self._append(self._line({**_RUN_START, "continues": _CONTINUES}))


def _copy_run(source: int, target: int, marker: bytes) -> bool:
    """Append the whole lines of ``source`` holding ``marker`` (``"run":"<id>"`` as the records write it) to
    ``target``: all of them, or (an error raised) ``target`` as it was; whether every line of ``source`` held it."""
    before = os.fstat(target).st_size
    alone = True
    try:
        batch: list[bytes] = []
        for line in _whole_lines(source):
            if marker in line:
                batch.append(line)
            else:
                alone = False
            if len(batch) >= 1024:
                _write_all(target, b"".join(batch))
                batch.clear()
        _write_all(target, b"".join(batch))
    except OSError:
        os.ftruncate(target, before)
        raise
    return alone


def _whole_lines(fd: int) -> Iterator[bytes]:
    """The lines of ``fd`` ending in a newline (a part line, cut by a failed write, is no record), read at offsets."""
    offset, rest = 0, b""
    while chunk := os.pread(fd, 1 << 20, offset):
        offset += len(chunk)
        *whole, rest = (rest + chunk).split(b"\n")
        yield from (line + b"\n" for line in whole)


def _write_all(fd: int, data: bytes) -> None:
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])


def _undo(target: Path, fd: int, created: bool) -> None:
    """Give up ``fd`` on ``target``, removing the file where it was created for the move (and is still there)."""
    try:
        opened = os.fstat(fd)
        if created and _is_file(target, (opened.st_dev, opened.st_ino)):
            target.unlink()
    finally:
        os.close(fd)


def _is_file(path: Path, file: tuple[int, int]) -> bool:
    """Whether ``path`` is (not links to) the file ``(device, inode)``."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == file


def _begins_with_run_start(head: bytes) -> bool:
    """Whether a file's first line is a telemetry-jit ``run_start`` record (a blank line is not)."""
    first, newline, _ = head.partition(b"\n")
    if not newline and len(head) >= HEAD_BYTES:
        return False
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") == "run_start" and record.get("format") == FILE_FORMAT


TELEMETRY_FILE = OwnKind("telemetry file", _begins_with_run_start)


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
    refused = refusal(path, TELEMETRY_FILE)
    if refused is not None:
        if refused.what.startswith("a symbolic link"):
            advice = (
                "telemetry-jit writes only to a regular file, so that a link cannot send its records into another "
                "file. Pass the file itself (a folder on the way may be one)."
            )
        elif refused.what.startswith("a file that"):
            advice = "nothing is appended to it. Choose another path, or move that file away."
        else:  # a FIFO would block the open, a device is no file to append to
            example = path / "telemetry.jsonl" if path.is_dir() else "runs/telemetry.jsonl"
            advice = (
                "telemetry-jit appends only to a regular file (it does not open this one). Pass a file path such as "
                f"{str(example)!r}."
            )
        raise ValueError(f"FileExporter path {refused}: {advice}")
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
