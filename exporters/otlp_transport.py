"""Getting OTLP data to the collector: one builder for the trace and metric exporters of either
protocol, re-sending what a failed export carried, counting what was delivered, and stopping within a
bound whatever the collector does."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .otlp_settings import OTLPSettings

Signal = Literal["traces", "metrics"]
# the loggers through which OpenTelemetry reports a failing collector, once per batch
OTEL_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics._internal.export",
)


def _exporter_class(settings: OTLPSettings, signal: Signal) -> type[Any]:
    """OpenTelemetry's exporter class for ``signal`` over the settings' protocol, imported when first built."""
    if settings.protocol == "grpc":
        if signal == "traces":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

            return GrpcSpans
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        return GrpcMetrics
    if signal == "traces":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

        return HttpSpans
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

    return HttpMetrics


def _build(settings: OTLPSettings, signal: Signal) -> Any:
    """OpenTelemetry's OTLP exporter for ``signal``, as the settings say: one builder for both signals
    and both protocols."""
    exporter_class = _exporter_class(settings, signal)
    common = {
        "endpoint": settings.endpoint if signal == "traces" else settings.metrics_endpoint,
        "headers": dict(settings.headers) or None,
        "timeout": settings.timeout_s,
    }
    if settings.protocol == "grpc":
        return exporter_class(insecure=settings.insecure, credentials=_grpc_credentials(settings), **common)
    return exporter_class(
        certificate_file=settings.certificate_file, session=_session_trusting_the_given_certificate(), **common
    )


def span_exporter(settings: OTLPSettings) -> SpanExporter:
    exporter: SpanExporter = _build(settings, "traces")
    return exporter


def metric_exporter(settings: OTLPSettings) -> MetricExporter:
    exporter: MetricExporter = _build(settings, "metrics")
    return exporter


def _grpc_credentials(settings: OTLPSettings) -> Any:
    if not settings.certificate_file:
        return None
    import grpc

    with open(settings.certificate_file, "rb") as handle:
        return grpc.ssl_channel_credentials(handle.read())


def _session_trusting_the_given_certificate() -> Any:
    """A requests session on which the collector's CA file (``certificate_file`` or
    ``OTEL_EXPORTER_OTLP_CERTIFICATE``) is the one trusted.

    requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``, set on many machines, override the CA
    file OTel puts on its session, so a collector with its own certificate could never be reached.
    """
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            settings = super().merge_environment_settings(*args, **kwargs)
            if isinstance(self.verify, str):
                settings["verify"] = self.verify
            return settings

    return Session()


class OnceFilter(logging.Filter):
    """Lets OpenTelemetry's first failure line through, and none after it: an unreachable collector
    is one problem however many exporters (traces, metrics) and retries meet it; the exporter's own
    warning at close says what was not delivered."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if self.said:
            return False
        self.said = True
        return True


class RetryingSpanExporter(SpanExporter):
    """Keeps what a failed export carried (newest first, bounded) and sends it with the next batch;
    counts what the collector accepted."""

    def __init__(self, inner: SpanExporter, capacity: int) -> None:
        self.inner = inner
        self.capacity = capacity
        self.pending: deque[ReadableSpan] = deque()
        self.delivered = 0
        self.failures = 0
        self._counting = True
        self._lock = threading.Lock()

    def stop_counting(self) -> None:
        """Given up on: a delivery that still completes in the background is not counted."""
        with self._lock:
            self._counting = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            batch = [*self.pending, *spans]
            self.pending.clear()
        try:
            result = self.inner.export(batch)
        except Exception:  # noqa: BLE001 - a broken transport is a failed export, not a crash
            result = SpanExportResult.FAILURE
        with self._lock:
            if not self._counting:
                return result
            if result is SpanExportResult.SUCCESS:
                self.delivered += len(batch)
            else:
                self.failures += 1
                self.pending.extend(batch[-self.capacity :] if self.capacity else [])
        return result

    def shutdown(self) -> None:
        with self._lock:
            left, self.pending = list(self.pending), deque()
        if left:
            try:
                delivered = self.inner.export(left) is SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001
                delivered = False
            with self._lock:
                if self._counting and delivered:
                    self.delivered += len(left)
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def bounded(calls: Sequence[Callable[[], Any]], seconds: float) -> list[bool]:
    """Run each call on its own thread, together, and wait at most ``seconds`` in all: for each,
    whether it finished (True) or still runs (False)."""
    deadline = time.monotonic() + seconds
    finished = []
    for call in calls:
        done = threading.Event()

        def run(call: Callable[[], Any] = call, done: threading.Event = done) -> None:
            try:
                call()
            finally:
                done.set()

        threading.Thread(target=run, name="telemetry-jit-otlp-flush", daemon=True).start()
        finished.append(done)
    return [done.wait(max(deadline - time.monotonic(), 0)) for done in finished]
