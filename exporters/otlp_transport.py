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

from telemetry_jit.boundary import FAILED, call_site

from .otlp_settings import OTLPSettings

_SEND = call_site(
    "otlp.send",
    "sending spans to the OTLP collector",
    bound="the batch processor's thread; the export timeout at close",
)

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


def _exporter_class(protocol: str, signal: Signal) -> type[Any]:
    """OpenTelemetry's exporter class for ``signal`` over ``protocol``, imported when first built."""
    if protocol == "grpc":
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
    traces = signal == "traces"
    protocol = settings.protocol if traces else settings.metrics_protocol
    exporter_class = _exporter_class(protocol, signal)
    common = {
        "endpoint": settings.endpoint if traces else settings.metrics_endpoint,
        "headers": dict(settings.headers if traces else settings.metrics_headers) or None,
        "timeout": settings.timeout_s if traces else settings.metrics_timeout_s,
    }
    if protocol == "grpc":
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


class FailureTap(logging.Filter):
    """Keeps OpenTelemetry's own failure lines off the console (the exporter says once, in its own words,
    what failed and what it does about it) and remembers the first, for that message."""

    def __init__(self) -> None:
        super().__init__()
        self.first_reason = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if not self.first_reason:
            self.first_reason = record.getMessage().strip().split("\n", 1)[0][:300]
        return False


class RetryingSpanExporter(SpanExporter):
    """Keeps what a failed export carried (newest first, bounded) and sends it with the next batch;
    counts what the collector accepted."""

    def __init__(self, inner: SpanExporter, capacity: int, on_failure: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.capacity = capacity
        self.on_failure = on_failure
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
        result = _SEND.call(self.inner.export, batch)
        if result is FAILED:  # a broken transport is a failed export, not a crash
            result = SpanExportResult.FAILURE
        with self._lock:
            if not self._counting:
                return result
            if result is SpanExportResult.SUCCESS:
                self.delivered += len(batch)
            else:
                self.failures += 1
                self.pending.extend(batch[-self.capacity :] if self.capacity else [])
        if result is not SpanExportResult.SUCCESS and self.on_failure is not None:
            self.on_failure()
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
