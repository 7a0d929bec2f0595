"""The Grafana dashboard example is consistent: its files parse, the collector feeds Tempo, and
every query names spans and attributes telemetry-jit really writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from telemetry_jit.schema import MetricName

pytestmark = pytest.mark.any_torch

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "dashboard"


def test_compose_collector_and_provisioning_fit_together() -> None:
    compose = yaml.safe_load((DASHBOARD / "docker-compose.yml").read_text())
    assert {"otel-collector", "tempo", "grafana"} <= set(compose["services"])
    assert "4317:4317" in compose["services"]["otel-collector"]["ports"]
    collector = yaml.safe_load((DASHBOARD / "otel-collector.yaml").read_text())
    assert collector["exporters"]["otlp/tempo"]["endpoint"] == "tempo:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/tempo"]
    source = yaml.safe_load((DASHBOARD / "grafana/provisioning/datasources/tempo.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://tempo:3200"
    provider = yaml.safe_load((DASHBOARD / "grafana/provisioning/dashboards/telemetry-jit.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    # metrics: collector -> its Prometheus endpoint -> Prometheus -> Grafana
    assert "prometheus" in compose["services"]
    assert collector["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus"]
    port = collector["exporters"]["prometheus"]["endpoint"].rsplit(":", 1)[1]
    scrape = yaml.safe_load((DASHBOARD / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == [f"otel-collector:{port}"]
    source = yaml.safe_load((DASHBOARD / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"


def test_every_dashboard_query_names_real_spans_and_attributes(tmp_path: Path) -> None:
    """The names each query reads are the names a real collector receives: spans, events and metrics of a
    real fit sent over OTLP to a receiver on loopback."""
    import lightning.pytorch as pl

    import telemetry_jit
    from telemetry_jit import JitConfig, hook_trainer_cls
    from telemetry_jit.exporters import OTLPExporter
    from tests.e2e.conftest import fresh_provider_state
    from tests.e2e.otlp_receivers import GrpcReceiver
    from tests.models import TRAINER_DEFAULTS, Net, loader

    fresh_provider_state()
    receiver = GrpcReceiver()
    try:
        exporter = OTLPExporter(receiver.endpoint, protocol="grpc", timeout=5)
        session = telemetry_jit.configure("dashboard", file=tmp_path / "t.jsonl", otlp=exporter)
        HookedTrainer, callback = hook_trainer_cls(
            pl.Trainer, session, jit_config=JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
        )
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4))
        callback.on_app_end()
    finally:
        receiver.stop()
        fresh_provider_state()
    spans = receiver.received.spans()
    span_names = {span.name for span in spans}
    span_attributes = {key for span in spans for key in span.attributes}
    event_attributes = {key for span in spans for _, _, attributes in span.events for key in attributes}
    event_names = {name for span in spans for name, _, _ in span.events}
    points = receiver.received.metric_points()
    labels = {key.replace(".", "_") for point in points for key in point.attributes}
    dashboard = json.loads((DASHBOARD / "grafana/dashboards/telemetry-jit.json").read_text())
    assert {"Recompiles over time, by frame", "Graph breaks over time, by location"} <= {
        panel["title"] for panel in dashboard["panels"]
    }
    names = [name.replace(".", "_") for key, name in vars(MetricName).items() if key.isupper()]
    duration = MetricName.COMPILE_DURATION.replace(".", "_")
    # Prometheus names: counters end in _total, a histogram in seconds is read as _seconds_sum/_count
    metrics = {f"{name}_total" for name in names if name != duration}
    metrics |= {f"{duration}_seconds_{series}" for series in ("sum", "count", "bucket")}
    assert {point.name.replace(".", "_") for point in points} >= {name for name in names}
    for panel in [p for p in dashboard["panels"] if p["datasource"]["type"] == "prometheus"]:
        for target in panel["targets"]:  # Prometheus names: dots become underscores, counters end in _total
            assert set(re.findall(r"telemetry_jit_\w+", target["expr"])) - labels <= metrics, panel["title"]
            for label in re.findall(r"by \(([^)]*)\)", target["expr"])[0].split(","):
                assert label.strip() in labels and label.strip().startswith("telemetry_jit_"), (panel["title"], label)
            for label in re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")):  # a legend names labels sent
                assert label in labels, (panel["title"], label)
    for panel in [p for p in dashboard["panels"] if p["datasource"]["type"] == "tempo"]:
        query = panel["targets"][0]["query"]
        for name in re.findall(r'(?<![:\w])name = "([^"]+)"', query):
            assert name in span_names, (panel["title"], name)
        for name in re.findall(r'event:name = "([^"]+)"', query):
            assert name in event_names, (panel["title"], name)
        for attribute in re.findall(r'span\.(?:"([^"]+)"|(\w+))', query):
            name = attribute[0] or attribute[1]
            assert name in span_attributes and name.startswith("telemetry_jit."), (panel["title"], name)
        for attribute in re.findall(r'event\."([^"]+)"', query):
            assert attribute in event_attributes and attribute.startswith("telemetry_jit."), (panel["title"], attribute)
