"""Build grafana/dashboards/telemetry-jit.json from typed Python (grafana-foundation-sdk, the test extra).

    python examples/dashboard/build_dashboard.py          # writes the JSON beside this file
    python examples/dashboard/build_dashboard.py --check  # exits 1 when the committed JSON differs

The queries live here once: the README's table, docs/exporters.md and the tests read the same strings
(tests/e2e/test_dashboard.py, tests/e2e/test_prometheus.py runs every PromQL query against a real Prometheus).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, table, tempo, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos
from grafana_foundation_sdk.models.tempo import SearchTableType, TempoQueryType

OUTPUT = Path(__file__).resolve().parent / "grafana" / "dashboards" / "telemetry-jit.json"
# imported into an existing stack, Grafana asks for these two (__inputs); elsewhere the dashboard's datasource
# variables of the same names choose them
TEMPO = DataSourceRef(type_val="tempo", uid="${DS_TEMPO}")
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${DS_PROMETHEUS}")
INPUTS = [
    {"name": "DS_TEMPO", "label": "Tempo", "type": "datasource", "pluginId": "tempo", "pluginName": "Tempo"},
    {
        "name": "DS_PROMETHEUS",
        "label": "Prometheus",
        "type": "datasource",
        "pluginId": "prometheus",
        "pluginName": "Prometheus",
    },
]

COMPILATION = '{ name = "compilation" }'
# TraceQL; a query with a metrics function (count_over_time, avg_over_time) is a TraceQL metrics query, which
# Grafana's Tempo source runs from queryType "traceql" as well
TRACEQL = {
    "compile time by frame": f'{COMPILATION} | avg_over_time(duration) by (span."telemetry_jit.compile.frame")',
    "recompiles by frame": '{ name = "compilation" && span."telemetry_jit.compile.is_recompile" = true } '
    '| count_over_time() by (span."telemetry_jit.compile.frame")',
    "graph breaks by location": '{ event:name = "graph_break" } '
    '| count_over_time() by (event."telemetry_jit.graph_break.location")',
    "compilations by rank": f'{COMPILATION} | count_over_time() by (span."telemetry_jit.rank")',
    "every compilation": f"{COMPILATION} | select("
    + ", ".join(
        f'span."telemetry_jit.{name}"'
        for name in (
            "train.global_step",
            "train.stage",
            "compile.frame",
            "compile.location",
            "compile.is_recompile",
            "compile.recompile_reason",
            "compile.graph_breaks",
            "compile.backend",
            "rank",
        )
    )
    + ")",
    "compilations with graph breaks": '{ name = "compilation" && span."telemetry_jit.compile.graph_breaks" > 0 } '
    '| select(span."telemetry_jit.compile.frame", span."telemetry_jit.compile.location", '
    'span."telemetry_jit.compile.graph_breaks", span."telemetry_jit.rank")',
}

_BY_FRAME = "sum by (telemetry_jit_compile_frame, telemetry_jit_rank)"
_SECONDS_BY_RANK = "sum by (telemetry_jit_rank) (telemetry_jit_compile_duration_seconds_sum)"
# PromQL over the metrics as Prometheus names them (dots become underscores, counters end in _total, the
# histogram in seconds is read as _seconds_sum/_count/_bucket). Counters are cumulative from the process's start:
# each query reads the run's figures so far
PROMQL = {
    "compilations by frame and rank": f"{_BY_FRAME} (telemetry_jit_compilations_total)",
    "recompiles by frame and rank": f"{_BY_FRAME} (telemetry_jit_recompilations_total)",
    "graph breaks by frame and rank": f"{_BY_FRAME} (telemetry_jit_graph_breaks_total)",
    "compile seconds by rank": _SECONDS_BY_RANK,
    "compile skew between ranks": f"max({_SECONDS_BY_RANK}) - min({_SECONDS_BY_RANK})",
}
# alert rules docs/exporters.md gives: a query above, and a threshold
ALERTS = {
    "recompile storm": "sum by (telemetry_jit_compile_frame) (telemetry_jit_recompilations_total) > 20",
    "compile skew": f"{PROMQL['compile skew between ranks']} > 60",
}


def _tempo(query: str, table_type: SearchTableType | None = None) -> tempo.TempoQuery:
    target = tempo.TempoQuery().ref_id("A").datasource(TEMPO).query_type(TempoQueryType.TRACEQL).query(query)
    if table_type is not None:
        target = target.table_type(table_type).limit(200).spss(50)
    return target


def _promql(ref_id: str, query: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().ref_id(ref_id).datasource(PROMETHEUS).expr(query).range().legend_format(legend)


def _at(x: int, y: int, w: int, h: int) -> GridPos:
    return GridPos(x=x, y=y, w=w, h=h)


def build() -> dict[str, Any]:
    """The dashboard as Grafana imports it."""
    frame_rank = "{{telemetry_jit_compile_frame}} rank {{telemetry_jit_rank}}"
    panels: list[Any] = [
        timeseries.Panel()
        .title("Compile time per compilation, by frame")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["compile time by frame"]))
        .unit("s")
        .grid_pos(_at(0, 0, 12, 8)),
        timeseries.Panel()
        .title("Recompiles over time, by frame")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["recompiles by frame"]))
        .grid_pos(_at(12, 0, 12, 8)),
        timeseries.Panel()
        .title("Graph breaks over time, by location")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["graph breaks by location"]))
        .grid_pos(_at(0, 8, 12, 8)),
        timeseries.Panel()
        .title("Compilations by rank")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["compilations by rank"]))
        .grid_pos(_at(12, 8, 12, 8)),
        table.Panel()
        .title("Compile time per step: every compilation with its step, duration, frame and recompile reason")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["every compilation"], SearchTableType.SPANS))
        .grid_pos(_at(0, 16, 24, 9)),
        table.Panel()
        .title("Graph breaks (location and reason, on their compilation span)")
        .datasource(TEMPO)
        .with_target(_tempo(TRACEQL["compilations with graph breaks"], SearchTableType.SPANS))
        .grid_pos(_at(0, 25, 24, 9)),
        timeseries.Panel()
        .title("Compilations, recompiles and graph breaks so far, by frame and rank (metrics, for alerts)")
        .datasource(PROMETHEUS)
        .with_target(_promql("A", PROMQL["compilations by frame and rank"], f"compilations {frame_rank}"))
        .with_target(_promql("B", PROMQL["recompiles by frame and rank"], f"recompiles {frame_rank}"))
        .with_target(_promql("C", PROMQL["graph breaks by frame and rank"], f"graph breaks {frame_rank}"))
        .unit("short")
        .grid_pos(_at(0, 34, 24, 8)),
        timeseries.Panel()
        .title(
            "Compile seconds by rank, and the skew between ranks (a rank far above the rest is a straggler its "
            "peers wait for at the next collective)"
        )
        .datasource(PROMETHEUS)
        .with_target(_promql("A", PROMQL["compile seconds by rank"], "rank {{telemetry_jit_rank}}"))
        .with_target(_promql("B", PROMQL["compile skew between ranks"], "skew (slowest - fastest rank)"))
        .unit("s")
        .grid_pos(_at(0, 42, 24, 8)),
    ]
    builder = (
        dashboard.Dashboard("telemetry-jit: compilation")
        .uid("telemetry-jit")
        .tags(["telemetry-jit", "torch.compile"])
        .time("now-6h", "now")
        .refresh("30s")
        # the same names as __inputs: a provisioned stack (no import step) picks its Tempo and Prometheus here
        .with_variable(dashboard.DatasourceVariable("DS_TEMPO").label("Tempo").type("tempo"))
        .with_variable(dashboard.DatasourceVariable("DS_PROMETHEUS").label("Prometheus").type("prometheus"))
    )
    for number, panel in enumerate(panels, start=1):
        builder = builder.with_panel(panel.id(number))
    built = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return {"__inputs": INPUTS, **built}


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = OUTPUT.read_text() == text
        print("up to date" if same else f"{OUTPUT} differs from what build_dashboard.py builds: run it to rewrite")
        return 0 if same else 1
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
