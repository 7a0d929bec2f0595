"""OpenTelemetry as operators run it, against real receivers on loopback: the service named from the job's
environment, one instance per process, the sampler variables, histogram bounds made for compile seconds,
metrics a backend refuses said and counted, and no secret of the endpoint printed or written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest

import telemetry_jit
from telemetry_jit.schema import COMPILE_DURATION_BOUNDS, MetricName
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import GrpcReceiver, HttpReceiver
from tests.e2e.test_otlp_exporter import JIT, free_port
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    fresh_provider_state()
    yield
    fresh_provider_state()


def fit(endpoint: str, tmp_path: Path, protocol: str = "grpc", app: str = "app-in-code", **otlp: object) -> None:
    session = telemetry_jit.configure(
        app, file=tmp_path / "t.jsonl", otlp={"endpoint": endpoint, "protocol": protocol, **otlp}
    )
    trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
    trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(12, 4))
    telemetry_jit.shutdown()


def received_over_grpc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], **otlp: object):
    """What a gRPC receiver got from one fit run with ``variables`` set."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    receiver = GrpcReceiver()
    try:
        fit(receiver.endpoint, tmp_path, **otlp)
    finally:
        receiver.stop()
    return receiver.received


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_SERVICE_NAME": "svc-from-env"}, "svc-from-env"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=svc-attr,team=jit"}, "svc-attr"),
        ({"OTEL_SERVICE_NAME": "svc-from-env", "OTEL_RESOURCE_ATTRIBUTES": "service.name=svc-attr"}, "svc-from-env"),
        ({}, "app-in-code"),
    ],
)
def test_the_jobs_environment_names_the_service_over_configures_app_name(
    variables: dict[str, str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    received = received_over_grpc(tmp_path, monkeypatch, variables)
    names = {s.resource["service.name"] for s in received.spans()}
    names |= {p.resource["service.name"] for p in received.metric_points()}
    assert names == {named}


def test_an_argument_in_code_still_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    received = received_over_grpc(tmp_path, monkeypatch, {"OTEL_SERVICE_NAME": "env"}, service_name="in-code")
    assert {s.resource["service.name"] for s in received.spans()} == {"in-code"}


_ONE_PROCESS = """
import sys, telemetry_jit
session = telemetry_jit.configure("ranks", file=None, otlp=sys.argv[1])
session.start_application()
telemetry_jit.shutdown()
"""


def test_every_process_of_a_run_is_its_own_service_instance(tmp_path: Path) -> None:
    """Two ranks of one run (one run id, as torchrun gives them): two ``service.instance.id``, one run id."""
    receiver = GrpcReceiver()
    try:
        environment = {**os.environ, "TELEMETRY_JIT_RUN_ID": "run-shared-by-ranks", "OTEL_METRICS_EXPORTER": "none"}
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", _ONE_PROCESS, receiver.endpoint],
                env={**environment, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"},
                cwd=tmp_path,
            )
            for rank in range(2)
        ]
        assert [process.wait(timeout=120) for process in ranks] == [0, 0]
    finally:
        receiver.stop()
    resources = [s.resource for s in receiver.received.spans() if s.name == "application"]
    assert len(resources) == 2
    assert len({r["service.instance.id"] for r in resources}) == 2
    assert {r["telemetry_jit.run_id"] for r in resources} == {"run-shared-by-ranks"}


@pytest.mark.parametrize(
    "sampler",
    [{"OTEL_TRACES_SAMPLER": "always_off"}, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}],
)
def test_the_sampler_variables_are_honoured_and_compile_spans_always_kept(
    sampler: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = {s.name for s in received_over_grpc(tmp_path, monkeypatch, sampler).spans()}
    assert sent == {"compilation"}
    health = _health(tmp_path)
    assert health["spans_sampled_out"] >= 2 and health["spans_dropped"] == 0  # left out is not lost


def test_a_sampler_opentelemetry_does_not_know_is_warned_of_and_its_default_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.warns(RuntimeWarning, match="OTEL_TRACES_SAMPLER='sometimes': OpenTelemetry cannot use it"):
        spans = received_over_grpc(tmp_path, monkeypatch, {"OTEL_TRACES_SAMPLER": "sometimes"}).spans()
    assert {"application", "training_loop", "compilation"} <= {s.name for s in spans}  # the default: all sampled


@pytest.mark.parametrize("aggregation", [None, "explicit_bucket_histogram", "base2_exponential_bucket_histogram"])
def test_compile_durations_land_in_buckets_made_for_seconds(
    aggregation: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variables = {} if aggregation is None else {"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": aggregation}
    received = received_over_grpc(tmp_path, monkeypatch, variables)
    kinds, bounds = set(), set()
    for request in received.metric_requests:
        for metric in (m for r in request.resource_metrics for s in r.scope_metrics for m in s.metrics):
            if metric.name == MetricName.COMPILE_DURATION:
                kinds.add(metric.WhichOneof("data"))
                if metric.HasField("histogram"):
                    bounds |= {tuple(p.explicit_bounds) for p in metric.histogram.data_points}
    if aggregation == "base2_exponential_bucket_histogram":
        assert kinds == {"exponential_histogram"}
    else:
        assert kinds == {"histogram"} and bounds == {COMPILE_DURATION_BOUNDS}
        # made for compile times in seconds: from milliseconds to an hour, with room between (the SDK's default,
        # 0, 5, 10, ... 10000, puts every compile under 5 s in one bucket)
        assert COMPILE_DURATION_BOUNDS[0] <= 0.01 and COMPILE_DURATION_BOUNDS[-1] >= 3600
        steps = zip(COMPILE_DURATION_BOUNDS, COMPILE_DURATION_BOUNDS[1:], strict=False)
        assert all(high / low <= 3 for low, high in steps)
    scopes = {
        (s.scope.name, s.scope.version) for q in received.metric_requests for r in q.resource_metrics
        for s in r.scope_metrics
    }  # fmt: skip
    assert scopes == {("telemetry_jit", telemetry_jit.__version__)}


def test_metrics_a_traces_only_backend_refuses_are_said_once_and_counted(tmp_path: Path) -> None:
    receiver = HttpReceiver(traces_only=True)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            fit(receiver.endpoint, tmp_path, protocol="http/protobuf")
    finally:
        receiver.stop()
    about_metrics = [str(w.message) for w in said if "could not deliver metrics" in str(w.message)]
    assert len(about_metrics) == 1 and "405" in about_metrics[0], [str(w.message) for w in said]
    assert receiver.received.refused >= 1 and receiver.received.spans()
    health = _health(tmp_path)
    assert health["metric_exports_failed"] == health["metric_exports"] >= 1
    assert health["spans_delivered"] == health["spans"] > 0
    summary = subprocess.run(
        [sys.executable, "-m", "telemetry_jit", "summary", str(tmp_path / "t.jsonl")], capture_output=True, text=True
    ).stdout
    said = f"{health['metric_exports_failed']} of {health['metric_exports']} metric export"
    assert said in " ".join(summary.split())  # the summary's line, wrapped to the terminal


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_token_in_the_endpoint_is_never_printed_or_written(
    protocol: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """User info, query and fragment of an endpoint nobody answers at: the warning, the run file's health
    record and the summary show the endpoint with ``***`` in their place."""
    port = free_port()
    endpoint = f"http://user:TOKEN1@127.0.0.1:{port}/v1/traces?api_key=TOKEN2#TOKEN3"
    if protocol == "grpc":
        endpoint = f"http://127.0.0.1:{port}?api_key=TOKEN2"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(endpoint, tmp_path, protocol=protocol, timeout=1)
    warned = "\n".join(str(w.message) for w in said)
    assert "could not deliver spans" in warned
    summary = subprocess.run(
        [sys.executable, "-m", "telemetry_jit", "summary", str(tmp_path / "t.jsonl")],
        capture_output=True,
        text=True,
        check=False,
    )
    printed = capfd.readouterr()
    everything = warned + (tmp_path / "t.jsonl").read_text() + summary.stdout + summary.stderr
    everything += printed.out + printed.err
    assert "127.0.0.1" in everything and "***" in everything
    for token in ("TOKEN1", "TOKEN2", "TOKEN3"):
        assert token not in everything


def _health(tmp_path: Path) -> dict[str, int]:
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines() if line.strip()]
    (health,) = [r for r in records if r.get("kind") == "health"]
    (delivery,) = [d for name, d in health["exporters"].items() if name.startswith("OTLPExporter")]
    return delivery


def test_a_collector_that_is_down_is_said_with_each_signals_own_reason(tmp_path: Path) -> None:
    """Spans and metrics fail alike over gRPC, logged in one format by one logger, which OpenTelemetry's own
    DuplicateFilter (it drops a line whose format it saw in the last 20 s) sits on: each warning still has the
    reason OpenTelemetry gave, not a guess."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fit(f"http://127.0.0.1:{free_port()}", tmp_path, timeout=0.5)  # below gRPC's first backoff: no retry
    warned = [str(w.message) for w in said]
    spans = [text for text in warned if "could not deliver spans" in text]
    metrics = [text for text in warned if "could not deliver metrics" in text]
    assert spans and "Failed to export traces to 127.0.0.1" in spans[0], warned
    assert len(metrics) == 1 and "Failed to export metrics to 127.0.0.1" in metrics[0], warned
