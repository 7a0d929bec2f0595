"""The one guard between training and what telemetry runs: the code telemetry calls but does not own,
and telemetry's own hooks.

Every call telemetry makes into someone else's code (a Lightning logger, the OpenTelemetry SDK,
nv-one-logger, an exporter, a callback the user handed over, torch's private hooks, thunder) goes
through a :class:`CallSite`. A call that raises is caught, counted and said once on stderr, naming the
callee and the reason; it never reaches training. Each site is declared once, at import, in one
registry (:data:`SITES`): the fault-injection tests find every site there, so a new one is tested the
day it is written. Telemetry's own code, where training calls it (a Lightning hook, a loop's ``step``),
is guarded by :func:`guarded` and :func:`own_code_failed` at site :data:`OWN_CODE`: a bug of telemetry's is
said and counted, never the end of the run (a :class:`SettingError` is the user's to fix, and raised).

Example::

    LOG_METRICS = call_site("logger.log_metrics", "a Lightning logger's log_metrics")
    if LOG_METRICS.call(logger.log_metrics, metrics, step=3) is FAILED:
        ...  # said once, counted; training goes on
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

from telemetry_jit.notices import Notices
from telemetry_jit.terminal import error_text

T = TypeVar("T")
P = ParamSpec("P")


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


class SettingError(ValueError):
    """A setting of the user's that cannot mean anything, found where recording starts (inside a hook):
    raised to the user on purpose, through the guard around telemetry's own code."""


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
        self._fault: _Fault | None = None
        self.fault_hits = 0  # calls the last injected fault met

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
        _account.failed(self, error, function)

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


class Account:
    """What telemetry could not do in one session: each call site's failures, the first of each said once
    (with the session's other warnings, in :attr:`notices`). A :class:`~telemetry_jit.session.Session` owns one."""

    def __init__(self) -> None:
        self.notices = Notices()  # the session's warnings: each said once per session
        self._failed: dict[str, tuple[int, str]] = {}  # site name -> (failures, first error)
        self._lock = threading.Lock()  # worker threads (exporters, the rank watch) fail too

    def failed(self, site: CallSite, error: BaseException, function: object = None) -> None:
        with self._lock:
            count, first_error = self._failed.get(site.name, (0, error_text(error)[:500]))
            self._failed[site.name] = (count + 1, first_error)
        if count == 0:
            name = ".".join(str(getattr(function, "__qualname__", "")).split(".")[-2:])
            where = f" in {name}" if name and "<lambda>" not in name else ""
            self.notices.warn(
                site.name,
                f"telemetry-jit: {site.callee} failed{where} ({first_error}); telemetry goes on without it and "
                "training is not affected. Later failures here are counted, not shown (the summary lists them).",
                every_rank=True,
                origin="telemetry-jit:0",
            )

    def failures(self) -> dict[str, tuple[int, str]]:
        """``site name -> (failures, first error)`` for every site that failed."""
        with self._lock:
            return dict(self._failed)

    def by_site(self) -> dict[str, dict[str, object]]:
        """Every site that failed, for the telemetry file's account:
        ``{name: {"callee": ..., "count": ..., "first_error": ...}}``."""
        return {
            name: {"callee": SITES[name].callee, "count": count, "first_error": first_error}
            for name, (count, first_error) in self.failures().items()
        }


# process-wide: sites are declared at import, and the account they count into is the running session's
# (nv-one-logger runs one session per process; count_into switches it)
SITES: dict[str, CallSite] = {}
_account = Account()


def call_site(name: str, callee: str, bound: str = "") -> CallSite:
    """Declare a call site (once per name; declaring it again returns the same site)."""
    site = SITES.get(name)
    if site is None:
        site = SITES[name] = CallSite(name, callee, bound)
    return site


def count_into(account: Account) -> None:
    """Count failures into ``account`` from now on (a new session's)."""
    global _account
    _account = account


def failures() -> dict[str, tuple[int, str]]:
    """``site name -> (failures, first error)`` for every site that failed in the running session."""
    return _account.failures()


def forget() -> None:
    """Start counting afresh, into an account of no session, and say each failure again."""
    count_into(Account())


OWN_CODE = call_site(
    "telemetry.own_code",
    "telemetry-jit's own code (a bug: please report it; TELEMETRY_JIT_STRICT=1 raises it, with its traceback)",
)


def own_code_failed(error: Exception, function: object) -> None:
    """``error`` raised in telemetry's own ``function``, caught where training called it: said once and
    counted, or raised again where it is the user's to fix (a :class:`SettingError`) or where
    ``TELEMETRY_JIT_STRICT=1`` asks for telemetry's bugs (telemetry-jit's own tests; an injected fault is
    the test's and still caught). Call it in an ``except Exception as error:`` block."""
    strict = os.environ.get("TELEMETRY_JIT_STRICT", "") == "1" and not isinstance(error, InjectedFault)
    if strict or isinstance(error, SettingError):
        raise error
    OWN_CODE.failed(error, function)


def guards_itself(function: Callable[P, T]) -> Callable[P, T]:
    """Mark a hook of telemetry's that runs every step and catches what its body can raise itself:
    :func:`guarded` hands it over as it is (a guard's call would cost a Python call more every step)."""
    function.guards_itself = True  # type: ignore[attr-defined]
    return function


def guarded(function: Callable[P, T]) -> Callable[P, T | None]:
    """``function``, telemetry's own, as training may call it: what it raises goes to :func:`own_code_failed`
    (it returns ``None`` then). The faulty function instead while a test injects a fault at :data:`OWN_CODE`
    (bound here, once: the call stays a plain call); a function marked :func:`guards_itself` as it is."""
    if getattr(function, "guards_itself", False):
        return function
    call = OWN_CODE.bind(function)

    @functools.wraps(function)
    def guarded_call(*args: P.args, **kwargs: P.kwargs) -> T | None:
        try:
            return call(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the point of the guard
            own_code_failed(error, function)
            return None

    return guarded_call


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
