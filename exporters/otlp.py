"""Export nv-one-logger spans to any OpenTelemetry backend over OTLP (gRPC or HTTP/protobuf).

Built on opentelemetry-sdk: a ``TracerProvider`` with a ``Resource`` and a batch processor, so
the training thread only queues spans; a background thread sends them. Each nv-one-logger span
becomes one OTel span with its original start and end, its parent (in one trace per
application), its attributes and its events as span events.

Why not ``nv-one-logger-otel``: it attaches OTel contexts it never detaches (so the user's own
OTel spans get re-parented under telemetry spans), sets no ``Resource`` (backends show
``unknown_service``), doubles every event as an extra zero-length span, and fails on a span whose
parent the export filter dropped. This exporter passes parent contexts explicitly instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
import socket
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any
from urllib.parse import urlparse

from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.exporter.exporter import BaseExporter
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Status, StatusCode
from typing_extensions import override

from .finished import FinishedSpan
from .identity import IdentityTracker, this_process
from .identity import run_id as job_run_id

PROTOCOLS = ("grpc", "http/protobuf")
_VERSIONED = ("torch", "lightning", "lightning-thunder", "nv-one-logger-training-telemetry", "telemetry-jit")
_OTEL_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
_log = logging.getLogger(__name__)


def parse_headers(text: str, source: str) -> dict[str, str]:
    """Parse ``key=value,key2=value2`` (the OTLP headers format)."""
    headers = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{source} is malformed: expected 'key=value,key2=value2' (values are not shown).")
        headers[key.strip().lower()] = value.strip()
    return headers


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


class _OnceFilter(logging.Filter):
    """Lets each distinct OTel warning through once: an unreachable collector costs one line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _RetryingSpanExporter(SpanExporter):
    """Keeps what a failed export carried (newest first, bounded) and sends it with the next batch."""

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


class _RunTraceIds(IdGenerator):
    """One trace per run: every rank's root span gets the trace id derived from the shared run id.

    Span ids come from a generator of our own: the SDK's default draws on the global ``random``
    module, whose state torch._dynamo saves and restores around every compilation, so spans
    created during compiles would get the same ids again and again.
    """

    def __init__(self, run_id: str) -> None:
        self._trace_id = int(hashlib.sha256(run_id.encode()).hexdigest()[:32], 16) or 1
        self._random = random.Random(os.urandom(16))

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._trace_id


class OTLPExporter(BaseExporter):
    """Send spans to an OTLP endpoint, and offer producers a :attr:`meter_provider` whose metrics go
    to the same collector. Arguments win over the standard ``OTEL_*`` variables.

    Args:
        endpoint: collector address; default ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, then
            ``OTEL_EXPORTER_OTLP_ENDPOINT`` (for HTTP with ``/v1/traces`` appended), then the
            OTLP default (``localhost:4317`` / ``http://localhost:4318/v1/traces``).
        protocol: ``"grpc"`` or ``"http/protobuf"``; default ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``,
            then ``OTEL_EXPORTER_OTLP_PROTOCOL``, then ``grpc``.
        headers: extra request headers (e.g. credentials), a dict or ``"k=v,k2=v2"``; default
            ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` / ``OTEL_EXPORTER_OTLP_HEADERS``. Never logged.
        service_name: ``service.name``; default ``OTEL_SERVICE_NAME``, then the application name
            when set up by ``telemetry_jit.configure``, then ``telemetry-jit``.
        timeout: seconds per export attempt; default ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10).
        insecure, certificate_file: TLS settings for gRPC; defaults from ``..._INSECURE`` /
            ``..._CERTIFICATE`` (read by the OTLP exporter itself).
        resource_attributes: merged into the Resource (as are ``OTEL_RESOURCE_ATTRIBUTES``).
        max_queue_size, schedule_delay_millis, max_export_batch_size, export_timeout_millis: the batch
            processor's settings; default ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_SCHEDULE_DELAY``,
            ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, ``OTEL_BSP_EXPORT_TIMEOUT``, then OTel's defaults. Spans
            beyond the queue are dropped and counted. The export timeout bounds :meth:`force_flush` and
            the wait at close (default: ``timeout``).
        retry_buffer_size: spans kept from failed exports and re-sent with the next batch.
        span_exporter: use this OTel ``SpanExporter`` instead of building one (tests, custom transports).
        metrics: also send metrics (``/v1/metrics`` over HTTP; ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
            when set), every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default 60 s) and at close; default
            on unless ``OTEL_METRICS_EXPORTER=none``.
        identity: where the rank, world size and node on every span come from (default: this
            process's, which the trainer updates).

    Example::

        provider.with_exporter(OTLPExporter("http://collector:4318/v1/traces", protocol="http/protobuf"))
    """

    def __init__(
        self,
        endpoint: str | None = None,
        protocol: str | None = None,
        headers: Mapping[str, str] | str | None = None,
        *,
        service_name: str | None = None,
        timeout: float | None = None,
        insecure: bool | None = None,
        certificate_file: str | None = None,
        resource_attributes: Mapping[str, Any] | None = None,
        max_queue_size: int | None = None,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
        export_timeout_millis: float | None = None,
        retry_buffer_size: int = 2048,
        span_exporter: SpanExporter | None = None,
        metrics: bool | None = None,
        identity: IdentityTracker | None = None,
    ) -> None:
        super().__init__()
        self.identity = identity or this_process
        self.protocol = (
            protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
        ).lower()
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"OTLP protocol {self.protocol!r} is not supported; use one of {list(PROTOCOLS)}.")
        self.endpoint = self._endpoint(endpoint)
        if isinstance(headers, str):
            headers = parse_headers(headers, "OTLPExporter(headers=...)")
        elif headers is None:
            for name in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
                if os.environ.get(name):
                    headers = parse_headers(os.environ[name], name)
                    break
        self._headers = dict(headers) if headers else None
        self.service_name = service_name or os.environ.get("OTEL_SERVICE_NAME")
        timeout_env = _env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        try:
            self.timeout = float(timeout if timeout is not None else timeout_env or 10.0)
        except ValueError:
            raise ValueError(f"OTEL_EXPORTER_OTLP_TIMEOUT must be a number of seconds, got {timeout_env!r}.") from None
        self._insecure = insecure
        self._certificate_file = certificate_file
        self._resource_attributes = dict(resource_attributes or {})
        # the batch processor's settings: arguments win, then OTEL_BSP_* (read by OTel itself), then its defaults
        self._batching = {
            name: value
            for name, value in (
                ("max_queue_size", max_queue_size),
                ("schedule_delay_millis", schedule_delay_millis),
                ("max_export_batch_size", max_export_batch_size),
                ("export_timeout_millis", export_timeout_millis),
            )
            if value is not None
        }
        bsp_timeout = export_timeout_millis if export_timeout_millis is not None else _env("OTEL_BSP_EXPORT_TIMEOUT")
        try:
            # OTel's batch processor does not use its export timeout; here it bounds a flush and the close
            self.flush_timeout = float(bsp_timeout) / 1000 if bsp_timeout is not None else self.timeout
        except ValueError:
            raise ValueError(f"OTEL_BSP_EXPORT_TIMEOUT must be milliseconds, got {bsp_timeout!r}.") from None
        self._provider: TracerProvider | None = None
        if metrics is None:
            metrics = os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none"
        self.metrics = metrics
        self._meter_provider: MeterProvider | None = None
        self._retry_buffer_size = retry_buffer_size
        self._span_exporter = span_exporter
        self._spans: dict[Any, trace.Span] = {}
        self._log_filter = _OnceFilter()
        self._ended = 0
        self.dropped = 0  # spans lost, known once the exporter is closed

    def arguments(self) -> dict[str, Any]:
        """What it takes to build this exporter again (in another process of the same job)."""
        return {
            "endpoint": self.endpoint,
            "protocol": self.protocol,
            "headers": self._headers,
            "timeout": self.timeout,
            "insecure": self._insecure,
            "certificate_file": self._certificate_file,
            "resource_attributes": self._resource_attributes,
            "metrics": self.metrics,
            **self._batching,
        }

    def __repr__(self) -> str:  # headers stay out of logs
        return f"OTLPExporter(endpoint={self.endpoint!r}, protocol={self.protocol!r})"

    def _endpoint(self, endpoint: str | None) -> str:
        if endpoint is None:
            endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            if endpoint is None and base:
                endpoint = base.rstrip("/") + "/v1/traces" if self.protocol == "http/protobuf" else base
        if endpoint is None:
            return "localhost:4317" if self.protocol == "grpc" else "http://localhost:4318/v1/traces"
        parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
        try:
            port_ok = parsed.port is None or 0 < parsed.port < 65536
        except ValueError:
            port_ok = False
        bad_scheme = self.protocol == "http/protobuf" and parsed.scheme not in ("http", "https")
        if not parsed.hostname or not port_ok or bad_scheme:
            example = "http://localhost:4318/v1/traces" if self.protocol == "http/protobuf" else "localhost:4317"
            raise ValueError(f"OTLP endpoint {endpoint!r} is malformed for {self.protocol}; expected e.g. {example!r}.")
        return endpoint

    def _build_span_exporter(self) -> SpanExporter:
        if self._span_exporter is not None:
            return self._span_exporter
        if self.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            return GrpcExporter(
                endpoint=self.endpoint,
                insecure=self._insecure,
                credentials=self._grpc_credentials(),
                headers=self._headers,
                timeout=self.timeout,
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(
            endpoint=self.endpoint,
            certificate_file=self._certificate_file,
            headers=self._headers,
            timeout=self.timeout,
            session=_session_trusting_the_given_certificate(),
        )

    def _build_metric_exporter(self) -> MetricExporter:
        if self.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

            return GrpcExporter(
                endpoint=os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or self.endpoint,
                insecure=self._insecure,
                credentials=self._grpc_credentials(),
                headers=self._headers,
                timeout=self.timeout,
            )
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        endpoint = self.endpoint.removesuffix("/v1/traces").rstrip("/") + "/v1/metrics"
        return HttpExporter(
            endpoint=os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or endpoint,
            certificate_file=self._certificate_file,
            headers=self._headers,
            timeout=self.timeout,
            session=_session_trusting_the_given_certificate(),
        )

    def _grpc_credentials(self) -> Any:
        if not self._certificate_file:
            return None
        import grpc

        with open(self._certificate_file, "rb") as handle:
            return grpc.ssl_channel_credentials(handle.read())

    def _resource(self) -> Resource:
        attributes: dict[str, Any] = {
            "service.name": self.service_name or _application_name() or "telemetry-jit",
            "service.instance.id": job_run_id(),
            "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
        }
        for package in _VERSIONED:
            with contextlib.suppress(metadata.PackageNotFoundError):
                attributes[f"version.{package}"] = metadata.version(package)
        attributes.update(self._resource_attributes)
        return Resource.create(attributes)

    @override
    def initialize(self) -> None:
        super().initialize()
        for name in _OTEL_LOGGERS:
            logging.getLogger(name).addFilter(self._log_filter)
        self._retrying = _RetryingSpanExporter(self._build_span_exporter(), self._retry_buffer_size)

    @functools.cached_property
    def _tracer(self) -> trace.Tracer:
        # built at the first span, not in initialize(): nv-one-logger initializes exporters before its
        # configuration (and so the application name for service.name) is in place
        self._provider = TracerProvider(
            resource=self._resource(),
            id_generator=_RunTraceIds(job_run_id()),
            shutdown_on_exit=False,  # close() shuts it down, bounded; OTel's own exit hook would wait unbounded
        )
        self._provider.add_span_processor(BatchSpanProcessor(self._retrying, **self._batching))
        return self._provider.get_tracer("telemetry_jit")

    @property
    def meter_provider(self) -> MeterProvider | None:
        """Metrics recorded here go to this exporter's collector (``None`` with ``metrics=False``).
        Built at first use, like the tracer, so that ``service.name`` is the application's."""
        if not self.metrics or not self.ready:
            return None
        if self._meter_provider is None:
            reader = PeriodicExportingMetricReader(self._build_metric_exporter())
            self._meter_provider = MeterProvider(
                resource=self._resource(), metric_readers=[reader], shutdown_on_exit=False
            )
        return self._meter_provider

    def force_flush(self, timeout_seconds: float | None = None) -> bool:
        """Send what is queued now; wait at most ``timeout_seconds`` (default: the flush timeout).
        True when everything queued was handed to the collector."""
        flushes = [p.force_flush for p in (self._provider, self._meter_provider) if p is not None]
        return all(_bounded(flushes, self.flush_timeout if timeout_seconds is None else timeout_seconds))

    @override
    def export_start(self, span: Span) -> None:
        super().export_start(span)
        self._spans[span.id] = self._tracer.start_span(
            span.name_str,
            context=self._parent_context(span.parent_span),
            start_time=_ns(span.start_event.timestamp),
            attributes=self._with_identity(span.attributes.to_json()),
        )

    def export_finished_span(self, span: FinishedSpan) -> None:
        """A span recorded after it ended: one OTel span, started and ended at once."""
        self._check_state()
        otel_span = self._tracer.start_span(
            span.name,
            context=self._parent_context(span.parent),
            start_time=span.start_unix_ns,
            attributes=self._with_identity(span.exported_attributes()),
        )
        for event in span.events:
            otel_span.add_event(event.name, _attributes(event.exported_attributes()), timestamp=event.time_unix_ns)
            if event.error:
                otel_span.set_status(Status(StatusCode.ERROR, event.message))
        otel_span.end(end_time=span.end_unix_ns)
        self._ended += 1

    def _with_identity(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """``attributes`` as OTel values, with this process's rank, world size and node."""
        return {**_attributes(attributes), **self.identity.current().as_attributes()}

    def _parent_context(self, parent: Span | None) -> Any:
        while parent is not None and parent.id not in self._spans:
            parent = parent.parent_span  # the export filter dropped it: hang under its nearest exported ancestor
        return trace.set_span_in_context(self._spans[parent.id]) if parent is not None else None

    @override
    def export_stop(self, span: Span) -> None:
        super().export_stop(span)
        otel_span = self._spans.pop(span.id, None)
        if otel_span is None:
            return
        # the rank may have become known while the span ran (rank 0 of a DDP launch learns it at fit)
        otel_span.set_attributes(self._with_identity(span.attributes.to_json()))
        stop_event = span.stop_event
        otel_span.end(end_time=_ns(stop_event.timestamp) if stop_event is not None else None)
        self._ended += 1

    @override
    def export_event(self, event: Event, span: Span) -> None:
        super().export_event(event, span)
        self._add_event(event, span)

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        super().export_error(event, span)
        otel_span = self._add_event(event, span)
        if otel_span is not None:
            otel_span.set_status(Status(StatusCode.ERROR, event.error_message))

    def _add_event(self, event: Event, span: Span) -> trace.Span | None:
        otel_span = self._spans.get(span.id)
        if otel_span is not None:
            otel_span.add_event(event.name_str, _attributes(event.attributes.to_json()), timestamp=_ns(event.timestamp))
        return otel_span

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        super().export_telemetry_data_error(error)
        span = self._tracer.start_span("telemetry_data_error", start_time=_ns(error.timestamp))
        span.set_status(Status(StatusCode.ERROR, error.error_message))
        span.add_event(error.name_str, _attributes(error.attributes.to_json()), timestamp=_ns(error.timestamp))
        span.end(end_time=_ns(error.timestamp))
        self._ended += 1

    @override
    def close(self) -> None:
        if not self.ready:
            return
        for otel_span in self._spans.values():
            otel_span.end()  # still open at application end: export what is known
            self._ended += 1
        self._spans.clear()
        # however much is pending and whatever the collector does (a black hole, 429s, resets), the
        # application's end waits one export timeout at most; what did not make it is counted below
        # the meter provider's last collection goes out now too, within the same bound
        shutdowns = [p.shutdown for p in (self._provider, self._meter_provider) if p is not None]
        finished = _bounded(shutdowns, self.flush_timeout)
        if self._provider is not None and not finished[0]:
            self._retrying.stop_counting()
        for name in _OTEL_LOGGERS:
            logging.getLogger(name).removeFilter(self._log_filter)
        self.dropped = self._ended - self._retrying.delivered
        if self.dropped:
            warnings.warn(
                f"{self!r}: {self.dropped} of {self._ended} spans could not be delivered "
                f"(collector unreachable, refusing or too slow; {self._retrying.failures} exports failed, "
                f"gave up after the export timeout of {self.flush_timeout:g} s at close).",
                RuntimeWarning,
                stacklevel=2,
            )
        super().close()

    @property
    def delivered(self) -> int:
        """Spans the backend accepted so far."""
        retrying = getattr(self, "_retrying", None)
        return retrying.delivered if retrying is not None else 0


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


def _bounded(calls: Sequence[Callable[[], Any]], seconds: float) -> list[bool]:
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


def _application_name() -> str | None:
    """The application name of nv-one-logger's configuration, when the exporter came through its builder API."""
    from nv_one_logger.api.one_logger_provider import OneLoggerProvider

    provider = OneLoggerProvider.instance()
    return provider.config.application_name if provider.one_logger_ready else None


def _ns(timestamp: TracingTimestamp) -> int:
    return round(timestamp.seconds_since_epoch * 1e9)


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values as OTel takes them (primitives and lists of one primitive type)."""
    converted: dict[str, Any] = {}
    for name, value in attributes.items():
        if isinstance(value, (str, bool, int, float)):
            converted[name] = value
        elif isinstance(value, (list, tuple)) and value and len({type(v) for v in value}) == 1:
            converted[name] = list(value) if isinstance(value[0], (str, bool, int, float)) else [str(v) for v in value]
        elif isinstance(value, (list, tuple)):
            converted[name] = [str(v) for v in value]
        elif value is not None:
            converted[name] = str(value)
    return converted
