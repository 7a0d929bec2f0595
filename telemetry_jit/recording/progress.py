"""A compile still running, said every so often: a cold inductor compile can run for minutes, and a line at its
start and one at its end leave the time between silent (and a hung compile indistinguishable from a slow one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from telemetry_jit.compat import compile_timers

PROGRESS_EVERY_S = 30.0

Said = Callable[[str, float, str], None]  # (what compiles, seconds so far, torch's phase now)


class CompileProgress:
    """Between :meth:`start` and :meth:`stop` of one compile, calls ``said`` every ``every_s`` seconds from a
    timer thread; never after :meth:`stop` has returned."""

    def __init__(self, said: Said, every_s: float | None = None) -> None:
        self._said = said
        self._every_s = every_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._what = ""
        self._started = 0.0
        self._phase: Callable[[], str] = lambda: ""

    def start(self, what: str) -> None:
        """A compile began, on this thread (the one whose phases are read)."""
        self.stop()
        with self._lock:
            self._what, self._started, self._phase = what, time.perf_counter(), compile_timers.phase_reader()
            self._schedule()

    def stop(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _schedule(self) -> None:
        every_s = self._every_s if self._every_s is not None else PROGRESS_EVERY_S
        self._timer = threading.Timer(every_s, self._tick)
        self._timer.daemon = True
        self._timer.start()

    def _tick(self) -> None:
        with self._lock:  # held while saying it: stop() returns only after a tick under way has been said
            if self._timer is None or threading.current_thread() is not self._timer:
                return  # stopped, or a newer compile's timer runs
            self._said(self._what, time.perf_counter() - self._started, self._phase())
            self._schedule()
