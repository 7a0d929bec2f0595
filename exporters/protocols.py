"""What an exporter can do beyond nv-one-logger's ``Exporter`` calls, declared (asked with ``isinstance``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from telemetry_jit.identity import IdentityTracker

    from .finished import FinishedSpan


@runtime_checkable
class TakesFinishedSpans(Protocol):
    """Takes a span recorded after it ended, with its events, in one call."""

    def export_finished_span(self, span: FinishedSpan) -> None: ...


@runtime_checkable
class NeverBlocks(Protocol):
    """Returns at once from every call, so it needs no thread of its own to keep training from waiting on it."""

    never_blocks: bool


@runtime_checkable
class RankAware(Protocol):
    """Puts this process's rank, world size and node on every record, from ``identity``."""

    identity: IdentityTracker


@runtime_checkable
class Flushes(Protocol):
    """Sends what it holds on request, within a bound; True when everything went out."""

    def force_flush(self, timeout_seconds: float | None = None) -> bool: ...


@runtime_checkable
class ReportsDelivery(Protocol):
    """Counts what it delivered and what it lost, for the session's account (``{"spans_dropped": 3, ...}``)."""

    def delivery(self) -> dict[str, int]: ...


@runtime_checkable
class SendsMetrics(Protocol):
    """Offers a MeterProvider whose metrics go where its spans go (``None`` when it sends none)."""

    @property
    def meter_provider(self) -> MeterProvider | None: ...
