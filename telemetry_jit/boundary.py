"""The one guard between telemetry and the code it calls but does not own.

Every call telemetry makes into someone else's code (a Lightning logger, the OpenTelemetry SDK,
nv-one-logger, an exporter, a callback the user handed over, torch's private hooks, thunder) goes
through a :class:`CallSite`. A call that raises is caught, counted and said once on stderr, naming the
callee and the reason; it never reaches training. Each site is declared once, at import, in one
registry (:data:`SITES`): the fault-injection tests find every site there, so a new one is tested the
day it is written.

Example::

    LOG_METRICS = call_site("logger.log_metrics", "a Lightning logger's log_metrics")
    if LOG_METRICS.call(logger.log_metrics, metrics, step=3) is FAILED:
        ...  # said once, counted; training goes on
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from telemetry_jit.notices import Notices
from telemetry_jit.terminal import error_text

T = TypeVar("T")


class _Failed:
    """What a guarded call returns when the callee raised."""

    def __repr__(self) -> str:
        return "FAILED"

    def __bool__(self) -> bool:
        return False


FAILED: Any = _Failed()
FaultKind = Literal["raise", "hang"]


class InjectedFault(RuntimeError):
    """The error a fault-injection test makes a callee raise."""


@dataclass
class _Fault:
    kind: FaultKind
    seconds: float
    hits: int = 0  # calls that met the fault: proof the site was reached

    def wrap(self, call: Callable[..., T]) -> Callable[..., T]:
        def faulty(*args: Any, **kwargs: Any) -> T:
            self.hits += 1
            if self.kind == "hang":
                time.sleep(self.seconds)
                return call(*args, **kwargs)
            raise InjectedFault("injected by a fault-injection test")

        return faulty


class CallSite:
    """One place where telemetry calls code it does not own.

    Args:
        name: dotted, unique (``"logger.log_metrics"``).
        callee: the code called, in words, for the message said when it fails.
        bound: what bounds the call's time when it runs off the training thread (``""``: it runs on
            the caller's thread, unbounded, so a test can make it raise but not hang).
    """

    def __init__(self, name: str, callee: str, bound: str = "") -> None:
        self.name = name
        self.callee = callee
        self.bound = bound
        self.failures = 0
        self.first_error = ""
        self._fault: _Fault | None = None
        self.fault_hits = 0  # calls the last injected fault met
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CallSite({self.name!r})"

    def call(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)``, or :data:`FAILED` (said once, counted) when it raises."""
        if self._fault is not None:
            function = self._fault.wrap(function)
        try:
            return function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the point of the guard
            self.failed(error, function)
            return FAILED

    def failed(self, error: BaseException, function: object = None) -> None:
        """Count a failure of the callee caught elsewhere (a worker thread, a finally block); say the first."""
        with self._lock:
            self.failures += 1
            first = self.failures == 1
            if first:
                self.first_error = error_text(error)[:500]
        if first:
            name = ".".join(str(getattr(function, "__qualname__", "")).split(".")[-2:])
            where = f" in {name}" if name and "<lambda>" not in name else ""
            _notices.warn(
                self.name,
                f"telemetry-jit: {self.callee} failed{where} ({self.first_error}); telemetry goes on without it and "
                "training is not affected. Later failures here are counted, not shown (the summary lists them).",
                every_rank=True,
                origin="telemetry-jit:0",
            )

    def wrap(self, function: Callable[..., T]) -> Callable[..., T]:
        """``function`` as a callable the fault injection can reach (for calls made by another thread's loop)."""

        def guarded(*args: Any, **kwargs: Any) -> T:
            call = self._fault.wrap(function) if self._fault is not None else function
            return call(*args, **kwargs)

        return guarded

    def bind(self, function: Callable[..., T]) -> Callable[..., T]:
        """``function`` for a caller that guards each call itself (``except Exception as error:
        site.failed(error, function)``) because it runs every step, where :meth:`call` costs a Python
        call more; the faulty callee instead while a test injects a fault here."""
        return self._fault.wrap(function) if self._fault is not None else function

    def reset(self) -> None:
        with self._lock:
            self.failures, self.first_error = 0, ""


_notices = Notices()
SITES: dict[str, CallSite] = {}


def call_site(name: str, callee: str, bound: str = "") -> CallSite:
    """Declare a call site (once per name; declaring it again returns the same site)."""
    site = SITES.get(name)
    if site is None:
        site = SITES[name] = CallSite(name, callee, bound)
    return site


def failures() -> dict[str, tuple[int, str]]:
    """``site name -> (failures, first error)`` for every site that failed in this process since the
    last :func:`forget`."""
    return {name: (site.failures, site.first_error) for name, site in SITES.items() if site.failures}


def account() -> dict[str, dict[str, object]]:
    """Every site that failed since the last :func:`forget`, for the telemetry file's account:
    ``{name: {"callee": ..., "count": ..., "first_error": ...}}``."""
    return {
        name: {"callee": site.callee, "count": site.failures, "first_error": site.first_error}
        for name, site in SITES.items()
        if site.failures
    }


def forget() -> None:
    """Start counting afresh (a new session in the same process) and say each failure again."""
    for site in SITES.values():
        site.reset()
    _notices.forget()


@contextlib.contextmanager
def injected(name: str, kind: FaultKind = "raise", seconds: float = 0.0) -> Iterator[CallSite]:
    """Make the callee of site ``name`` raise (or hang ``seconds`` first) while the block runs: for tests.

    Raises:
        KeyError: no such site.
    """
    site = SITES[name]
    site._fault = fault = _Fault(kind, seconds)
    try:
        yield site
    finally:
        site._fault = None
        site.fault_hits = fault.hits
