"""The Grafana dashboard example is consistent: its files parse, the collector feeds Tempo, and
every query names spans and attributes telemetry-jit really writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from telemetry_jit.schema import MetricName
from tests.e2e.conftest import dashboard_builder

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


def _committed() -> dict:
    return json.loads((DASHBOARD / "grafana/dashboards/telemetry-jit.json").read_text())


def test_the_committed_dashboard_is_the_one_the_builder_builds() -> None:
    builder = dashboard_builder()
    assert (DASHBOARD / "grafana/dashboards/telemetry-jit.json").read_text() == builder.render(), (
        "run python examples/dashboard/build_dashboard.py"
    )
    assert builder.main(["--check"]) == 0


def test_the_dashboard_validates_against_grafanas_published_schema() -> None:
    """Grafana's dashboard schema (v10.4, grafana/grok, Apache-2.0: tests/data/grafana/README.md): the dashboard is
    its ``spec``. Queries are each data source's own: checked against the SDK's typed models below."""
    jsonschema = pytest.importorskip("jsonschema", reason="the test extra has jsonschema")
    document = json.loads((Path(__file__).parents[1] / "data/grafana/dashboard_types_gen.json").read_text())
    schema = {"$ref": "#/components/schemas/dashboard/properties/spec", "components": document["components"]}
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    dashboard = _committed()
    assert [error.message for error in validator.iter_errors(dashboard)] == []
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][0]["gridPos"]["h"] = "8"  # the schema is no formality: a wrong type is refused
    assert list(validator.iter_errors(broken))


def test_queries_are_in_the_forms_grafanas_data_sources_accept() -> None:
    """Tempo's source has no branch for queryType ``traceqlMetrics``: TraceQL and TraceQL-metrics queries are both
    ``traceql``. Every data source is an input (``${DS_...}``), asked for on import and chosen by a variable."""
    dashboard_builder()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import prometheus, tempo

    dashboard = _committed()
    inputs = {i["name"]: i["pluginId"] for i in dashboard["__inputs"] if i["type"] == "datasource"}
    assert inputs == {"DS_TEMPO": "tempo", "DS_PROMETHEUS": "prometheus"}
    variables = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"}
    assert variables == inputs
    for panel in dashboard["panels"]:
        kind = panel["datasource"]["type"]
        assert panel["datasource"]["uid"] == f"${{DS_{kind.upper()}}}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            if kind == "tempo":
                assert target["queryType"] in {t.value for t in tempo.TempoQueryType}, panel["title"]
                assert target["queryType"] == tempo.TempoQueryType.TRACEQL and target["query"], panel["title"]
                model = tempo.TempoQuery.from_json(target)
            else:
                assert kind == "prometheus" and target["expr"] and "queryType" not in target, panel["title"]
                model = prometheus.Dataquery.from_json(target)
            assert json.loads(json.dumps(model, cls=JSONEncoder)) == target, panel["title"]  # no stray keys


def test_the_readme_table_gives_the_dashboards_own_queries() -> None:
    dashboard = _committed()
    rows = {}
    for line in (DASHBOARD / "README.md").read_text().splitlines():
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        if len(cells) == 3 and cells[0].strip() not in {"panel", "---"}:
            queries = [query.replace("\\|", "|") for query in re.findall(r"`([^`]+)`", cells[2])]
            rows[cells[0].strip()] = queries
    assert rows == {
        panel["title"]: [target.get("query") or target["expr"] for target in panel["targets"]]
        for panel in dashboard["panels"]
    }
