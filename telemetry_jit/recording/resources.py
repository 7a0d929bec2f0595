"""What each compilation costs the host: CPU seconds (this process, inductor's compile workers and the compilers
it starts) and the memory it holds (anonymous resident memory: docs/telemetry.md, "Resources"), with a warning
while a compile nears the memory the process may use.

Only while a compile runs: torch's compile callbacks open and close a window (a few reads of ``/proc``), and a
sampler thread, asleep between compiles, reads memory and looks for new children. Nothing runs per step."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from telemetry_jit.compat import host
from telemetry_jit.notices import NOWHERE, Notices, warn_once
from telemetry_jit.records import NEAR_LIMIT_SHARE, CompileResources, near_limit_words

TICK_S = 0.05  # resident memory read this often while a compile runs
SCAN_EVERY = 5  # ticks between looks for new child processes (compilers live about a second)


@dataclass
class _Window:
    """One compile's readings at its start, and what the sampler saw since."""

    cpu: float
    reaped_cpu: float
    largest_reaped: int
    held: int  # this process's anonymous resident bytes
    hwm: int  # and its peak resident bytes (VmHWM)
    started: int  # clock ticks since boot
    children_cpu: dict[int, float]
    base: int  # anonymous resident bytes of this process and its counted children at the start
    cuda: tuple[int, int] | None
    peak_tree: int  # the highest readings since: of this process and its counted children, and of it alone
    peak_own: int
    counted: dict[int, host.Child]  # the children that compile for it, by pid


class ResourceMeter:
    """Measures compile windows; warns (once a run, on every rank: each host has its own memory) when a compile's
    host peak reaches :data:`~telemetry_jit.records.NEAR_LIMIT_SHARE` of the memory the process may use."""

    def __init__(self) -> None:
        self.enabled = host.ON_LINUX
        self._notices = Notices()
        self._limit, self._limit_source = (0, "")
        self._watch = host.ChildWatch()
        self._workers: dict[int, bool] = {}  # child pid -> whether it is one of inductor's compile workers
        # a child forked from its parent and not exec'd (inductor's pool forks its workers from one process, or
        # from this one): its image and anonymous resident bytes when first seen, pages it shares with its parent
        # (counted there); forgotten if it execs (a child seen between its fork and its exec is its parent's copy)
        self._shared: dict[int, tuple[tuple[int, int, int], int]] = {}
        self._image: tuple[int, int, int] | None = None  # this process's
        self._open: _Window | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()  # the running sampler's: set, it ends

    def start(self) -> None:
        """A run begins: the memory limit is read (a malformed ``TELEMETRY_JIT_MEMORY_LIMIT`` raises here, before
        training), the children alive now are noted."""
        if not self.enabled:
            return
        self._limit, self._limit_source = host.memory_limit()
        self._notices.forget()
        self._watch = host.ChildWatch()
        self._image = host.image(self._watch.root)
        self._note_children(self._watch.update())

    def begin(self) -> _Window | None:
        """A compile starts (inside torch's callback: cheap, never raises)."""
        if not self.enabled:
            return None
        try:
            cpu, reaped, largest = host.own_cpu()
            held, _, hwm = host.own_memory()
            workers = [pid for pid, worker in list(self._workers.items()) if worker]  # the sampler may be adding
            children = [c for pid in workers if (c := host.child(pid)) is not None]
            base = held + sum(self._held(c) for c in children)
            window = _Window(
                cpu=cpu,
                reaped_cpu=reaped,
                largest_reaped=largest,
                held=held,
                hwm=hwm,
                started=host.clock_ticks(),
                children_cpu={c.pid: c.cpu_s for c in children},
                base=base,
                cuda=host.cuda_memory(),
                peak_tree=base,
                peak_own=held,
                counted={c.pid: c for c in children},
            )
        except Exception as error:  # noqa: BLE001 - a reading that fails costs the figure, never the compile
            _failed(error)
            return None
        with self._lock:
            self._open = window
        self._ensure_sampler()
        self._wake.set()
        return window

    def end(self, window: _Window | None) -> CompileResources | None:
        """The compile ends: what it cost, from ``begin``'s readings, the sampler's and these."""
        with self._lock:
            if self._open is window:
                self._open = None
        if window is None:
            return None
        try:
            resources = self._measure(window)
        except Exception as error:  # noqa: BLE001
            _failed(error)
            return None
        if resources.near_limit:
            self._say_near_limit(resources.host_rss_bytes)
        return resources

    def stop(self) -> None:
        """The run ends: the sampler thread ends too (the next :meth:`begin` starts another)."""
        self._stop.set()
        self._wake.set()
        self._thread = None

    def _measure(self, window: _Window) -> CompileResources:
        cpu, reaped, largest = host.own_cpu()
        held, rss, hwm = host.own_memory()
        children = {pid: c for pid in list(window.counted) if (c := host.child(pid)) is not None}
        children_cpu = sum(max(c.cpu_s - window.children_cpu.get(pid, 0.0), 0.0) for pid, c in children.items())
        worker_cpu = max(reaped - window.reaped_cpu, 0.0) + children_cpu
        # this process's own peak: where it set a new high (VmHWM rose), that high less the file-backed pages it
        # maps now (a compile grows anonymous memory); else the highest reading
        own_peak = max(hwm - (rss - held), window.peak_own, held) if hwm > window.hwm else max(window.peak_own, held)
        children_now = sum(self._held(c) for c in children.values())
        # A compiler reaped within the window peaked at the largest reaped child's figure where that grew; but the
        # kernel's figure starts from the image a child was forked from (kept at its exec: this whole process's
        # resident memory), so only one above this process's own peak is a compiler's own.
        reaped_peak = largest if largest > max(window.largest_reaped, hwm) else 0
        peak = max(window.peak_tree, own_peak + children_now, max(window.held, held) + reaped_peak)
        device = None
        cuda = host.cuda_memory()
        if window.cuda is not None and cuda is not None and cuda[1] > window.cuda[1]:
            device = cuda[1] - window.cuda[0]
        return CompileResources(
            cpu_s=max(cpu - window.cpu, 0.0) + worker_cpu,
            worker_cpu_s=worker_cpu,
            host_peak_bytes=max(peak - window.base, 0),
            host_rss_bytes=peak,
            device_peak_bytes=device,
            limit_bytes=self._limit,
            limit_source=self._limit_source,
        )

    # -- the sampler, awake only while a compile runs --------------------------------------------
    def _ensure_sampler(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._sample, args=(self._stop,), name="telemetry-jit-compile-resources", daemon=True
            )
            self._thread.start()

    def _sample(self, stop: threading.Event) -> None:
        tick, last = 0, None
        while not stop.is_set():  # stop() sets it before waking the thread: seen whichever way the wake went
            self._wake.wait()
            time.sleep(TICK_S)  # a compile shorter than a tick costs only its start and end readings
            with self._lock:
                window = self._open
            if window is None:
                self._wake.clear()
                with self._lock:  # a compile may have begun between the look and the clear
                    if self._open is not None:
                        self._wake.set()
                continue
            if window is not last:
                tick, last = 0, window
            try:
                if tick % SCAN_EVERY == 0:
                    self._scan(window)
                self._read(window)
            except Exception as error:  # noqa: BLE001 - the sampler must never die of a reading
                _failed(error)
            tick += 1

    def _scan(self, window: _Window) -> None:
        """Count the children that compile for this window: inductor's workers (and what they start), and every
        process born since the compile began (the compilers inductor starts); not a DataLoader's workers."""
        below = self._watch.update()
        self._note_children(below)
        for pid, found in below.items():
            if pid not in window.counted and (self._counts(pid, below) or found.started >= window.started):
                window.counted[pid] = found
                window.children_cpu.setdefault(pid, 0.0)

    def _counts(self, pid: int, below: dict[int, host.Child]) -> bool:
        while pid in below:
            if self._workers.get(pid):
                return True
            pid = below[pid].parent
        return False

    def _note_children(self, below: dict[int, host.Child]) -> None:
        for pid, found in below.items():
            if pid not in self._workers:
                self._workers[pid] = host.COMPILE_WORKER in host.command_line(pid)
                # forked, not exec'd: its parent's image as it is now (a parent first seen between its own fork
                # and exec had its parent's image then, and its command line)
                parent = self._image if found.parent == self._watch.root else host.image(found.parent)
                if any(found.image) and found.image == parent:
                    self._shared[pid] = (found.image, found.held_bytes)
        for pid in [pid for pid in self._workers if pid not in below]:
            del self._workers[pid]
            self._shared.pop(pid, None)

    def _held(self, found: host.Child) -> int:
        """The anonymous resident bytes a child holds of its own: a forked child's above what it had when first
        seen (its parent's pages, counted there: summed, forked workers would count them once per worker)."""
        image, first = self._shared.get(found.pid, (found.image, 0))
        if image != found.image:  # exec'd since: what it holds now is all its own
            self._shared.pop(found.pid, None)
            first = 0
        return max(found.held_bytes - first, 0)

    def _read(self, window: _Window) -> None:
        own = host.own_held()
        tree = own
        for pid, known in list(window.counted.items()):
            found = host.child(pid)
            if found is None or found.started != known.started:  # gone (its CPU is its reaper's), or the pid reused
                del window.counted[pid]
                continue
            window.counted[pid] = found
            tree += self._held(found)
        window.peak_own = max(window.peak_own, own)
        window.peak_tree = max(window.peak_tree, tree)
        if self._limit and tree >= NEAR_LIMIT_SHARE * self._limit:
            self._say_near_limit(tree)  # said now, while it compiles: the process may not live to its end

    def _say_near_limit(self, peak: int) -> None:
        message = "telemetry-jit: " + near_limit_words(peak, self._limit, self._limit_source, host.compile_threads())
        self._notices.warn("near memory limit", message, every_rank=True, origin=NOWHERE)


def _failed(error: Exception) -> None:
    warn_once(
        "compile resources failed",
        f"telemetry-jit: measuring a compile's CPU and memory failed ({error!r}); compiles are recorded without "
        "them, training goes on.",
        every_rank=True,
    )
