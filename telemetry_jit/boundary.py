"""The one guard between training and what telemetry runs. Every call into code telemetry does not own goes
through a :class:`CallSite`, declared once in :data:`SITES` (where the fault-injection tests find it): what it
raises is counted and said once, never reaching training. Telemetry's own hooks are guarded by :func:`guarded`
at :data:`OWN_CODE` (a :class:`SettingError` is the user's to fix, and raised)."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from telemetry_jit.notices import Notices
from telemetry_jit.redaction import scrub
from telemetry_jit.terminal import error_text

T = TypeVar("T")
P = ParamSpec("P")


class _Failed:
    def __repr__(self) -> str:
        return "FAILED"

    def __bool__(self) -> bool:
        return False


FAILED: Any = _Failed()


class InjectedFault(RuntimeError):
    """Raised by a fault a test injects at a call site (tests/faults.py)."""


class SettingError(ValueError):
    """A setting of the user's that cannot mean anything, found inside a hook: raised through the guard."""


@dataclass(eq=False)
class CallSite:
    """One place where telemetry calls code it does not own: ``name`` dotted and unique, ``callee`` in words,
    ``bound`` what bounds its time off the training thread (``""``: on the caller's, so a test cannot hang it),
    ``fault`` a test's (tests/faults.py)."""

    name: str
    callee: str = field(repr=False)
    bound: str = field(default="", repr=False)
    fault: Callable[[Callable[..., Any]], Callable[..., Any]] | None = field(default=None, repr=False)

    def call(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)``, or :data:`FAILED` (said once, counted) when it raises."""
        if self.fault is not None:
            function = self.fault(function)
        try:
            return function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the point of the guard
            self.failed(error, function)
            return FAILED

    def failed(self, error: BaseException, function: object = None) -> None:
        """Count a failure of the callee caught elsewhere (a worker thread); say the first."""
        _account.failed(self, error, function)

    def bind(self, function: Callable[..., T]) -> Callable[..., T]:
        """``function`` for a caller that guards each call itself (a Python call less than :meth:`call`, every
        step); the faulty callee while a test injects a fault here."""
        return self.fault(function) if self.fault is not None else function


class Account:
    """One session's failures by call site, the first of each said once (with its other :attr:`notices`)."""

    def __init__(self) -> None:
        self.notices = Notices()  # the session's warnings: each said once per session
        self._failed: dict[str, tuple[int, str]] = {}  # site name -> (failures, first error)
        self._lock = threading.Lock()  # worker threads (exporters, the rank watch) fail too

    def failed(self, site: CallSite, error: BaseException, function: object = None) -> None:
        with self._lock:
            count, first_error = self._failed.get(site.name, (0, scrub(error_text(error))[:500]))  # the file keeps it
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

    def by_site(self) -> dict[str, dict[str, object]]:
        """``{name: {"callee": ..., "count": ..., "first_error": ...}}`` for the telemetry file's account."""
        with self._lock:
            failed = dict(self._failed)
        return {
            name: {"callee": SITES[name].callee, "count": count, "first_error": first_error}
            for name, (count, first_error) in failed.items()
        }


# process-wide: sites are declared at import, and the account they count into is the running session's
# (nv-one-logger runs one session per process; count_into switches it)
SITES: dict[str, CallSite] = {}
_account = Account()


def call_site(name: str, callee: str, bound: str = "") -> CallSite:
    """Declare a call site (declaring a name again returns the same site)."""
    site = SITES.get(name)
    if site is None:
        site = SITES[name] = CallSite(name, callee, bound)
    return site


def count_into(account: Account) -> None:
    global _account
    _account = account


OWN_CODE = call_site(
    "telemetry.own_code",
    "telemetry-jit's own code (a bug: please report it; TELEMETRY_JIT_STRICT=1 raises it, with its traceback)",
)


def own_code_failed(error: Exception, function: object) -> None:
    """``error`` raised in telemetry's own ``function``: said once and counted; raised again where the user must
    fix it (:class:`SettingError`) or ``TELEMETRY_JIT_STRICT=1`` asks for telemetry's bugs (an injected fault
    aside)."""
    strict = os.environ.get("TELEMETRY_JIT_STRICT", "") == "1" and not isinstance(error, InjectedFault)
    if strict or isinstance(error, SettingError):
        raise error
    OWN_CODE.failed(error, function)


def guards_itself(function: Callable[P, T]) -> Callable[P, T]:
    """Mark a per-step hook that catches its own errors: :func:`guarded` leaves it as it is (a call less)."""
    function.guards_itself = True  # type: ignore[attr-defined]
    return function


def guarded(function: Callable[P, T]) -> Callable[P, T | None]:
    """Telemetry's own ``function`` as training may call it: what it raises goes to :func:`own_code_failed`
    (returning ``None``); a fault injected at :data:`OWN_CODE` is bound here, once."""
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
