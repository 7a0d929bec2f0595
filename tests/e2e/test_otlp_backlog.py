"""The OTLP backlog against real receivers: after outages of every length, delivery resumes as soon as
the receiver is back, in requests the receiver takes, and what could not be kept is counted."""

from __future__ import annotations

import gc
import logging
import math
import socket
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telemetry_jit.exporters.otlp_settings import (
    DEFAULT_MAX_REQUEST_BYTES,
    OTLPOptions,
    OTLPSettings,
    tap_sdk_loggers,
    untap_sdk_loggers,
)
from telemetry_jit.exporters.otlp_transport import (
    OTEL_LOGGERS,
    FailureTap,
    RetryingSpanExporter,
    build_exporter,
    request_bytes,
)
from tests.e2e.otlp_receivers import GrpcReceiver, HttpReceiver

pytestmark = pytest.mark.any_torch

BATCH = 512  # OpenTelemetry's max_export_batch_size
SPAN_BYTES = 3_100  # what a real compile span averages (6.2 KB at most)


def spans(count: int, size: int = SPAN_BYTES, start: int = 0) -> list[ReadableSpan]:
    """``count`` spans of about ``size`` bytes each on the wire, named by number."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("backlog-test")
    for number in range(start, start + count):
        with tracer.start_as_current_span(f"compilation-{number}") as span:
            span.set_attribute("compile.failure", "x" * (size - 150))
    return list(memory.get_finished_spans())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(autouse=True)
def heap_of_this_test_only() -> Iterator[None]:
    """The receivers share this process, and its heap holds whatever the suite compiled before: a full
    collection there (a second, on this machine) could stall a receiver past the exports' 0.5-s timeout,
    which a collector in a process of its own never sees. Collections here walk only this test's objects."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def tap() -> Iterator[FailureTap]:
    tap = FailureTap()
    tap_sdk_loggers(tap, OTEL_LOGGERS)  # as the exporter taps them: first, before OpenTelemetry's DuplicateFilter
    yield tap
    untap_sdk_loggers(tap, OTEL_LOGGERS)


def exporter(protocol: str, port: int, tap: FailureTap, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
    endpoint = f"http://127.0.0.1:{port}" + ("/v1/traces" if protocol == "http/protobuf" else "")
    settings = OTLPSettings.resolve(OTLPOptions(endpoint=endpoint, protocol=protocol, timeout=0.5, metrics=False))
    return RetryingSpanExporter(build_exporter(settings, "traces"), 2048, max_batch=BATCH, max_bytes=max_bytes, tap=tap)


def receiver(protocol: str, port: int, max_bytes: int = 0) -> GrpcReceiver | HttpReceiver:
    if protocol == "grpc":
        return GrpcReceiver(port)  # gRPC's own limit: 4 MiB a message, as the Collector's
    return HttpReceiver(port=port, max_bytes=max_bytes or 4 * 1024 * 1024)


def names(received: GrpcReceiver | HttpReceiver) -> list[str]:
    return [span.name for span in received.received.spans()]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("failed_batches", [1, 4, 6])
def test_delivery_resumes_after_an_outage_of_any_length(protocol: str, failed_batches: int, tap) -> None:
    port = free_port()
    retrying = exporter(protocol, port, tap)
    down = [spans(BATCH, start=i * BATCH) for i in range(failed_batches)]
    for batch in down:
        assert retrying.export(batch) is SpanExportResult.FAILURE
    back = receiver(protocol, port)
    try:
        assert retrying.export(spans(1, start=10_000)) is SpanExportResult.SUCCESS
        assert retrying.export(spans(1, start=10_001)) is SpanExportResult.SUCCESS  # and goes on
    finally:
        back.stop()
    kept = min(failed_batches * BATCH, 2048)  # the backlog's capacity: the newest are kept
    expected = [s.name for batch in down for s in batch][-kept:] + ["compilation-10000", "compilation-10001"]
    assert sorted(names(back)) == sorted(expected)
    assert retrying.delivered == kept + 2 and retrying.resent == kept
    assert retrying.overflowed == failed_batches * BATCH - kept and retrying.refused == 0
    assert max(len(raw) for raw in back.received.raw) <= DEFAULT_MAX_REQUEST_BYTES
    # requests shrunk by the outage grow back by doubling once the receiver takes them: a backlog goes in
    # a few requests (it went in 256 of 8 spans after six failed exports)
    assert len(back.received.raw) <= 2 + math.log2(BATCH) + kept / BATCH


def test_a_receiver_with_a_lower_limit_gets_requests_it_takes(tap) -> None:
    """A collector configured for 1 MB requests (ours are cut at 3 MiB): refused as too large, halved."""
    port = free_port()
    retrying = exporter("http/protobuf", port, tap)
    back = receiver("http/protobuf", port, max_bytes=1_000_000)
    try:
        for start in (0, BATCH):
            retrying.export(spans(BATCH, start=start))
        for _ in range(3):  # the batch processor's next rounds; with OpenTelemetry's logs, none is needed
            if not retrying.pending:
                break
            retrying.export([])
    finally:
        back.stop()
    assert len(names(back)) == 2 * BATCH and retrying.refused == 0 and not retrying.pending
    assert back.received.refused >= 1  # it did refuse, and was answered with smaller requests


def test_a_receiver_with_a_lower_limit_is_met_when_its_refusals_are_not_logged(tap) -> None:
    """An application's logging configuration silenced OpenTelemetry's loggers: the requests still shrink."""
    silenced = [logging.getLogger(name) for name in OTEL_LOGGERS]
    for logger in silenced:
        logger.disabled = True
    try:
        test_a_receiver_with_a_lower_limit_gets_requests_it_takes(tap)
    finally:
        for logger in silenced:
            logger.disabled = False


def test_a_span_larger_than_any_request_is_dropped_counted_and_said(tap) -> None:
    """A span past gRPC's 4 MiB: the receiver refuses it while it takes the others; it is dropped and said."""
    port = free_port()
    said: list[str] = []
    retrying = exporter("grpc", port, tap)
    retrying.on_refused = said.append
    back = receiver("grpc", port)
    try:
        retrying.export(spans(10) + spans(1, size=5 * 1024 * 1024, start=99))
        for _ in range(3):  # the batch processor's next rounds
            if not retrying.pending:
                break
            retrying.export([])
    finally:
        back.stop()
    assert len(names(back)) == 10 and "compilation-99" not in names(back)
    assert retrying.refused == 1 and "'compilation-99'" in said[0]


def test_a_backlog_span_over_the_request_bound_is_dropped_before_it_is_sent(tap) -> None:
    port = free_port()
    said: list[str] = []
    retrying = exporter("grpc", port, tap, max_bytes=20_000)
    retrying.on_refused = said.append
    assert retrying.export(spans(10) + spans(1, size=50_000, start=99)) is SpanExportResult.FAILURE  # down
    back = receiver("grpc", port)
    try:
        assert retrying.export([]) is SpanExportResult.SUCCESS
    finally:
        back.stop()
    assert len(names(back)) == 10 and retrying.refused == 1
    assert "'compilation-99'" in said[0] and "over the request limit of 20000" in said[0]


def test_requests_are_measured_as_the_receiver_counts_them() -> None:
    batch = spans(100)
    assert 100 * SPAN_BYTES * 0.9 < request_bytes(batch) < 100 * SPAN_BYTES * 1.2


def test_a_span_failure_is_never_taken_for_a_metrics_one_whatever_the_endpoint_is_called(tap: FailureTap) -> None:
    """gRPC's exporter logs both signals under one logger; a collector whose host says "metrics" still gets its
    span failures reported as span failures (the metrics warning would have said the wrong signal failed)."""
    settings = OTLPSettings.resolve(
        OTLPOptions(endpoint="http://metrics-gateway.invalid:4317", protocol="grpc", timeout=0.5, metrics=False)
    )
    assert (
        RetryingSpanExporter(build_exporter(settings, "traces"), 16, tap=tap).export(spans(1))
        is SpanExportResult.FAILURE
    )
    assert "Failed to export traces to metrics-gateway.invalid" in tap.first_reason
    assert tap.metrics_reason == ""
