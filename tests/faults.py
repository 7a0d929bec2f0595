"""Faults injected at telemetry's call sites (telemetry_jit.boundary.SITES): the callee raises, or hangs first."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

from telemetry_jit.boundary import SITES, CallSite, InjectedFault


class Fault:
    """Wraps the callee of one site; ``hits`` counts the calls that met it: proof the site was reached."""

    def __init__(self, kind: Literal["raise", "hang"], seconds: float) -> None:
        self.kind, self.seconds, self.hits = kind, seconds, 0

    def __call__(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            self.hits += 1
            if self.kind == "hang":
                time.sleep(self.seconds)
                return call(*args, **kwargs)
            raise InjectedFault("injected by a fault-injection test")

        return faulty


@contextlib.contextmanager
def injected(name: str, kind: Literal["raise", "hang"] = "raise", seconds: float = 0.0) -> Iterator[Fault]:
    """Make the callee of site ``name`` raise (or hang ``seconds`` first) while the block runs."""
    site: CallSite = SITES[name]
    site.fault = fault = Fault(kind, seconds)
    try:
        yield fault
    finally:
        site.fault = None
