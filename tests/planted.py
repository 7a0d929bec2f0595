"""Things a path can hold that telemetry-jit must never write to, planted in a test's own folder (never a real
/dev node): the checks of docs/reliability.md's file policy share them."""

from __future__ import annotations

import os
import signal
import socket
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _device(path: Path) -> None:
    """A node like /dev/null (major 1, minor 3): writing it is harmless, but it must stay a device."""
    if os.geteuid() != 0:
        pytest.skip("only root can plant a device node")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


# name: (plant it at the path, what a refusal says lies there); the victim is the user's file beside the path
PLANTED: dict[str, tuple[Callable[[Path], object], str]] = {
    "a link to the user's file": (lambda p: p.symlink_to(p.with_name("victim.txt")), "a symbolic link to '"),
    "a link to standard output": (lambda p: p.symlink_to("/proc/self/fd/1"), "a symbolic link to '/proc/self/fd/1'"),
    "a dangling link": (lambda p: p.symlink_to(p.with_name("nowhere")), "a symbolic link to '"),
    "a FIFO": (os.mkfifo, "a FIFO (named pipe), not a regular file"),
    "a device": (_device, "a device, not a regular file"),
    "a directory": (os.mkdir, "a directory, not a regular file"),
    "a user's file": (lambda p: p.write_bytes(b"my notes\n"), "a file that telemetry-jit did not write"),
    "a user's file with a blank first line": (
        lambda p: p.write_bytes(b"\nmy notes\n"),
        "a file that telemetry-jit did not write",
    ),
}
THINGS = [*PLANTED, "a socket"]


@contextmanager
def planted(path: Path, thing: str) -> Iterator[str]:
    """``thing`` at ``path`` (a victim file beside it) while in the block; yields what a refusal says lies there."""
    path.with_name("victim.txt").write_bytes(b"the user's own\n")
    if thing == "a socket":
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(str(path))
            yield "a socket, not a regular file"
        return
    plant, words = PLANTED[thing]
    plant(path)
    if thing != "a FIFO":
        yield words
        return

    def blocked(signum: int, frame: object) -> None:  # opening a FIFO waits for a reader forever: fail instead
        raise TimeoutError(f"{path} (a FIFO) was opened and blocked")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(60)
    try:
        yield words
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def as_it_was(path: Path) -> tuple[object, ...]:
    """What lies at ``path``, and the victim beside it: equal before and after means nothing was written."""
    found = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(found.st_mode) else None
    return (
        found.st_ino,
        found.st_mode,
        found.st_size,
        found.st_mtime_ns,
        content,
        path.with_name("victim.txt").read_bytes(),
    )
