"""The only files telemetry-jit writes: a regular file it creates (exclusively), or one it wrote before (its own
header first). Never a link (``O_NOFOLLOW`` at every open for writing), a device, a FIFO, a socket, a directory or
a file of the user's; what lies at a path is looked at (``lstat``) before anything is opened, so a FIFO is never
waited on and a device never opened. Shared by both halves: the run file's exporter and the CLI's outputs.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HEAD_BYTES = 4096  # how much of a file is read to tell whether telemetry-jit wrote it
_NEVER_THROUGH = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class OwnKind:
    """One kind of file telemetry-jit writes, known by how it begins."""

    name: str  # "telemetry file", "report", "trace": said in a refusal
    begins: Callable[[bytes], bool]  # whether a file's first HEAD_BYTES bytes (fewer for a short file) are its header


class NotOurs(ValueError):
    """``path`` holds something telemetry-jit does not write to (``what``: in words); nothing was written there."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what
        super().__init__(f"{str(path)!r} is {what}")


def what_lies_at(path: Path) -> str | None:
    """``None`` where nothing lies at ``path``, else what does, in words (a link is not followed)."""
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file on the way: creating it will say so)
        return None
    return _words(path, found)


def refusal(path: Path, kind: OwnKind) -> NotOurs | None:
    """Why telemetry-jit may not write ``path`` (``None``: nothing lies there, or its own ``kind`` of file does);
    nothing but a regular file is opened to find out, and that only to read its head."""
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file on the way: creating it will say so)
        return None
    if not stat.S_ISREG(found.st_mode):
        return NotOurs(path, _words(path, found))
    try:
        fd = os.open(path, os.O_RDONLY | _NEVER_THROUGH)
    except OSError:
        now = what_lies_at(path)  # a link or another thing put there since the lstat (ELOOP): said as it is
        if now is None:
            return None
        if now != "a regular file":
            return NotOurs(path, now)
        raise
    try:
        return None if _is_ours(fd, found, kind) else NotOurs(path, _not_ours(kind))
    finally:
        os.close(fd)


def open_to_append(path: Path, kind: OwnKind) -> tuple[int, bool]:
    """A blocking descriptor (read and append) on ``path``: a file created exclusively there, or the one there when
    it is telemetry-jit's own ``kind``; and whether it was created. Raises :class:`NotOurs` for anything else."""
    flags = os.O_RDWR | os.O_APPEND | _NEVER_THROUGH
    for _ in range(3):  # a file removed between the two tries: try again
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
            os.set_blocking(fd, True)
            return fd, True
        except FileExistsError:
            pass
        try:
            return _open_own(path, flags, kind), False
        except FileNotFoundError:
            continue
    raise FileExistsError(f"{str(path)!r} keeps appearing and disappearing; it was not written")


def replace_whole(path: Path, data: bytes, kind: OwnKind) -> None:
    """Write ``path`` whole or not at all: a temporary file created exclusively beside it (no name another user could
    plant a link at), renamed over ``path`` only where nothing or telemetry-jit's own ``kind`` of file lies there.
    Raises :class:`NotOurs` before writing anything where something else does."""
    refused = refusal(path, kind)
    if refused is not None:
        raise refused
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NEVER_THROUGH, 0o666)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        refused = refusal(path, kind)  # looked at again as late as can be: what was planted while it wrote
        if refused is not None:
            raise refused
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _open_own(path: Path, flags: int, kind: OwnKind) -> int:
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):
        raise NotOurs(path, _words(path, found))
    try:
        fd = os.open(path, flags)
    except OSError as error:
        now = what_lies_at(path)
        if now is not None and now != "a regular file":  # a link planted since the lstat (ELOOP)
            raise NotOurs(path, now) from error
        raise
    try:
        if not _is_ours(fd, found, kind):
            raise NotOurs(path, _not_ours(kind) if stat.S_ISREG(os.fstat(fd).st_mode) else "no longer a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_ours(fd: int, expected: os.stat_result, kind: OwnKind) -> bool:
    """Whether ``fd`` is the regular file ``lstat`` saw (not one swapped in since), empty or begun by ``kind``."""
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (expected.st_dev, expected.st_ino):
        return False
    head = os.pread(fd, HEAD_BYTES, 0)
    return not head or kind.begins(head)


def _not_ours(kind: OwnKind) -> str:
    return f"a file that telemetry-jit did not write (it does not begin as a telemetry-jit {kind.name} does)"


def _words(path: Path, found: os.stat_result) -> str:
    mode = found.st_mode
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r}"
        except OSError:
            return "a symbolic link"
    names = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket"}
    names |= {stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFREG: "a regular file"}
    what = names.get(stat.S_IFMT(mode), "a special file")
    return what if what == "a regular file" else f"{what}, not a regular file"
