"""Getting OTLP data to the collector: OpenTelemetry's exporters built and checked, what a failed export carried
sent again, what was delivered counted, and every stop bounded whatever the collector does."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from telemetry_jit.boundary import FAILED, call_site

from .otlp_settings import (
    CHECKED_BY_THE_EXPORTERS,
    DEFAULT_MAX_REQUEST_BYTES,
    OTLPSettings,
    OTLPSettingsError,
    Signal,
    invalid_variable,
    sdk_said,
)

_SEND = call_site(
    "otlp.send",
    "sending spans to the OTLP collector",
    bound="the batch processor's thread; the export timeout at close",
)
_SIZE = call_site(
    "otlp.size", "measuring an OTLP request (OpenTelemetry's encoder)", bound="the batch processor's thread"
)

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


_CLASSES = {"traces": ("trace_exporter", "OTLPSpanExporter"), "metrics": ("metric_exporter", "OTLPMetricExporter")}


# where OpenTelemetry's exporters warn of a setting they will not use, as they are built (then use their default)
_SETTINGS_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder",
    "opentelemetry.exporter.otlp.common._aggregation",
)


def checked_exporters(settings: OTLPSettings) -> dict[str, Any]:
    """OpenTelemetry's exporters, built now: a variable they read themselves and would refuse mid-run or replace by
    a default (compression, temporality) is warned of before training, naming it, and left to its default (one
    they raise for is hidden from them); a protocol not installed is refused."""
    signals: tuple[Signal, ...] = ("traces", "metrics") if settings.metrics else ("traces",)
    built: dict[str, Any] = {}
    hidden = list(settings.ignored)
    for signal in signals:
        for _ in range(len(CHECKED_BY_THE_EXPORTERS) + 1):  # each try hides one more variable it raised for
            with sdk_said(*_SETTINGS_LOGGERS) as said:
                try:
                    built[signal] = build_exporter(settings, signal, hidden)
                    raised = False
                except OTLPSettingsError:
                    raise
                except Exception as error:  # noqa: BLE001 - whatever the SDK raises, the user needs the setting
                    said.append(f"{type(error).__name__}: {error}")
                    raised = True
            named = [_named(settings, objection) for objection in said]
            for variable in filter(None, named):
                invalid_variable(
                    variable,
                    f"{variable}={os.environ[variable].strip()!r}: OpenTelemetry's exporter cannot use it "
                    f"({settings.scrub(said[named.index(variable)])})",
                    "OpenTelemetry's",
                )
            if not raised:
                break
            newly = [variable for variable in named if variable and variable not in hidden]
            if not newly:
                objection = settings.scrub(said[-1])
                raise OTLPSettingsError(f"The OTLP settings: OpenTelemetry's exporter raised ({objection}).")
            hidden.extend(newly)
    return built


def _named(settings: OTLPSettings, objection: str) -> str | None:
    """The variable an objection of OpenTelemetry's exporter is about (by its name, or its value)."""
    objection = settings.scrub(objection)
    for name in CHECKED_BY_THE_EXPORTERS:
        value = os.environ.get(name, "").strip()
        if value and (name in objection or value.lower() in objection.lower()):
            return name
    return None


@contextlib.contextmanager
def _hidden(variables: Sequence[str]) -> Iterator[None]:
    """``variables`` out of the environment meanwhile: OpenTelemetry's exporter reads them as it is built, and
    would raise for (or trust) a value the settings replaced by its default."""
    saved = {name: os.environ.pop(name) for name in variables if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def build_exporter(settings: OTLPSettings, signal: Signal, hidden: Sequence[str] = ()) -> Any:
    """OpenTelemetry's OTLP exporter (a ``SpanExporter`` or ``MetricExporter``) for ``signal``, as the settings say."""
    target = settings.targets[signal]
    module, name = _CLASSES[signal]  # imported when first built
    package = f"opentelemetry.exporter.otlp.proto.{target.protocol.removesuffix('/protobuf')}"  # .grpc, .http
    try:
        with _grpc_core_quiet() if target.protocol == "grpc" else contextlib.nullcontext():
            exporter_class = getattr(importlib.import_module(f"{package}.{module}"), name)
    except ImportError:
        raise OTLPSettingsError(
            f"OTLP over {target.protocol} needs {package.replace('.', '-')}, which is not installed here: "
            "pip install 'telemetry-jit[otlp]' (the file exporter needs none of it)."
        ) from None
    common = {"endpoint": target.endpoint, "headers": dict(target.headers) or None, "timeout": target.timeout_s}
    certificate = settings.options.certificate_file
    # given no headers, OpenTelemetry's exporter parses the headers variables itself: its parser is not let print one
    with sdk_said("opentelemetry.util.re"), _hidden([*settings.ignored, *hidden]):
        if target.protocol == "grpc":
            return exporter_class(
                insecure=settings.options.insecure, credentials=_grpc_credentials(certificate), **common
            )
        return exporter_class(certificate_file=certificate, session=_session_trusting_the_given_certificate(), **common)


@contextlib.contextmanager
def _grpc_core_quiet() -> Iterator[None]:
    """gRPC's C core writes its own lines straight to stderr (a TLS handshake that failed, at INFO, once a retry),
    past Python's logging and so past what this exporter says once in its own words. It reads ``GRPC_VERBOSITY`` once,
    as ``grpc`` is first imported, for the whole process (no channel has a level of its own): set to ``ERROR`` for
    that import alone, unless the user set it or ``grpc`` is already imported (then it is theirs), and removed after,
    so processes started later inherit the user's environment. gRPC's errors still reach stderr."""
    if "grpc" in sys.modules or "GRPC_VERBOSITY" in os.environ:
        yield
        return
    os.environ["GRPC_VERBOSITY"] = "ERROR"
    try:
        yield
    finally:
        os.environ.pop("GRPC_VERBOSITY", None)


class CountingMetricExporter(MetricExporter):
    """OpenTelemetry's metric exporter, its exports counted and a failure said through ``on_failure`` (the SDK's
    reader only logs it, and a backend that takes traces only refuses every metrics request)."""

    def __init__(self, inner: MetricExporter, on_failure: Callable[[str], None]) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality, preferred_aggregation=inner._preferred_aggregation
        )
        self.inner = inner
        self.on_failure = on_failure
        self.exports = 0
        self.failures = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.exports += 1
        reason = ""
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as error:  # noqa: BLE001 - the reader would only log it
            result, reason = MetricExportResult.FAILURE, f"{type(error).__name__}: {error}"
        if result is not MetricExportResult.SUCCESS:
            self.failures += 1
            self.on_failure(reason)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _grpc_credentials(certificate_file: str | None) -> Any:
    if not certificate_file:
        return None
    import grpc

    with open(certificate_file, "rb") as handle:
        return grpc.ssl_channel_credentials(handle.read())


def _session_trusting_the_given_certificate() -> Any:
    """A requests session on which the collector's CA file (``certificate_file`` or ``..._CERTIFICATE``) is the
    one trusted: requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``, set on many machines, override it."""
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            settings = super().merge_environment_settings(*args, **kwargs)
            if isinstance(self.verify, str):
                settings["verify"] = self.verify
            return settings

    return Session()


# OpenTelemetry's gRPC exporter logs both signals under one logger, naming the signal ("Failed to export metrics to
# <endpoint>"): matched by those words, not by "metric" anywhere, which an endpoint's host may hold for spans too
_ABOUT_METRICS = re.compile(r"\bexport(?:ing)? metrics\b", re.IGNORECASE)


# how OpenTelemetry's batch processor says its queue (OTEL_BSP_MAX_QUEUE_SIZE) dropped a span as it ended
_QUEUE_FULL = ("Queue full", "Queue is full")


class FailureTap(logging.Filter):
    """Keeps OpenTelemetry's failure lines off the console (the exporter says it once) and remembers the first, for
    that message, and the last, to tell "too large" from "down"."""

    def __init__(self) -> None:
        super().__init__()
        self.first_reason = ""
        self.last_reason = ""
        self.metrics_reason = ""  # the last about metrics: their exports run on a thread of their own
        self.queue_full = False  # the batch processor's queue dropped a span: not the collector's doing

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        reason = record.getMessage().strip().split("\n", 1)[0][:300]
        if reason.startswith(_QUEUE_FULL):
            self.queue_full = True
            return False
        if "metric" in record.name or _ABOUT_METRICS.search(reason):
            self.metrics_reason = reason
            return False
        self.first_reason = self.first_reason or reason
        self.last_reason = reason
        return False


# how gRPC (RESOURCE_EXHAUSTED: "received message larger than max") and HTTP (413) receivers refuse a request
_TOO_LARGE = ("RESOURCE_EXHAUSTED", "larger than max", " 413", "Too Large", "exceeds max_request_size")


def request_bytes(spans: Sequence[ReadableSpan]) -> int:
    """The size of the OTLP request that carries ``spans`` (protobuf, before compression)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return int(encode_spans(spans).ByteSize())


class RetryingSpanExporter(SpanExporter):
    """Sends each batch in requests a receiver accepts, and never lets a backlog jam delivery.

    OpenTelemetry's exporter retries one request within its timeout; this keeps what a longer outage failed (the
    newest ``capacity`` spans) for after the next batch, in requests of at most ``max_batch`` spans and ``max_bytes``
    bytes. A request refused while others pass (or as too large) is halved; a span no request takes is dropped and
    counted. A failure halves the next requests (logging may be silenced); each delivery doubles them again."""

    def __init__(
        self,
        inner: SpanExporter,
        capacity: int,
        on_failure: Callable[[], None] = lambda: None,
        *,
        tap: FailureTap,
        max_batch: int = 512,
        max_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        on_refused: Callable[[str], None] = lambda what: None,
    ) -> None:
        self.inner = inner
        self.capacity = capacity
        self.on_failure = on_failure
        self.on_refused = on_refused
        self.max_batch = max(max_batch, 1)
        self._request_spans = self.max_batch  # at most this many spans a request, for now
        self.max_bytes = max_bytes
        self.tap = tap
        self.pending: deque[ReadableSpan] = deque(maxlen=capacity)  # the oldest go first
        self.delivered = 0
        self.resent = 0  # of ``delivered``: spans a failed export had kept
        self.refused = 0  # spans dropped as too large for any request
        self.overflowed = 0  # spans dropped because the backlog was full
        self.failures = 0
        self.taken = 0  # spans the batch processor handed over (those its queue dropped never are)
        self._counting = True
        self._lock = threading.Lock()

    def stop_counting(self) -> None:
        """Given up on: a delivery that still completes in the background is not counted."""
        with self._lock:
            self._counting = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            backlog = list(self.pending)
            self.pending.clear()
            self.taken += len(spans)
        kept: dict[bool, list[ReadableSpan]] = {True: [], False: []}  # by resent: older spans first
        receiver_up = False
        # each run is cut into requests only as they are sent: requests shrunk by an outage grow back as soon as
        # the receiver takes them again, and a backlog goes in a few requests, not hundreds
        for run, resent in ((list(spans), False), (backlog, True)):
            while run:
                if not receiver_up and (kept[True] or kept[False]):  # down: the rest waits, no timeout spent on it
                    kept[resent].extend(run)
                    break
                count = self._fitting(run)
                request, run = run[:count], run[max(count, 1) :]  # none fits: its first span was refused
                if not request:
                    continue
                sent, too_large = self._send(request)
                if sent:
                    receiver_up = True
                    self._request_spans = min(self._request_spans * 2, self.max_batch)
                    self._count(request, resent)
                    continue
                self._request_spans = max(count // 2, 1)
                if (receiver_up or too_large) and count > 1:
                    run = request + run  # sent again in halves
                elif receiver_up or too_large:
                    self._refuse(request, "the receiver refused it while it accepted others")
                else:
                    kept[resent].extend(request)
        if kept[True] or kept[False]:
            self._keep(kept[True] + kept[False])
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _fitting(self, spans: list[ReadableSpan]) -> int:
        """How many of ``spans`` the next request takes within both bounds (0: the first alone is too large, and
        is refused). Every request is measured before it is sent (about 65 µs a span, on the batch processor's
        thread): a receiver's limit is met before the fact, not learnt from a refusal."""
        count = min(self._request_spans, len(spans))
        while True:
            size = _SIZE.call(request_bytes, spans[:count]) if self.max_bytes else 0
            if size is FAILED or size <= self.max_bytes:
                return count
            if count == 1:
                self._refuse(spans[:1], f"{size} bytes alone, over the request limit of {self.max_bytes}")
                return 0
            count //= 2

    def _send(self, spans: list[ReadableSpan]) -> tuple[bool, bool]:
        """Whether the receiver took ``spans``, and whether it refused them as too large."""
        self.tap.last_reason = ""
        result = _SEND.call(self.inner.export, spans)
        if result is SpanExportResult.SUCCESS:
            return True, False
        with self._lock:
            self.failures += 1
        self.on_failure()
        return False, any(mark in self.tap.last_reason for mark in _TOO_LARGE)

    def _count(self, spans: list[ReadableSpan], resent: bool) -> None:
        with self._lock:
            if self._counting:
                self.delivered += len(spans)
                self.resent += len(spans) if resent else 0

    def _keep(self, spans: list[ReadableSpan]) -> None:
        with self._lock:
            if not self._counting:
                return
            self.overflowed += max(len(self.pending) + len(spans) - self.capacity, 0)
            self.pending.extend(spans)

    def _refuse(self, spans: list[ReadableSpan], why: str) -> None:
        with self._lock:
            self.refused += len(spans)
        self.on_refused(f"a span ({spans[0].name!r}) could not be sent: {why}")

    def shutdown(self) -> None:
        self.export([])  # the backlog's last chance, as after any batch
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def bounded(calls: Sequence[Callable[[], Any]], seconds: float) -> list[bool]:
    """Run each call on its own thread and wait at most ``seconds`` in all: for each, whether it finished."""
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=call, name="telemetry-jit-otlp-flush", daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    return [not thread.is_alive() for thread in threads]
