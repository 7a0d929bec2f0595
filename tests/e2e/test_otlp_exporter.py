"""OTLPExporter against real receivers on loopback: the span tree on the wire, and a collector
that is down or restarts."""

from __future__ import annotations

import atexit
import importlib.metadata
import logging
import os
import platform
import shutil
import socket
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from packaging.version import Version

import telemetry_jit
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.exporters import OTLPExporter
from telemetry_jit.schema import JitEventName, JitSpanName, otel_dropped, otel_name
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import (
    GrpcReceiver,
    HttpReceiver,
    MisbehavingCollector,
    ReceivedSpan,
    self_signed_certificate,
)
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

SECRET = "Bearer s3cr3t-token-123"
JIT = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "aot_eager"})


@pytest.fixture(autouse=True)
def fast_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


@pytest.fixture
def configure(tmp_path: Path):
    providers = []

    def make(exporter: OTLPExporter | bool):
        fresh_provider_state()
        provider = telemetry_jit.configure("otlp-app", file=tmp_path / "t.jsonl", otlp=exporter, global_batch_size=4)
        providers.append(provider)
        return provider

    yield make
    fresh_provider_state()


def train(provider, epochs: int = 2, trainer_cls: type[pl.Trainer] | None = None) -> list[float]:
    if trainer_cls is None:
        trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)[0]
    model = Net("print")
    trainer_cls(max_epochs=epochs, **TRAINER_DEFAULTS).fit(model, loader(18, 4), loader(8, 4))
    return model.losses


def plain_losses() -> list[float]:
    torch._dynamo.reset()
    return train(None, trainer_cls=type("Plain", (pl.Trainer,), {}))


def file_run(tmp_path: Path) -> TelemetryRun:
    return telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]


def wait_for(condition, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_receiver_gets_the_exact_span_tree(protocol: str, configure, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    try:
        exporter = OTLPExporter(receiver.endpoint, protocol=protocol, headers={"authorization": SECRET}, timeout=5)
        provider = configure(exporter)
        train(provider)
        telemetry_jit.hook_trainer_cls(pl.Trainer, provider)[1].on_app_end()
    finally:
        receiver.stop()
    written = file_run(tmp_path)
    received = receiver.received.spans()
    assert exporter.dropped == 0 and exporter.delivered == len(received)

    # the same spans, with the same start and end, in one trace
    by_key = {(s.name, s.start_unix_ns): s for s in received}
    assert sorted(by_key) == sorted((s.name, s.start_unix_ns) for s in written.spans.values())
    assert len({s.trace_id for s in received}) == 1
    assert len({s.span_id for s in received}) == len(received)  # dynamo restores `random` around compiles
    by_id: dict[str, ReceivedSpan] = {s.span_id: s for s in received}
    compiles = 0
    for span in written.spans.values():
        wire = by_key[(span.name, span.start_unix_ns)]
        assert wire.end_unix_ns == span.end_unix_ns
        parent = written.parent(span)
        if parent is None:
            assert wire.parent_span_id == "" and span.name == "application"
        else:
            assert by_id[wire.parent_span_id].name == parent.name
            assert by_id[wire.parent_span_id].start_unix_ns == parent.start_unix_ns
        # OpenTelemetry's names only (the project's namespace, seconds), one name per fact, no empty text
        identity = {"rank": 0, "local_rank": 0, "world_size": 1, "node": socket.gethostname()}
        # a span an error ended: ERROR status and error.type, the type its exception event names (conventions)
        raised = [a["exception.type"] for n, _, a in wire.events if n == "exception"]
        failed = {"error.type": raised[0]} if any(e.is_error for e in span.events) else {}
        counts = run_counts(received) if parent is None else {}  # the root: what was sent under it
        assert wire.attributes == {**on_the_wire({**span.attributes, **identity}), **failed, **counts}
        assert wire.status_code == (2 if failed else 0)
        # an error goes out as OpenTelemetry's exception event (nv-one-logger's own error event is not sent)
        assert [(n, a) for n, _, a in wire.events if n != "exception"] == [
            (e.name, on_the_wire(e.attributes)) for e in span.events if e.name != "error"
        ]
        assert sum(n == "exception" for n, _, _ in wire.events) == sum(e.is_error for e in span.events)
        conventional = [key for key in wire.attributes if key.startswith("telemetry_jit.")]
        assert "telemetry_jit.rank" in conventional and not [key for key in conventional if key.endswith(("_ms", "_s"))]
        if span.name == "compilation":
            seconds = span.attributes["compile.duration_ms"] / 1000
            assert wire.attributes["telemetry_jit.compile.duration"] == pytest.approx(seconds)
            assert wire.attributes["telemetry_jit.compile.frame"] == span.attributes["compile.frame"]
        compiles += span.name == "compilation"
    assert compiles > 0
    assert any(n == "graph_break" for s in received for n, _, _ in s.events)

    resource = received[0].resource
    assert resource["service.name"] == "otlp-app"
    assert resource["process.pid"] == os.getpid()
    assert resource["host.name"] == socket.gethostname()
    # the installed release; torch.__version__ may add a local label (2.15.0+cu132)
    assert Version(resource["telemetry_jit.version.torch"]).release == Version(torch.__version__).release
    assert all(
        s.attributes["telemetry_jit.rank"] == 0 and s.attributes["telemetry_jit.world_size"] == 1 for s in received
    )

    # credentials reach the receiver as a header, and nowhere else
    assert receiver.received.metadata[0]["authorization"] == SECRET
    assert all(b"s3cr3t" not in raw for raw in receiver.received.raw)
    assert "s3cr3t" not in caplog.text and "s3cr3t" not in (tmp_path / "t.jsonl").read_text()
    assert "s3cr3t" not in repr(exporter)


def run_counts(received: list[ReceivedSpan]) -> dict[str, int]:
    """The counts a healthy run's root span carries: the spans and events the receiver got besides the root."""
    others = [span for span in received if span.parent_span_id or span.name != "application"]
    events = Counter(name for span in received for name, _, _ in span.events)
    counts = {"run.spans": len(others), "run.events": sum(events.values())}
    counts |= {f"run.{name.value}_spans": sum(s.name == name.value for s in others) for name in JitSpanName}
    counts |= {f"run.{name.value}_events": events[name.value] for name in JitEventName if events[name.value]}
    counts |= {"run.spans_dropped": 0, "run.exports_failed": 0}
    return {f"telemetry_jit.{name}": count for name, count in counts.items()}


def on_the_wire(recorded: dict[str, Any]) -> dict[str, Any]:
    """The attributes a backend should get for ``recorded`` (the file's): each fact once, under OpenTelemetry's
    name, in seconds, no unit in a name (nv-one-logger's milliseconds are the span's own times); no empty text or
    list; a graph break's type where it is not its reason."""
    wire: dict[str, Any] = {}
    for key, value in recorded.items():
        if value in ("", []) or otel_dropped(key) or key in ("duration_msec", "timestamp_msec"):
            continue
        if key == "graph_break.type" and value == recorded.get("graph_break.reason"):
            continue
        name, scale = otel_name(key) or (key.removesuffix("_sec"), 1.0)
        wire[name] = (
            value
            if scale == 1.0 or isinstance(value, bool)
            else pytest.approx(value * scale)
            if not isinstance(value, list)
            else pytest.approx([v * scale for v in value])
        )
    return wire


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_down_from_the_start_costs_one_warning_not_the_run(
    configure, tmp_path: Path, caplog, protocol: str
) -> None:
    expected = plain_losses()
    torch._dynamo.reset()
    started = time.perf_counter()
    train(configure(False))  # the same fit, its telemetry to the file alone
    plain_seconds = time.perf_counter() - started
    torch._dynamo.reset()
    exporter = OTLPExporter(
        f"http://127.0.0.1:{free_port()}", protocol=protocol, timeout=0.5, schedule_delay_millis=100
    )
    provider = configure(exporter)
    caplog.set_level(logging.WARNING, logger="opentelemetry")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        losses = train(provider)
        fit_seconds = time.perf_counter() - started
        telemetry_jit.hook_trainer_cls(pl.Trainer, provider)[1].on_app_end()
    assert losses == expected
    # exports run on their own thread: a collector that never answers costs the fit nothing it waits for
    assert fit_seconds < plain_seconds + 2.0, (fit_seconds, plain_seconds)
    ours = [str(w.message) for w in caught if "OTLPExporter" in str(w.message)]
    # telemetry-jit says it once when it happens (with OpenTelemetry's own reason), and counts it at the end
    spans = [line for line in ours if "metrics" not in line]
    assert len(spans) == 2 and "could not deliver spans (" in spans[0] and "spans delivered" in spans[1]
    assert len([line for line in ours if "could not deliver metrics" in line]) == 1  # the other signal, once
    written = file_run(tmp_path)  # the other exporter received everything
    assert written.find("compilation") and exporter.dropped == len(written.spans)
    # OpenTelemetry's own lines ("Transient error ... retrying") stay off the console: telemetry-jit said it
    assert [r for r in caplog.records if r.name.startswith("opentelemetry")] == []


def test_slow_collector_does_not_slow_training(configure, tmp_path: Path) -> None:
    expected = plain_losses()
    torch._dynamo.reset()
    started = time.perf_counter()
    train(configure(False))  # the same fit, its telemetry to the file alone
    plain_seconds = time.perf_counter() - started
    torch._dynamo.reset()
    receiver = HttpReceiver(delay=2.0)  # every request outlasts the export timeout
    try:
        exporter = OTLPExporter(receiver.endpoint, protocol="http/protobuf", timeout=0.5)
        provider = configure(exporter)
        started = time.perf_counter()
        losses = train(provider)
        fit_seconds = time.perf_counter() - started
        if fit_seconds >= plain_seconds + 1.0:  # the quieter of two fits: a busy moment only ever makes one longer
            torch._dynamo.reset()
            started = time.perf_counter()
            train(provider)
            fit_seconds = min(fit_seconds, time.perf_counter() - started)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            telemetry_jit.hook_trainer_cls(pl.Trainer, provider)[1].on_app_end()
    finally:
        receiver.stop()
    assert losses == expected
    # exports wait on their own thread: a fit that waited for them would take 0.5 s more per export
    assert fit_seconds < plain_seconds + 1.0, (fit_seconds, plain_seconds)
    (account,) = [str(w.message) for w in caught if "spans delivered" in str(w.message)]  # said once, at the end
    assert exporter.dropped > 0 and f"{exporter.dropped} dropped" in account
    assert file_run(tmp_path).find("compilation")


def test_collector_restarting_mid_run_loses_nothing(configure, tmp_path: Path) -> None:
    receiver = GrpcReceiver()
    port = receiver.port
    exporter = OTLPExporter(receiver.endpoint, protocol="grpc", timeout=5)  # the bound at close: room to resend
    provider = configure(exporter)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
    assert wait_for(lambda: any(s.name == "training_loop" for s in receiver.received.spans()))
    receiver.stop()
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(8, 4))
    assert wait_for(lambda: exporter._retrying.failures > 0)  # tried while the collector was down
    restarted = GrpcReceiver(port)
    try:
        callback.on_app_end()
    finally:
        restarted.stop()
    delivered = receiver.received.spans() + restarted.received.spans()
    written = file_run(tmp_path)
    assert sorted((s.name, s.start_unix_ns) for s in delivered) == sorted(
        (s.name, s.start_unix_ns) for s in written.spans.values()
    )
    assert len(written.find("training_loop")) == 2
    assert any(s.name == "compilation" for s in restarted.received.spans())
    assert exporter.dropped == 0


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({"protocol": "thrift"}, {}, "protocol=...\\)='thrift' is not an OTLP protocol"),
        ({"endpoint": "http://:99999"}, {}, "is not an OTLP endpoint"),
        ({"endpoint": "localhost:4318/v1/traces", "protocol": "http/protobuf"}, {}, "is not an OTLP endpoint"),
    ],
)
def test_bad_configuration_is_named(kwargs, env, message, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        OTLPExporter(**kwargs)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_HEADERS": "authorization"}, "OTEL_EXPORTER_OTLP_HEADERS is malformed"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_PROTOCOL='udp' is not an OTLP protocol"),
    ],
)
def test_a_bad_variable_is_named_and_its_default_used(env, message, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(RuntimeWarning, match=message + ".*the default .* is used instead"):
        exporter = OTLPExporter()
    assert (exporter.protocol, exporter.endpoint) == ("grpc", "localhost:4317")


def test_standard_variables_configure_it_and_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization={SECRET},x-team=jit")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3000")  # milliseconds, the specification's unit
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    exporter = OTLPExporter()
    assert (exporter.protocol, exporter.endpoint, exporter.settings.targets["traces"].timeout_s) == (
        "http/protobuf",
        "http://collector:4318/v1/traces",
        3.0,
    )
    assert exporter.settings.targets["traces"].headers == {"authorization": SECRET, "x-team": "jit"}
    assert exporter.service_name == "from-env"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/v1/traces")
    assert OTLPExporter().endpoint == "http://traces:4318/v1/traces"
    explicit = OTLPExporter("127.0.0.1:4317", protocol="grpc", headers="a=b", service_name="arg", timeout=1)
    settings, traces = explicit.settings, explicit.settings.targets["traces"]
    assert (traces.protocol, traces.endpoint, traces.headers, settings.options.service_name, traces.timeout_s) == (
        "grpc",
        "127.0.0.1:4317",
        {"a": "b"},
        "arg",
        1.0,
    )


def test_the_environment_alone_turns_otlp_on(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = GrpcReceiver()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    try:
        fresh_provider_state()
        provider = telemetry_jit.configure("from-env", file=None)
        telemetry_jit.hook_trainer_cls(pl.Trainer, provider)[1].on_app_end()
    finally:
        fresh_provider_state()
        receiver.stop()
    (span,) = receiver.received.spans()
    assert span.name == "application" and span.resource["service.name"] == "from-env"


@pytest.mark.parametrize(
    ("behaviour", "protocol"),
    [
        ("black-hole", "grpc"),
        ("black-hole", "http/protobuf"),
        ("429", "http/protobuf"),
        ("503", "http/protobuf"),
        ("reset", "grpc"),
        ("reset", "http/protobuf"),
    ],
)
def test_a_misbehaving_collector_costs_at_most_one_export_timeout_at_the_end(
    behaviour: str, protocol: str, configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collector = MisbehavingCollector(behaviour)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2000")  # the standard variable sets the bound (milliseconds)
    try:
        exporter = OTLPExporter(collector.endpoint(protocol), protocol=protocol)
        provider = configure(exporter)
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
        model = Net("print")
        HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(18, 4), loader(8, 4))
        assert len(model.losses) == 10  # training unchanged
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.monotonic()
            callback.on_app_end()
            ending = time.monotonic() - started
    finally:
        collector.stop()
    assert collector.connections > 0  # it was tried
    assert ending < 2 + 1.5, f"on_app_end took {ending:.1f} s"  # one export timeout, plus the file's own work
    (undelivered,) = [w for w in caught if "spans delivered" in str(w.message)]
    written = file_run(tmp_path)  # the file has everything
    assert exporter.dropped == len(written.spans) > 0
    said = str(undelivered.message)
    assert f"0 of {len(written.spans)} spans delivered" in said and f"{exporter.dropped} dropped" in said
    assert f"{exporter.dropped} still waiting when the export timeout of 2 s at close ran out" in said


def batching_of(exporter: OTLPExporter) -> dict[str, float]:
    """What OTel's batch processor was built with (read back from it)."""
    exporter._tracer  # noqa: B018 - builds the provider and its batch processor
    (processor,) = exporter._provider._active_span_processor._span_processors
    inner = processor._batch_processor
    return {
        "max_queue_size": inner._max_queue_size,
        "schedule_delay_millis": inner._schedule_delay_millis,
        "max_export_batch_size": inner._max_export_batch_size,
        "export_timeout_millis": inner._export_timeout_millis,
    }


def test_the_standard_batch_processor_variables_apply_and_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {
        "OTEL_BSP_MAX_QUEUE_SIZE": ("max_queue_size", 70),
        "OTEL_BSP_SCHEDULE_DELAY": ("schedule_delay_millis", 1234),
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": ("max_export_batch_size", 30),
        "OTEL_BSP_EXPORT_TIMEOUT": ("export_timeout_millis", 4500),
    }
    for variable, (_, value) in settings.items():
        monkeypatch.setenv(variable, str(value))
    from_env = OTLPExporter("127.0.0.1:4317", protocol="grpc")
    from_env.initialize()
    assert batching_of(from_env) == {name: value for name, value in settings.values()}
    assert from_env.settings.flush_timeout_s == 4.5  # OTel itself does not use it: it bounds flush and close here
    from_args = OTLPExporter(
        "127.0.0.1:4317",
        protocol="grpc",
        max_queue_size=50,
        schedule_delay_millis=10,
        max_export_batch_size=5,
        export_timeout_millis=700,
    )
    from_args.initialize()
    assert batching_of(from_args) == {
        "max_queue_size": 50,
        "schedule_delay_millis": 10,
        "max_export_batch_size": 5,
        "export_timeout_millis": 700,
    }
    assert from_args.settings.flush_timeout_s == 0.7
    for exporter in (from_env, from_args):
        exporter.close()


def test_flush_sends_what_waits_and_shutdown_ends_once(
    configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # batches would wait ten minutes
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    receiver = GrpcReceiver()
    try:
        provider = configure(OTLPExporter(receiver.endpoint, protocol="grpc"))
        HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(8, 4))
        assert telemetry_jit.flush(timeout_seconds=10)
        flushed = receiver.received.spans()
        assert {s.name for s in flushed} >= {"training_loop", "compilation"}  # sent now, the app still runs
        assert all(len(r.resource_spans[0].scope_spans[0].spans) <= 4 for r in receiver.received.requests)
        assert not any(s.name == "application" for s in flushed)
        telemetry_jit.shutdown()
        telemetry_jit.shutdown()  # idempotent
    finally:
        receiver.stop()
    assert [s.name for s in receiver.received.spans()].count("application") == 1
    assert len(file_run(tmp_path).find("application")) == 1


def test_shutdown_is_registered_for_exit_once_per_configuration_and_removed_when_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_exit: list[object] = []
    monkeypatch.setattr(atexit, "register", lambda function, *args, **kwargs: at_exit.append(function) or function)
    monkeypatch.setattr(atexit, "unregister", lambda function: at_exit.remove(function))
    try:
        for name in ("first", "second"):  # nv-one-logger allows one configuration; tests forget it in between
            fresh_provider_state()
            telemetry_jit.configure(name, file=tmp_path / f"{name}.jsonl")
            assert at_exit.count(telemetry_jit.shutdown) == 1
        assert telemetry_jit.session.configuration().app_name == "second"
        telemetry_jit.shutdown()
        assert telemetry_jit.shutdown not in at_exit and telemetry_jit.session.configuration() is None
        telemetry_jit.shutdown()  # idempotent
    finally:
        fresh_provider_state()


def test_an_exporter_added_through_the_builder_api_reports_the_application_name() -> None:
    from nv_one_logger.api.config import OneLoggerConfig
    from nv_one_logger.training_telemetry.api.callbacks import on_app_start
    from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

    receiver = GrpcReceiver()
    fresh_provider_state()
    try:
        config = OneLoggerConfig(
            application_name="builder-app",
            session_tag_or_fn="builder-app",
            world_size_or_fn=1,
            telemetry_config=TrainingTelemetryConfig(global_batch_size_or_fn=1, perf_tag_or_fn="builder-app"),
        )
        TrainingTelemetryProvider.instance().with_base_config(config).with_exporter(
            OTLPExporter(receiver.endpoint, protocol="grpc")
        ).configure_provider()
        on_app_start()
        telemetry_jit.shutdown()
    finally:
        fresh_provider_state()
        receiver.stop()
    (application,) = receiver.received.spans()
    assert application.resource["service.name"] == "builder-app"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_with_a_self_signed_collector_certificate(
    protocol: str, configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certificate, key = self_signed_certificate(tmp_path)
    receiver = (GrpcReceiver if protocol == "grpc" else HttpReceiver)(tls=(certificate, key))
    try:
        # not trusted: nothing is delivered, and the end says so
        untrusted = OTLPExporter(receiver.endpoint, protocol=protocol, timeout=2)
        train(configure(untrusted), epochs=1)
        with pytest.warns(RuntimeWarning, match="0 of [0-9]+ spans delivered"):
            telemetry_jit.shutdown()
        assert receiver.received.spans() == [] and untrusted.dropped > 0
        # trusted through the standard variable: everything arrives encrypted
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(certificate))
        trusted = OTLPExporter(receiver.endpoint, protocol=protocol, timeout=5)
        train(configure(trusted), epochs=1)
        telemetry_jit.shutdown()
    finally:
        receiver.stop()
    assert trusted.dropped == 0
    assert sorted(s.name for s in receiver.received.spans()) == sorted(
        s.name for s in file_run(tmp_path).spans.values()
    )


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_compile_metrics_reach_a_real_otlp_metrics_receiver_next_to_the_spans(
    configure, protocol: str, tmp_path: Path
) -> None:
    receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    try:
        provider = configure(OTLPExporter(receiver.endpoint, protocol=protocol))
        train(provider, epochs=1)
        telemetry_jit.shutdown()  # the last collection goes out at close
    finally:
        receiver.stop()
    compiles = file_run(tmp_path).find("compilation")
    points = receiver.received.metric_points()
    by_name: dict[str, list] = {}
    for point in points:
        by_name.setdefault(point.name, []).append(point)

    def total(name: str, frame: str | None = None) -> float:
        return sum(
            p.value
            for p in by_name.get(name, [])
            if frame is None or p.attributes["telemetry_jit.compile.frame"] == frame
        )

    assert total("telemetry_jit.compilations") == len(compiles) > 0
    for frame in {s.attributes["compile.frame"] for s in compiles}:
        assert total("telemetry_jit.compilations", frame) == len(
            [s for s in compiles if s.attributes["compile.frame"] == frame]
        )
    recompiles = [
        s
        for s in compiles
        if s.attributes["compile.is_recompile"] and s.attributes["compile.trigger"] != "lazy_backward"
    ]
    assert total("telemetry_jit.recompilations") == len(recompiles) > 0
    breaks = sum(s.attributes["compile.graph_breaks"] for s in compiles)
    assert total("telemetry_jit.graph_breaks") == breaks > 0
    (durations,) = [by_name["telemetry_jit.compile.duration"]]
    assert sum(p.count for p in durations) == len(compiles)
    assert sum(p.value for p in durations) == pytest.approx(
        sum(s.duration_ms for s in compiles) / 1000, rel=0.05, abs=0.01
    )
    assert {p.unit for p in durations} == {"s"}
    assert all(p.attributes["telemetry_jit.rank"] == 0 and p.resource["service.name"] == "otlp-app" for p in points)
    # one label per fact: no old names beside OpenTelemetry's
    assert {key for p in points for key in p.attributes} == {
        "telemetry_jit.compile.frame",
        "telemetry_jit.compile.source",
        "telemetry_jit.rank",
    }


@pytest.mark.parametrize(("kwargs", "env"), [({"metrics": False}, {}), ({}, {"OTEL_METRICS_EXPORTER": "none"})])
def test_compile_metrics_can_be_switched_off_spans_still_go(
    configure, kwargs: dict[str, Any], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    receiver = GrpcReceiver()
    try:
        exporter = OTLPExporter(receiver.endpoint, protocol="grpc", **kwargs)
        train(configure(exporter), epochs=1)
        assert exporter.meter_provider is None
        telemetry_jit.shutdown()
    finally:
        receiver.stop()
    assert receiver.received.metric_requests == []
    assert any(span.name == "compilation" for span in receiver.received.spans())


@pytest.mark.parametrize(
    "variable",
    [
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_BSP_EXPORT_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ],
)
@pytest.mark.parametrize("value", ["", "lots", "0", "-5"])
def test_every_otel_value_delivers_everything(
    configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Against a live receiver: a value with which nothing would be sent (zero, negative) or that is no number is
    warned of once, naming the variable, before training, and replaced by its default (the specification); an
    empty one is the default unsaid; either way every span arrives."""
    monkeypatch.setenv(variable, value)
    receiver = GrpcReceiver()
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            provider = configure(OTLPExporter(receiver.endpoint, protocol="grpc"))
        shown = repr(value) if value == "lots" else float(value or 0)
        named = [str(w.message) for w in said if variable in str(w.message)]
        assert len(named) == (1 if value else 0) and all(f"{variable}={shown}" in line for line in named), named
        train(provider, epochs=1)
        telemetry_jit.hook_trainer_cls(pl.Trainer, provider)[1].on_app_end()
        written = file_run(tmp_path)
        assert wait_for(lambda: len(receiver.received.spans()) >= len(written.spans))
        assert {s.name for s in receiver.received.spans()} >= {"compilation", "training_loop", "application"}
    finally:
        receiver.stop()


def test_a_failed_fit_reaches_the_backend_as_opentelemetrys_exception_event(configure, tmp_path: Path) -> None:
    """Backends show ``exception`` events (type, message, stack trace) specially; the resource and the tracer
    say what produced the spans, as OpenTelemetry's conventions name it."""

    class Failing(Net):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise ValueError("a bug in training_step")
            return super().training_step(batch, batch_idx)

    receiver = GrpcReceiver()
    try:
        exporter = OTLPExporter(receiver.endpoint, protocol="grpc", timeout=5)
        provider = configure(exporter)
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
        with pytest.raises(ValueError, match="a bug in training_step"):
            HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Failing(), loader(18, 4))
        callback.on_app_end()
        telemetry_jit.shutdown()
    finally:
        receiver.stop()
    received = receiver.received.spans()
    # the spans the failure ended, the root application span included: status ERROR and error.type
    by_name = {s.name: s for s in received}
    for name in ("application", "training_loop"):
        assert (by_name[name].status_code, by_name[name].attributes.get("error.type")) == (2, "ValueError"), name
    meters = {
        (s.scope.name, s.scope.version)
        for q in receiver.received.metric_requests
        for r in q.resource_metrics
        for s in r.scope_metrics
    }
    assert meters == {("telemetry_jit", importlib.metadata.version("telemetry-jit"))}
    exceptions = [(s, a) for s in received for name, _, a in s.events if name == "exception"]
    assert exceptions, [s.events for s in received]
    span, attributes = exceptions[0]
    assert attributes["exception.type"] == "ValueError"
    assert attributes["exception.message"] == "a bug in training_step"
    assert "training_step" in attributes["exception.stacktrace"]
    assert span.status_code == 2  # STATUS_CODE_ERROR

    resource = received[0].resource
    version = importlib.metadata.version("telemetry-jit")
    # telemetry-jit's version is the recorder's, not the service's (the user's job: OTEL_RESOURCE_ATTRIBUTES names it)
    assert "service.version" not in resource and resource["telemetry_jit.version.telemetry_jit"] == version
    assert resource["process.runtime.name"] == sys.implementation.name
    assert resource["process.runtime.version"] == platform.python_version()
    assert Version(resource["telemetry_jit.version.torch"]).release == Version(torch.__version__).release
    assert not [key for key in resource if key.startswith("version.")]  # one name per fact
    scope = receiver.received.requests[0].resource_spans[0].scope_spans[0]
    assert (scope.scope.name, scope.scope.version) == ("telemetry_jit", version)
    assert scope.schema_url.startswith("https://opentelemetry.io/schemas/")


def test_a_span_exporter_of_the_users_own_carries_the_spans(configure, tmp_path: Path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class Holding(InMemorySpanExporter):  # a custom transport: any OpenTelemetry SpanExporter, even a falsy one
        def __len__(self) -> int:
            return len(self.get_finished_spans())

    own = Holding()
    provider = configure(OTLPExporter(span_exporter=own, metrics=False))
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(8, 4))
    telemetry_jit.shutdown()
    names = [span.name for span in own.get_finished_spans()]
    assert {"application", "training_loop", "compilation"} <= set(names), names
    assert names.count("application") == len(file_run(tmp_path).find("application")) == 1
