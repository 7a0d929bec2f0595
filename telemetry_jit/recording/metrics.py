"""Compile counts and times as OpenTelemetry metrics, next to the spans, so that a metrics backend
(Prometheus, Grafana Mimir, ...) can alert on them without trace queries."""

from __future__ import annotations

from typing import Any

from opentelemetry.metrics import Meter, MeterProvider

from telemetry_jit.recording.records import CompileRecord
from telemetry_jit.schema import CompileAttr, MetricName


class CompileMetrics:
    """Counters of compilations, recompilations and graph breaks, and a histogram of compile
    seconds, each with the frame, the compiler (``dynamo``/``thunder``) and the rank as attributes.

    Example::

        metrics = CompileMetrics(meter_provider)
        metrics.record(record, rank=0)
    """

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter: Meter = meter_provider.get_meter("telemetry_jit")
        self.compilations = meter.create_counter(
            MetricName.COMPILATIONS, unit="{compilation}", description="Compilations, recompilations included"
        )
        self.recompilations = meter.create_counter(
            MetricName.RECOMPILATIONS, unit="{recompilation}", description="Frames compiled again"
        )
        self.graph_breaks = meter.create_counter(
            MetricName.GRAPH_BREAKS, unit="{graph_break}", description="Graph breaks met while compiling"
        )
        self.compile_time = meter.create_histogram(
            MetricName.COMPILE_DURATION, unit="s", description="Time each compilation took"
        )

    def record(self, record: CompileRecord, rank: int) -> None:
        attributes: dict[str, Any] = {
            CompileAttr.FRAME: record.frame or "?",
            CompileAttr.SOURCE: record.source,
            "rank": rank,
        }
        self.compilations.add(1, attributes)
        if record.is_frame_recompile:
            self.recompilations.add(1, attributes)
        if record.graph_breaks:
            self.graph_breaks.add(len(record.graph_breaks), attributes)
        self.compile_time.record(record.duration_ms / 1000, attributes)
