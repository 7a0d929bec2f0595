"""Compile counts and times as OpenTelemetry metrics, next to the spans, so that a metrics backend
(Prometheus, Grafana Mimir, ...) can alert on them without trace queries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import Meter, MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

from telemetry_jit.exporters.protocols import SendsMetrics
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord
from telemetry_jit.schema import COMPILE_DURATION_BOUNDS, CompileAttr, MetricName, otel_name


def meter_providers(exporters: Iterable[object]) -> list[MeterProvider]:
    """Where compile metrics go: each exporter that sends metrics (OTLP), and the application's global MeterProvider."""
    providers = [p for e in exporters if isinstance(e, SendsMetrics) and (p := e.meter_provider) is not None]
    application = metrics.get_meter_provider()
    if isinstance(application, SdkMeterProvider):
        providers.append(application)
    return providers


class CompileMetrics(CompileListener):
    """Counters of compilations, recompilations and graph breaks, and a histogram of compile
    seconds, each with the frame, the compiler (``dynamo``/``thunder``) and the rank as attributes."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        from telemetry_jit import __version__

        meter: Meter = meter_provider.get_meter("telemetry_jit", __version__)
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
            MetricName.COMPILE_DURATION,
            unit="s",
            description="Time each compilation took",
            explicit_bucket_boundaries_advisory=list(COMPILE_DURATION_BOUNDS),
        )

    def recorded(self, record: CompileRecord) -> None:
        recorded: dict[str, Any] = {
            CompileAttr.FRAME: record.frame or "?",
            CompileAttr.SOURCE: record.source,
            "rank": record.context.rank if record.context is not None else 0,
        }
        # OpenTelemetry's names only (telemetry_jit.compile.frame, ...): one label per fact
        attributes = {(otel_name(key) or (key, 1.0))[0]: value for key, value in recorded.items()}
        self.compilations.add(1, attributes)
        if record.is_frame_recompile:
            self.recompilations.add(1, attributes)
        if record.graph_breaks:
            self.graph_breaks.add(len(record.graph_breaks), attributes)
        self.compile_time.record(record.duration_ms / 1000, attributes)
