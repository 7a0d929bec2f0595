"""The Grafana dashboard example is consistent: its files parse, the collector feeds Tempo, and
every query names spans and attributes telemetry-jit really writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from telemetry_jit.schema import CompileAttr, MetricName
from tests.e2e.conftest import Telemetry

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


def test_every_dashboard_query_names_real_spans_and_attributes(telemetry: Telemetry) -> None:
    import lightning.pytorch as pl

    from telemetry_jit import JitConfig, hook_trainer_cls
    from tests.models import TRAINER_DEFAULTS, Net, loader

    HookedTrainer, callback = hook_trainer_cls(
        pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4))
    callback.on_app_end()
    run = telemetry.run()
    span_attributes = {key for span in run.spans.values() for key in span.attributes} | {"rank"}
    event_attributes = {key for span in run.spans.values() for event in span.events for key in event.attributes}
    event_names = {event.name for span in run.spans.values() for event in span.events}
    dashboard = json.loads((DASHBOARD / "grafana/dashboards/telemetry-jit.json").read_text())
    assert {"Recompiles over time, by frame", "Graph breaks over time, by location"} <= {
        panel["title"] for panel in dashboard["panels"]
    }
    names = [name.replace(".", "_") for key, name in vars(MetricName).items() if key.isupper()]
    duration = MetricName.COMPILE_DURATION.replace(".", "_")
    # Prometheus names: counters end in _total, a histogram in seconds is read as _seconds_sum/_count
    metrics = {f"{name}_total" for name in names if name != duration}
    metrics |= {f"{duration}_seconds_{series}" for series in ("sum", "count", "bucket")}
    for panel in [p for p in dashboard["panels"] if p["datasource"]["type"] == "prometheus"]:
        for target in panel["targets"]:  # Prometheus names: dots become underscores, counters end in _total
            assert set(re.findall(r"telemetry_jit_\w+", target["expr"])) <= metrics, panel["title"]
            for label in re.findall(r"by \(([^)]*)\)", target["expr"])[0].split(","):
                labels = {name.replace(".", "_") for name in (CompileAttr.FRAME, CompileAttr.SOURCE, "rank")}
                assert label.strip() in labels, (panel["title"], label)
    for panel in [p for p in dashboard["panels"] if p["datasource"]["type"] == "tempo"]:
        query = panel["targets"][0]["query"]
        for name in re.findall(r'(?<![:\w])name = "([^"]+)"', query):
            assert run.find(name), (panel["title"], name)
        for name in re.findall(r'event:name = "([^"]+)"', query):
            assert name in event_names, (panel["title"], name)
        for attribute in re.findall(r'span\.(?:"([^"]+)"|(\w+))', query):
            assert (attribute[0] or attribute[1]) in span_attributes, (panel["title"], attribute)
        for attribute in re.findall(r'event\."([^"]+)"', query):
            assert attribute in event_attributes, (panel["title"], attribute)
