"""Export nv-one-logger spans over OTLP (gRPC or HTTP/protobuf): one OTel span each, parents passed explicitly
(docs/exporters.md says why not ``nv-one-logger-otel``). Where to is :mod:`.otlp_settings`; how, :mod:`.otlp_transport`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import fields
from importlib import metadata
from typing import Any

from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import ProcessResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler, SamplingResult
from opentelemetry.trace import Status, StatusCode
from typing_extensions import override

from telemetry_jit.boundary import call_site
from telemetry_jit.identity import IdentityTracker
from telemetry_jit.identity import run_id as job_run_id
from telemetry_jit.notices import NOWHERE, Notices
from telemetry_jit.schema import OTEL_NAMESPACE, JitEventName, JitSpanName, otel_dropped, otel_name

from .finished import FinishedSpan, unix_ns
from .otlp_late import untap_when_exports_end
from .otlp_settings import (
    OTLPOptions,
    OTLPSettings,
    environment_resource_attributes,
    environment_service_name,
    redact_url,
    sdk_said,
    tap_sdk_loggers,
    untap_sdk_loggers,
)
from .otlp_transport import (
    OTEL_LOGGERS,
    CountingMetricExporter,
    FailureTap,
    RetryingSpanExporter,
    bounded,
    build_exporter,
    checked_exporters,
)

_SDK = call_site("opentelemetry.trace", "OpenTelemetry's tracer (OTLP export of a span)")
# installed distribution -> its resource key (telemetry_jit.version.*)
_VERSIONED = {
    "torch": "torch",
    "lightning": "lightning",
    "lightning-thunder": "thunder",
    "nv-one-logger-training-telemetry": "nv_one_logger",
    "telemetry-jit": "telemetry_jit",
}
SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"  # the semantic conventions the names follow
# spans every sampler keeps: a run compiles a few dozen times, and each compile is what the telemetry is for
ALWAYS_KEPT = frozenset(name.value for name in JitSpanName)
# on the link from a kept span to the parent the sampler left out: that parent's name
_LINKED_PARENT = "telemetry_jit.sampled_out_parent"
# at most this long (and half the export timeout) the root span waits, as the run ends, for the spans before it to
# be exported, so that their drops are known; close waits the rest of the one export timeout the end may cost
_ROOT_FLUSH_S = 2.0


def _through_the_sdk(method: Callable[..., None]) -> Callable[..., None]:
    """An exporter call, its state checked as ``BaseExporter`` does, whose OpenTelemetry part fails alone (said once
    and counted, never raised into training)."""

    @functools.wraps(method)
    def call(self: BaseExporter, *args: Any) -> None:
        self._check_state()
        _SDK.call(method, self, *args)

    return call


class KeepCompiles(Sampler):
    """The user's sampler (``OTEL_TRACES_SAMPLER``) for every span but compile spans, always kept. All ranks share
    one trace id, so a ratio keeps or drops a run's other spans together."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name in ALWAYS_KEPT:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"KeepCompiles{{{self.inner.get_description()}}}"


class _RunTraceIds(IdGenerator):
    """One trace per run (the trace id derived from the shared run id). Span ids from a generator of our own:
    torch._dynamo restores the global ``random`` (the SDK's default) around every compile, repeating ids."""

    def __init__(self, run_id: str) -> None:
        self._trace_id = int(hashlib.sha256(run_id.encode()).hexdigest()[:32], 16) or 1
        self._random = random.Random(os.urandom(16))

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._trace_id


class OTLPExporter(BaseExporter):
    """Send spans to an OTLP endpoint, and offer producers a :attr:`meter_provider` whose metrics go
    to the same collector. Arguments win over the standard ``OTEL_*`` variables, which win over
    OpenTelemetry's defaults: docs/exporters.md has the table (argument, variables, default) of each.

    Args:
        headers: never logged.
        retry_buffer_size: spans kept from failed exports and re-sent after the next batch.
        identity: where the rank, world size and node on every span come from (``configure`` shares one).
        span_exporter: use this OTel ``SpanExporter`` instead of building one (tests, custom transports).

    Raises:
        OTLPSettingsError: settings that could not send anything (a queue of 0, an endpoint that is no
            address), naming the argument or variable.

    Example::

        provider.with_exporter(OTLPExporter("http://collector:4318/v1/traces", protocol="http/protobuf"))
    """

    never_blocks = True

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
        max_request_bytes: int | None = None,
        metrics: bool | None = None,
        identity: IdentityTracker | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        super().__init__()
        arguments = locals()  # the options, each by its OTLPOptions name
        self.options = OTLPOptions(**{option.name: arguments[option.name] for option in fields(OTLPOptions)})
        self.settings = OTLPSettings.resolve(self.options)
        traces = self.settings.targets["traces"]
        self.endpoint: str = traces.endpoint
        self.protocol: str = traces.protocol
        self._exporters: dict[str, Any] = (
            checked_exporters(self.settings) if span_exporter is None else {"traces": span_exporter}
        )
        self._log_filter = FailureTap()
        self._retrying = RetryingSpanExporter(
            self._exporters["traces"],
            retry_buffer_size,
            on_failure=self._undelivered,
            max_batch=int(self.settings.batch["max_export_batch_size"]),
            max_bytes=self.settings.max_request_bytes,
            tap=self._log_filter,
            on_refused=self._refused,
        )
        self.identity = identity or IdentityTracker()
        self._provider: TracerProvider | None = None
        self._meter_provider: MeterProvider | None = None
        self._spans: dict[Any, trace.Span] = {}
        self._notices = Notices()
        self._ended = 0
        self._root: Any = None  # the application span's id: ended last, carrying the run's counts
        self._names: Counter[str] = Counter()  # spans sent, by name
        self._events: Counter[str] = Counter()  # events on the spans sent, by name
        self._flushed_s = 0.0  # of the application's end's one export timeout, what the root's flush took
        self._sampled_out = 0  # spans the user's sampler (OTEL_TRACES_SAMPLER) left out
        self._default_service_name: str | None = None  # configure's application name: the environment's wins
        self._failure: str | None = None  # the type of the error that ended a span, for the root span's status
        self._metrics: CountingMetricExporter | None = None
        self._accounted = False  # the end-of-run account said: what fails later is in it, not said again
        self._saying = threading.RLock()  # OpenTelemetry's threads say their failures too
        self._threads_before: frozenset[threading.Thread] = frozenset()
        self.dropped = 0  # spans lost, known once the exporter is closed
        self.queue_dropped = 0  # of those, spans the batch processor's full queue dropped before any export

    @property
    def service_name(self) -> str | None:
        """``service.name``: the argument, else the environment's, else ``configure``'s application name."""
        return self.settings.options.service_name or environment_service_name() or self._default_service_name

    def with_service_name(self, service_name: str) -> None:
        """Name the service where neither the arguments nor the environment do (``configure``'s application name)."""
        self._default_service_name = service_name

    def __repr__(self) -> str:  # headers and passwords stay out of logs
        return f"OTLPExporter(endpoint={redact_url(self.endpoint)!r}, protocol={self.protocol!r})"

    def _resource(self) -> Resource:
        """The operator's attributes (``OTEL_RESOURCE_ATTRIBUTES``) over the product's, the arguments over both;
        telemetry-jit's version is a fact about the recorder, under its own key, never the service's version."""
        run, host = job_run_id(), socket.gethostname()
        attributes: dict[str, Any] = {
            # unique per process, as the semantic conventions require: the ranks of one run differ here and
            # share telemetry_jit.run_id (and the trace)
            "service.instance.id": f"{run}:{host}:{os.getpid()}",
            "telemetry_jit.run_id": run,
            "host.name": host,
        }
        for package, key in _VERSIONED.items():
            with contextlib.suppress(metadata.PackageNotFoundError):
                attributes[f"telemetry_jit.version.{key}"] = metadata.version(package)
        attributes.update(environment_resource_attributes())
        attributes["service.name"] = self.service_name or _application_name() or "telemetry-jit"
        attributes.update(self.settings.options.resource_attributes or {})
        # the process and its runtime (pid, Python) as OpenTelemetry's own detector describes them, beneath
        with sdk_said("opentelemetry.sdk.resources"):  # a malformed pair: said once, at configure
            return ProcessResourceDetector().detect().merge(Resource.create(attributes))

    @override
    def initialize(self) -> None:
        """With the service named, build the providers now, so nothing is left to fail mid-run."""
        super().initialize()
        self._threads_before = frozenset(threading.enumerate())  # export threads not ours (otlp_late)
        tap_sdk_loggers(self._log_filter, OTEL_LOGGERS)
        tap_sdk_loggers(_not_each_dropped_attribute, _ATTRIBUTES_LOGGER)
        if self.service_name is not None:
            _ = self._tracer, self.meter_provider

    @functools.cached_property
    def _tracer(self) -> trace.Tracer:
        # built in initialize() when the service is named, else at the first span: nv-one-logger's builder
        # initializes exporters before its configuration (and so the application name) is in place
        self._provider = TracerProvider(
            resource=self._resource(),
            sampler=KeepCompiles(self.settings.sampler or DEFAULT_ON),
            span_limits=self.settings.span_limits,
            id_generator=_RunTraceIds(job_run_id()),
            shutdown_on_exit=False,  # close() shuts it down, bounded; OTel's own exit hook would wait unbounded
        )
        self._provider.add_span_processor(BatchSpanProcessor(self._retrying, **self.settings.batch))  # type: ignore[arg-type]
        version = self._provider.resource.attributes.get("telemetry_jit.version.telemetry_jit", "0+unknown")
        return self._provider.get_tracer("telemetry_jit", str(version), schema_url=SCHEMA_URL)

    @property
    def meter_provider(self) -> MeterProvider | None:
        """Metrics recorded here go to this exporter's collector (``None`` with ``metrics=False``)."""
        if not self.settings.metrics or not self.ready:
            return None
        if self._meter_provider is None:
            self._metrics = CountingMetricExporter(
                self._exporters.get("metrics") or build_exporter(self.settings, "metrics"), self._metrics_undelivered
            )
            reader = PeriodicExportingMetricReader(
                self._metrics,
                export_interval_millis=self.settings.metrics_interval_ms,
                export_timeout_millis=self.settings.metrics_export_timeout_ms,
            )
            self._meter_provider = MeterProvider(
                resource=self._resource(), metric_readers=[reader], shutdown_on_exit=False
            )
        return self._meter_provider

    def _warn(self, kind: str, message: str) -> None:
        """Said once per ``kind``, on every rank (each has its own exporter), with no source line under it; nothing
        after the end-of-run account (an export given up on at close fails later, on OpenTelemetry's thread)."""
        with self._saying:  # the account and the flag that closes it, as one: no line squeezes in after it
            if self._accounted:
                return
            self._notices.warn(kind, message, every_rank=True, origin=NOWHERE)

    def _undelivered(self) -> None:
        reason = self.settings.scrub(self._log_filter.first_reason) or "the collector refused them or did not answer"
        self._warn(
            "unreachable",
            f"telemetry-jit: {self!r} could not deliver spans ({reason}); they are kept (up to "
            f"{self._retrying.capacity}) and sent again after the next batch, training goes on. What was not "
            "delivered is counted at the end of the run.",
        )

    def _metrics_undelivered(self, reason: str) -> None:
        endpoint = redact_url(self.settings.targets["metrics"].endpoint)
        self._warn(
            "metrics undelivered",
            f"telemetry-jit: {self!r} could not deliver metrics to {endpoint!r} "
            f"({self.settings.scrub(reason or self._log_filter.metrics_reason) or 'no answer'}); "
            "training goes on, and the run file's health record counts the failed exports. metrics=False or "
            "OTEL_METRICS_EXPORTER=none stops sending them.",
        )

    def _refused(self, what: str) -> None:
        self._warn(
            "refused",
            f"telemetry-jit: {self!r}: {self.settings.scrub(what)}; it is dropped and counted, the other spans go on.",
        )

    def delivery(self) -> dict[str, int]:
        """Every signal's delivery so far (spans dropped: known at close)."""
        retrying = self._retrying
        delivery = {
            "spans": self._ended,
            "spans_delivered": retrying.delivered,
            "spans_dropped": self.dropped,
            "exports_failed": retrying.failures,
            "spans_resent": retrying.resent,
            "spans_refused": retrying.refused,
            "spans_sampled_out": self._sampled_out,
            "spans_queue_dropped": self.queue_dropped,
        }
        if self._metrics is not None:
            delivery["metric_exports"] = self._metrics.exports
            delivery["metric_exports_failed"] = self._metrics.failures
        return delivery

    def force_flush(self, timeout_seconds: float | None = None) -> bool:
        """Send what is queued now, waiting at most ``timeout_seconds`` (default: the flush timeout)."""
        flushes = [p.force_flush for p in (self._provider, self._meter_provider) if p is not None]
        return all(bounded(flushes, self.settings.flush_timeout_s if timeout_seconds is None else timeout_seconds))

    @override
    @_through_the_sdk
    def export_start(self, span: Span) -> None:
        start = unix_ns(span.start_event.timestamp)
        if span.parent_span is None and self._root is None:
            self._root = span.id
        self._spans[span.id] = self._start(span.name_str, span.parent_span, start, span.attributes.to_json())

    @_through_the_sdk
    def export_finished_span(self, span: FinishedSpan) -> None:
        otel_span = self._start(span.name, span.parent, span.start_unix_ns, span.exported_attributes())
        for event in span.events:
            if not event.error:
                attributes = by_importance(_attributes(event.exported_attributes()))
                self._add_event(otel_span, event.name, attributes, event.time_unix_ns)
            else:  # OpenTelemetry's exception event says it: one name for the fact
                attributes = exception_attributes(event.message)
                self._add_event(otel_span, "exception", attributes, event.time_unix_ns)
                self._failed(otel_span, attributes["exception.type"], event.message, run=False)
        self._end(otel_span, span.end_unix_ns)

    def _with_identity(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """``attributes`` as OTel values, with this process's rank, world size and node, least useful first."""
        return by_importance(_attributes({**attributes, **vars(self.identity.current())}))  # vars: asdict deep-copies

    def _start(self, name: str, parent: Span | None, start_ns: int, attributes: Mapping[str, Any]) -> trace.Span:
        while parent is not None and parent.id not in self._spans:
            parent = parent.parent_span  # the export filter dropped it: hang under its nearest exported ancestor
        context: Context | None = None
        links: tuple[trace.Link, ...] = ()
        if parent is not None:
            parent_span = self._spans[parent.id]
            context = trace.set_span_in_context(parent_span)
            if name in ALWAYS_KEPT and not parent_span.get_span_context().trace_flags.sampled:
                # kept while the sampler left its parent out: a root linked to that parent, since a backend would
                # wait forever for a parent that never arrives (a broken trace)
                context = Context()
                links = (trace.Link(parent_span.get_span_context(), {_LINKED_PARENT: parent.name_str}),)
        return self._tracer.start_span(
            name, context, start_time=start_ns, attributes=self._with_identity(attributes), links=links
        )

    @override
    @_through_the_sdk
    def export_stop(self, span: Span) -> None:
        otel_span = self._spans.pop(span.id, None)
        if otel_span is None:
            return
        # the rank may have become known while the span ran (rank 0 of a DDP launch learns it at fit)
        otel_span.set_attributes(self._with_identity(span.attributes.to_json()))
        if span.parent_span is None and self._failure is not None:  # the root: the run failed under it
            self._failed(otel_span, self._failure, "the run failed (see the exception event of the span it ended)")
        if span.id == self._root:
            self._stamp_run(otel_span)
        self._end(otel_span, unix_ns(span.stop_event.timestamp) if span.stop_event is not None else None)

    def _add_event(self, otel_span: trace.Span, name: str, attributes: Mapping[str, Any], time_ns: int) -> None:
        otel_span.add_event(name, attributes, timestamp=time_ns)
        if otel_span.is_recording() and otel_span.get_span_context().trace_flags.sampled:
            self._events[name] += 1

    def _end(self, otel_span: trace.Span, end_time: int | None) -> None:
        otel_span.end(end_time=end_time)
        if otel_span.get_span_context().trace_flags.sampled:
            self._ended += 1
            self._names[getattr(otel_span, "name", "")] += 1
        else:
            self._sampled_out += 1

    def _stamp_run(self, root: trace.Span) -> None:
        """What this process sent under the run, on its root span as it ends (docs/reliability.md): a backend holding
        fewer spans or events of this process's trace than these counts holds the run in part. Set last, so that at
        an attribute count limit they are the ones kept. The batch queue is flushed first (a short wait, bounded) so
        that the spans dropped so far are known."""
        started = time.monotonic()
        budget = min(_ROOT_FLUSH_S, self.settings.flush_timeout_s / 2)  # close keeps the rest, the root's own send
        flushed = self._provider is not None and bounded([self._provider.force_flush], budget)[0]
        self._flushed_s += time.monotonic() - started
        retrying = self._retrying
        dropped = retrying.refused + retrying.overflowed
        if flushed and self._log_filter.queue_full:  # the queue drained: what it never handed over, it dropped
            dropped += max(self._ended - retrying.taken, 0)
        counts = {"run.spans": self._ended, "run.events": sum(self._events.values())}
        counts |= {f"run.{name.value}_spans": self._names[name.value] for name in JitSpanName}
        counts |= {
            f"run.{name.value}_events": self._events[name.value] for name in JitEventName if self._events[name.value]
        }
        counts |= {"run.spans_dropped": dropped, "run.exports_failed": retrying.failures}
        root.set_attributes(by_importance({OTEL_NAMESPACE + name: count for name, count in counts.items()}))

    def _failed(self, otel_span: trace.Span, error_type: str, message: str, run: bool = True) -> None:
        """Status ERROR and ``error.type`` on a span an error ended; with ``run`` (not a compile that fell back to
        eager), on the root span too when it ends."""
        if otel_span.is_recording():
            otel_span.set_status(Status(StatusCode.ERROR, message))
            otel_span.set_attribute("error.type", error_type)
        if run:
            self._failure = error_type

    @override
    @_through_the_sdk
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        otel_span = self._spans.get(span.id)  # OpenTelemetry's exception event: one name for the fact
        if otel_span is not None:
            attributes = exception_attributes(
                event.exception_message or event.error_message, event.exception_type, event.exception_traceback
            )
            self._add_event(otel_span, "exception", attributes, unix_ns(event.timestamp))
            self._failed(otel_span, attributes["exception.type"], event.error_message)

    @override
    @_through_the_sdk
    def export_event(self, event: Event, span: Span) -> None:
        otel_span = self._spans.get(span.id)
        if otel_span is not None:
            self._add_event(
                otel_span, event.name_str, _attributes(event.attributes.to_json()), unix_ns(event.timestamp)
            )

    @override
    @_through_the_sdk
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        span = self._tracer.start_span("telemetry_data_error", start_time=unix_ns(error.timestamp))
        span.set_status(Status(StatusCode.ERROR, error.error_message))
        self._add_event(span, error.name_str, _attributes(error.attributes.to_json()), unix_ns(error.timestamp))
        self._end(span, unix_ns(error.timestamp))

    @override
    def close(self) -> None:
        if not self.ready:
            return
        root = self._spans.pop(self._root, None)
        for otel_span in self._spans.values():
            _SDK.call(self._end, otel_span, None)  # still open at application end: export what is known
        if root is not None:  # the root last, counting the rest
            _SDK.call(self._stamp_run, root)
            _SDK.call(self._end, root, None)
        self._spans.clear()
        # whatever the collector does (a black hole, 429s, resets), the application's end waits one export timeout
        # at most, the meter provider's last collection included; what did not make it is counted below
        shutdowns = [p.shutdown for p in (self._provider, self._meter_provider) if p is not None]
        finished = bounded(shutdowns, max(self.settings.flush_timeout_s - self._flushed_s, 0.0))
        if self._provider is not None and not finished[0]:
            self._retrying.stop_counting()
        elif self._log_filter.queue_full:  # the queue drained: what never reached the exporter, the queue dropped
            self.queue_dropped = max(self._ended - self._retrying.taken, 0)
        # an export given up on still runs and logs as it fails: held, as during the run, until it ends
        untap_when_exports_end(self._log_filter, OTEL_LOGGERS, others=self._threads_before)
        untap_sdk_loggers(_not_each_dropped_attribute, _ATTRIBUTES_LOGGER)
        self.dropped = self._ended - self._retrying.delivered
        with self._saying:
            if self.dropped or self._retrying.failures:
                self._warn("undelivered" if self.dropped else "recovered", f"telemetry-jit: {self!r}: {self.account()}")
            self._accounted = True
        super().close()

    def account(self) -> str:
        """What reached the collector, in one sentence (said at close when anything went wrong)."""
        retrying = self._retrying
        account = (
            f"{retrying.delivered} of {self._ended} spans delivered ({retrying.resent} of them re-sent after "
            f"{retrying.failures} failed exports), {self.dropped} dropped"
        )
        given_up = self.dropped - retrying.refused - retrying.overflowed - self.queue_dropped
        queue = self.settings.batch["max_queue_size"]
        causes = {
            f"{self.queue_dropped} dropped by the batch queue as they ended (its {queue:g} places were full: "
            "OTEL_BSP_MAX_QUEUE_SIZE / max_queue_size)": self.queue_dropped,
            f"{retrying.refused} too large for any request": retrying.refused,
            f"{retrying.overflowed} beyond the backlog of {retrying.capacity}": retrying.overflowed,
            f"{given_up} still waiting when the export timeout of {self.settings.flush_timeout_s:g} s at close ran out "
            "(collector unreachable, refusing or too slow)": given_up > 0,
        }
        said = [cause for cause, count in causes.items() if count]
        return account + (f": {'; '.join(said)}." if said else ".")

    @property
    def delivered(self) -> int:
        return self._retrying.delivered


_TYPED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Unsupported|Interrupt|Exit|Warning)\w*): (.*)", re.S)


def exception_attributes(message: str, type_name: str | None = None, stacktrace: str | None = None) -> dict[str, str]:
    """OpenTelemetry's ``exception`` event attributes; a message ``Type: text`` gives its type if none is known."""
    if type_name is None:
        typed = _TYPED.match(message)
        type_name, message = (typed.group(1), typed.group(2)) if typed else ("Error", message)
    attributes = {"exception.type": type_name, "exception.message": message}
    if stacktrace:
        attributes["exception.stacktrace"] = stacktrace
    return attributes


def _application_name() -> str | None:
    from nv_one_logger.api.one_logger_provider import OneLoggerProvider

    provider = OneLoggerProvider.instance()
    return provider.config.application_name if provider.one_logger_ready else None


# nv-one-logger's attributes that repeat what OTLP carries itself: a span's start and end, an event's time
_NV_DROPPED = frozenset(("duration_msec", "timestamp_msec"))
# an attribute that repeats another's value on the same record: sent only where the two differ
_SAME_FACT = {"graph_break.type": "graph_break.reason"}


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as OTel takes them (primitives, lists of one type), under their OTel names (seconds, no unit in a
    name), one name per fact; an empty text or list is no fact, not sent."""
    converted: dict[str, Any] = {}
    for name, value in attributes.items():
        renamed = otel_name(name)
        if value is None or (isinstance(value, (str, list, tuple)) and not value) or name in _NV_DROPPED:
            continue
        if renamed is None and otel_dropped(name):
            continue
        if (same := _SAME_FACT.get(name)) is not None and attributes.get(same) == value:
            continue
        if isinstance(value, (list, tuple)):
            primitive = len({type(v) for v in value}) == 1 and isinstance(value[0], (str, bool, int, float))
            value = list(value) if primitive else [str(v) for v in value]
        elif not isinstance(value, (str, bool, int, float)):
            value = str(value)
        if renamed is not None:
            name, value = renamed[0], _scaled(value, renamed[1])
        elif name.endswith("_sec"):  # nv-one-logger's seconds (avg_iteration_time_sec): the unit is OTel's default
            name = name.removesuffix("_sec")
        converted[name] = value
    return converted


# what a backend needs first when a span or event may keep only a few attributes (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT,
# OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT): which compile, of what, how long, then why
_FIRST = tuple(
    OTEL_NAMESPACE + name
    for name in (
        "run.spans",  # on the root span: what proves the trace whole (docs/reliability.md)
        "run.compilation_spans",
        "run.spans_dropped",
        "run.exports_failed",
        "run.events",
        "compile.id",
        "compile.frame",
        "compile.duration",
        "compile.location",
        "compile.is_recompile",
        "compile.recompile_cause",
        "compile.recompile_reason",
        "compile.graph_breaks",
        "compile.failed",
        "compile.fell_back_to_eager",
        "compile.failure",
        "compile.trigger",
        "compile.backend",
        "train.global_step",
        "train.stage",
        "graph_break.reason",
        "graph_break.user_location",
        "graph_break.location",
        "graph_break.fix",
        "rank",
    )
)
_IMPORTANCE = {name: len(_FIRST) - index for index, name in enumerate(_FIRST)}


_ATTRIBUTES_LOGGER = ("opentelemetry.attributes",)


def _not_each_dropped_attribute(record: logging.LogRecord) -> bool:
    """OpenTelemetry writes a line for every attribute a count limit drops (on every span): the limit is the
    operator's choice, and what it keeps is ordered (:func:`by_importance`), so those lines stay off the console."""
    return not record.getMessage().startswith("Attributes dict is full")


def by_importance(attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` with the most useful last: at a count limit, OpenTelemetry's SDK drops the oldest attributes
    (its ``BoundedAttributes``), so the last ones inserted are the ones kept (the rest keep their order)."""
    return dict(sorted(attributes.items(), key=lambda item: _IMPORTANCE.get(item[0], 0)))


def _scaled(value: Any, factor: float) -> Any:
    if factor == 1.0 or isinstance(value, (bool, str)):
        return value
    if isinstance(value, list):
        return [_scaled(item, factor) for item in value]
    return round(value * factor, 9) if isinstance(value, (int, float)) else value
