"""What the host says about this process and its children: CPU time, anonymous resident memory, the memory it may use
(Linux ``/proc`` and cgroups; elsewhere every reading is ``None`` or empty). Nothing here resets a peak counter
(``VmHWM``, torch's ``max_memory_allocated``): a user's own figure would shrink."""

from __future__ import annotations

import os
import re
import resource
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

MEMORY_LIMIT_VARIABLE = "TELEMETRY_JIT_MEMORY_LIMIT"  # bytes, or 512M, 8G, 2GiB: overrides what the host says
COMPILE_WORKER = b"compile_worker"  # in the command line of inductor's worker pool (torch._inductor.compile_worker)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNLIMITED = 1 << 60  # cgroup v1 says "no limit" as a number near 2**63
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
ON_LINUX = sys.platform.startswith("linux") and Path("/proc/self/stat").exists()


@dataclass(frozen=True)
class Child:
    """A process below this one, as ``/proc/<pid>/stat`` and ``statm`` say."""

    pid: int
    parent: int
    cpu_s: float  # with its reaped children's
    held_bytes: int  # its anonymous resident memory (see own_memory)
    started: int  # in clock ticks since boot
    image: tuple[int, int, int]  # where its code starts and ends and its stack starts: exec makes new ones, fork not


_statm: tuple[int, int] | None = None  # (pid, descriptor): /proc/self/statm kept open, read with pread


def own_memory() -> tuple[int, int, int]:
    """This process's anonymous resident bytes, its resident bytes, and its peak resident bytes so far (``statm``;
    ``ru_maxrss``, which is ``VmHWM``); zeros where unknown.

    Anonymous: resident less what ``statm`` calls shared (file-backed pages, the libraries mapped, and shared
    memory). Those are the kernel's page cache, shared with every process mapping the same files and reclaimable;
    summed resident memory counts them once per process. The anonymous pages are what only RAM can hold, and
    what the kernel's proportional set size (PSS) counts in full for a process that shares none with another."""
    global _statm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:  # a forked child reads its own
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC))
        fields = os.pread(_statm[1], 128, 0).split()
        resident, shared = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0, 0, peak
    return max(resident - shared, 0), resident, peak


def own_held() -> int:
    """This process's anonymous resident bytes (``statm`` kept open: a read costs a microsecond, opening tens)."""
    return own_memory()[0]


def image(pid: int) -> tuple[int, int, int] | None:
    """Where ``pid``'s code starts and ends and its stack starts (``stat``'s ``startcode``, ``endcode``,
    ``startstack``): a child forked and not exec'd has its parent's, an exec gives new ones (the kernel places
    each image anew); ``None`` when it is gone, zeros where the kernel does not say."""
    found = _stat(pid)
    return found.image if found is not None else None


def own_cpu() -> tuple[float, float, int]:
    """CPU seconds of this process and of its reaped children, and the largest reaped child's peak resident bytes.
    The process's own from ``process_time()``: ``os.times()`` counts 10 ms ticks, and read a 14 ms compile as 0."""
    times = os.times()
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return time.process_time(), times.children_user + times.children_system, largest


def child(pid: int) -> Child | None:
    """``pid``'s figures, or ``None`` when it is gone."""
    found = _stat(pid)
    if found is None:
        return None
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            fields = statm.read().split()
        held = max(int(fields[1]) - int(fields[2]), 0) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
    return replace(found, held_bytes=held)


def _stat(pid: int) -> Child | None:
    """``pid``'s ``stat`` alone (``held_bytes`` 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
        fields = text[text.rindex(b")") + 2 :].split()
        cpu = sum(int(fields[index]) for index in (11, 12, 13, 14)) / _TICKS
        image = (int(fields[23]), int(fields[24]), int(fields[25]))
        return Child(pid, int(fields[1]), cpu, 0, int(fields[19]), image)
    except (OSError, ValueError, IndexError):
        return None


class ChildWatch:
    """The processes below this one: :meth:`update` lists ``/proc``, reads only new ones (no ``children`` lists)."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.below: dict[int, Child] = {}
        self._seen: set[int] = set()

    def update(self) -> dict[int, Child]:
        if os.getpid() != self.root:  # forked: another tree
            self.root, self.below, self._seen = os.getpid(), {}, set()
        try:
            now = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        except OSError:
            return self.below
        new = [c for pid in sorted(now - self._seen) if (c := _stat(pid)) is not None]
        self._seen = now
        self.below = {pid: c for pid, c in self.below.items() if pid in now}
        while True:  # a new process below a new process: until nothing more joins
            joined = {c.pid: c for c in new if c.pid not in self.below and c.parent in (self.root, *self.below)}
            if not joined:
                return self.below
            self.below.update({pid: child(pid) or c for pid, c in joined.items()})  # its memory too


def command_line(pid: int) -> bytes:
    """``pid``'s command line (first 4 KB; ``b""`` when gone): a forked compile worker keeps its parent's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read(4096)
    except OSError:
        return b""


def clock_ticks() -> int:
    """Now, in the clock ticks since boot that a process's start time is counted in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS)


def memory_limit() -> tuple[int, str]:
    """The memory this process may use and what says so: ``TELEMETRY_JIT_MEMORY_LIMIT``, else the tightest
    cgroup limit up to the root, else the machine's memory; ``(0, "")`` where none can be read."""
    given = os.environ.get(MEMORY_LIMIT_VARIABLE, "").strip()
    if given:  # 8G, 512MiB, 1000000: K, M, G, T are powers of 1024
        size = _SIZE.fullmatch(given)
        if size is None:
            raise ValueError(
                f"{MEMORY_LIMIT_VARIABLE}={given!r} is not a size: give bytes or a number with K, M, G or T (e.g. 8G); "
                "or unset it"
            )
        unit = size.group(2).lower()
        return int(float(size.group(1)) * 1024 ** ("kmgt".index(unit) + 1 if unit else 0)), MEMORY_LIMIT_VARIABLE
    limits = [(limit, where) for limit, where in _cgroup_limits() if 0 < limit < _UNLIMITED]
    if limits:
        return min(limits)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "the machine's memory"
    except (ValueError, OSError, AttributeError):
        return 0, ""


def _cgroup_limits() -> list[tuple[int, str]]:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        roots: tuple[str, ...]
        if controllers == "":
            roots, name = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"), "memory.max"
        elif "memory" in controllers.split(","):
            roots, name = ("/sys/fs/cgroup/memory",), "memory.limit_in_bytes"
        else:
            continue
        for root in roots:
            leaf = Path(root + path)
            for folder in [leaf, *leaf.parents]:
                if not folder.is_relative_to(root):
                    break
                try:
                    text = (folder / name).read_text().strip()
                except OSError:
                    text = ""
                if text.isdigit():
                    found.append((int(text), f"the cgroup's {name} ({folder / name})"))
    return found


def cuda_memory() -> tuple[int, int] | None:
    """torch's CUDA bytes allocated now and at peak where CUDA is in use (never initialised for this); else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001 - a device that cannot say costs the figure, not the compile
        return None


def compile_threads() -> int | None:
    """inductor's compile workers (``TORCHINDUCTOR_COMPILE_THREADS``), where inductor is loaded."""
    config = sys.modules.get("torch._inductor.config")
    threads = getattr(config, "compile_threads", None)
    return threads if isinstance(threads, int) else None
