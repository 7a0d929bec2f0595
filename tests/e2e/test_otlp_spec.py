"""OpenTelemetry's specification, checked on what real receivers decode: the operator's resource attributes win,
every fact goes out once with no unit in its name, a sampled trace is whole, a variable OpenTelemetry cannot use is
warned of and replaced by its default, and requests, the queue and attribute limits are handled before the fact."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

import telemetry_jit
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import GrpcReceiver, Received, ReceivedSpan
from tests.e2e.test_otlp_exporter import JIT
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch
VERSION = importlib.metadata.version("telemetry-jit")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    fresh_provider_state()
    yield
    fresh_provider_state()


def received(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], **otlp: object) -> Received:
    """What a gRPC receiver decoded from one fit (a graph break, a recompile) with ``variables`` set."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    receiver = GrpcReceiver()
    try:
        session = telemetry_jit.configure(
            "spec-app", file=tmp_path / "t.jsonl", otlp={"endpoint": receiver.endpoint, **otlp}
        )
        trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
        trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(12, 4))
        telemetry_jit.shutdown()
    finally:
        receiver.stop()
    return receiver.received


def test_the_operators_resource_attributes_win_and_the_products_version_has_its_own_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = {"service.version": "9.9.9", "host.name": "myhost", "service.instance.id": "pod-7"}
    got = received(tmp_path, monkeypatch, {"OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in given.items())})
    resources = [s.resource for s in got.spans()] + [p.resource for p in got.metric_points()]
    assert resources
    for resource in resources:
        assert {key: resource.get(key) for key in given} == given
        assert resource["telemetry_jit.version.telemetry_jit"] == VERSION


def test_the_products_version_is_not_the_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resource = received(tmp_path, monkeypatch, {}).spans()[0].resource
    assert "service.version" not in resource  # the service is the user's training job, not telemetry-jit
    assert resource["telemetry_jit.version.telemetry_jit"] == VERSION


_UNIT = re.compile(r"_(msec|ms|sec|s|seconds|millis)$")


def test_every_fact_once_and_no_unit_in_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = received(tmp_path, monkeypatch, {}).spans()
    named = [(span.name, span.attributes) for span in spans]
    named += [(f"{span.name}/{event}", attributes) for span in spans for event, _, attributes in span.events]
    assert any(name.endswith("/graph_break") for name, _ in named), [name for name, _ in named]
    assert any(name.endswith("/compile_summary") for name, _ in named)
    for name, attributes in named:
        assert not [key for key in attributes if _UNIT.search(key)], (name, attributes)
        assert not [key for key, value in attributes.items() if value in ([], "")], (name, attributes)
        reason, kind = attributes.get("telemetry_jit.graph_break.reason"), attributes.get("telemetry_jit.graph_break.type")
        assert kind is None or kind != reason, (name, attributes)
    assert {"service.version", "telemetry_jit.version.telemetry_jit"} - set(spans[0].resource)


def _links(got: Received) -> dict[str, list[tuple[str, dict]]]:
    """Each span's links: (linked span id, attributes)."""
    links: dict[str, list[tuple[str, dict]]] = {}
    for request in got.requests:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    links[span.span_id.hex()] = [
                        (link.span_id.hex(), {a.key: a.value.string_value for a in link.attributes})
                        for link in span.links
                    ]
    return links


def _unsampled_run_id(ratio: float) -> str:
    """A run id whose trace (its id derived from the run id, as the exporter derives it) a ratio sampler leaves out."""
    for n in range(1000):
        run = f"run-{n}"
        trace_id = int(hashlib.sha256(run.encode()).hexdigest()[:32], 16)
        if not TraceIdRatioBased(ratio).should_sample(None, trace_id, "application").decision.is_sampled():
            return run
    raise AssertionError("no such run id")


@pytest.mark.parametrize(
    "sampler", [("traceidratio", "0.1"), ("parentbased_traceidratio", "0.1"), ("always_off", "")], ids=str
)
def test_a_sampled_trace_is_whole(sampler: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, argument = sampler
    variables = {"OTEL_TRACES_SAMPLER": name, "TELEMETRY_JIT_RUN_ID": _unsampled_run_id(0.1)}
    if argument:
        variables["OTEL_TRACES_SAMPLER_ARG"] = argument
    got = received(tmp_path, monkeypatch, variables)
    spans: list[ReceivedSpan] = got.spans()
    ids = {span.span_id for span in spans}
    compiles = [span for span in spans if span.name == "compilation"]
    assert compiles and "application" not in {span.name for span in spans}  # the sampler left the run's spans out
    orphans = [(span.name, span.parent_span_id) for span in spans if span.parent_span_id and span.parent_span_id not in ids]
    assert not orphans
    links = _links(got)
    for span in compiles:  # each a root linked to the loop span it ran under
        assert [attributes for _, attributes in links[span.span_id]] == [
            {"telemetry_jit.sampled_out_parent": "training_loop"}
        ]
