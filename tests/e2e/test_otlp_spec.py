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
        reason, kind = (
            attributes.get("telemetry_jit.graph_break.reason"),
            attributes.get("telemetry_jit.graph_break.type"),
        )
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
    orphans = [
        (span.name, span.parent_span_id) for span in spans if span.parent_span_id and span.parent_span_id not in ids
    ]
    assert not orphans
    links = _links(got)
    for span in compiles:  # each a root linked to the loop span it ran under
        assert [attributes for _, attributes in links[span.span_id]] == [
            {"telemetry_jit.sampled_out_parent": "training_loop"}
        ]


def test_variables_opentelemetry_cannot_use_are_warned_of_once_and_replaced_by_their_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = {
        "OTEL_EXPORTER_OTLP_TIMEOUT": "lots",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "-4",
        "OTEL_TRACES_SAMPLER": "sometimes",
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "-3",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "zip",  # gRPC's exporter raises for it as it is built
        "OTEL_EXPORTER_OTLP_INSECURE": "yes please",
        "OTEL_RESOURCE_ATTRIBUTES": "team=jit,oops",
        "OTEL_METRICS_EXPORTER": "otpl",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such/ca.pem",
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = received(tmp_path, monkeypatch, bad)
    said = [str(w.message) for w in caught if "the default" in str(w.message)]
    for variable in bad:
        assert len([line for line in said if line.startswith(f"telemetry-jit: {variable}")]) == 1, (variable, said)
    spans = got.spans()
    assert {"application", "training_loop", "compilation"} <= {span.name for span in spans}  # all defaults: all kept
    assert spans[0].resource["team"] == "jit"
    assert got.metric_points()  # OTEL_METRICS_EXPORTER's default, otlp


def test_the_timeout_variable_is_milliseconds_as_the_specification_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from telemetry_jit.exporters.otlp_settings import OTLPOptions, OTLPSettings

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "10000")
    settings = OTLPSettings.resolve(OTLPOptions())
    assert settings.targets["traces"].timeout_s == settings.targets["metrics"].timeout_s == 10.0
    assert OTLPSettings.resolve(OTLPOptions(timeout=3)).targets["traces"].timeout_s == 3  # the argument: seconds


def test_every_request_is_within_the_bound_before_it_is_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = received(tmp_path, monkeypatch, {"TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES": "3000"})
    assert got.raw and max(len(raw) for raw in got.raw) <= 3000, sorted(len(raw) for raw in got.raw)
    assert len(got.raw) > 1 and [span for span in got.spans() if span.name == "compilation"]
    # a span larger than any request (the failed compile's whole error text) is said and counted, never sent
    said = " ".join(str(w.message) for w in caught)
    assert "over the request limit of 3000" in said, said


def test_spans_the_queue_drops_are_said_as_queue_drops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = received(tmp_path, monkeypatch, {"OTEL_BSP_MAX_QUEUE_SIZE": "1"})
    said = " ".join(str(w.message) for w in caught if "spans delivered" in str(w.message))
    dropped = re.search(r"(\d+) of (\d+) spans delivered.*?(\d+) dropped by the batch queue", said)
    assert dropped, said
    delivered, ended, queue_dropped = map(int, dropped.groups())
    assert queue_dropped > 0 and delivered == len(got.spans()) == ended - queue_dropped
    assert "unreachable" not in said and "export timeout" not in said


def test_at_an_attribute_limit_the_useful_attributes_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = [
        span
        for span in received(tmp_path, monkeypatch, {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "8"}).spans()
        if span.name == "compilation"
    ]
    assert compiles
    for span in compiles:
        assert len(span.attributes) <= 8
        kept = {"telemetry_jit.compile.id", "telemetry_jit.compile.frame", "telemetry_jit.compile.duration"}
        assert kept <= set(span.attributes), span.attributes


def _root_and_rest(got: Received) -> tuple[ReceivedSpan, list[ReceivedSpan]]:
    """The run's root span and the other spans the receiver got in its trace."""
    spans = got.spans()
    (root,) = [span for span in spans if not span.parent_span_id and span.name == "application"]
    return root, [span for span in spans if span is not root and span.trace_id == root.trace_id]


def test_the_root_span_counts_what_the_run_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, rest = _root_and_rest(received(tmp_path, monkeypatch, {}))
    counts = {key: value for key, value in root.attributes.items() if key.startswith("telemetry_jit.run.")}
    compiles = [span for span in rest if span.name == "compilation"]
    assert compiles and counts["telemetry_jit.run.spans"] == len(rest), (counts, [s.name for s in rest])
    assert counts["telemetry_jit.run.compilation_spans"] == len(compiles)
    events = [name for span in [root, *rest] for name, _, _ in span.events]
    assert counts["telemetry_jit.run.events"] == len(events)
    assert counts["telemetry_jit.run.graph_break_events"] == events.count("graph_break") > 0
    assert counts["telemetry_jit.run.spans_dropped"] == counts["telemetry_jit.run.exports_failed"] == 0
    # at an attribute count limit the counts are what the root keeps
    root, _ = _root_and_rest(received(tmp_path, monkeypatch, {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "3"}))
    assert set(root.attributes) == {
        "telemetry_jit.run.spans",
        "telemetry_jit.run.compilation_spans",
        "telemetry_jit.run.spans_dropped",
    }, root.attributes


def test_a_root_span_says_the_spans_its_run_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the failed compile's span (its whole error text) is over any request of 3000 bytes: dropped, the rest sent
    got = received(tmp_path, monkeypatch, {"TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES": "3000"})
    root, rest = _root_and_rest(got)
    sent, dropped = root.attributes["telemetry_jit.run.spans"], root.attributes["telemetry_jit.run.spans_dropped"]
    assert dropped > 0 and sent == len(rest) + dropped, (root.attributes, [s.name for s in rest])
    assert root.attributes["telemetry_jit.run.compilation_spans"] > len([s for s in rest if s.name == "compilation"])


_TLS_TO_A_PLAIN_RECEIVER = """
import sys, telemetry_jit
otlp = {"endpoint": sys.argv[1], "timeout": 1, "metrics": False}
session = telemetry_jit.configure("tls", file=sys.argv[2], otlp=otlp)
session.start_application()
telemetry_jit.shutdown()
"""


def test_grpcs_own_tls_lines_stay_off_stderr(tmp_path: Path) -> None:
    """A TLS endpoint whose receiver speaks plain gRPC: every handshake fails, which gRPC's C core writes to stderr
    itself, line after line; telemetry-jit's one warning says it instead."""
    receiver = GrpcReceiver()
    try:
        endpoint = f"https://127.0.0.1:{receiver.port}"
        command = [sys.executable, "-c", _TLS_TO_A_PLAIN_RECEIVER, endpoint, str(tmp_path / "t.jsonl")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        receiver.stop()
    assert done.returncode == 0, done.stderr
    assert "could not deliver spans" in done.stderr  # said once, in telemetry-jit's words
    assert "ssl_transport_security" not in done.stderr and "Handshake failed" not in done.stderr, done.stderr
