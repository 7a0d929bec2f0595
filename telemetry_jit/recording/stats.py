"""Compile counts and times: the running totals behind each loop's ``compile_summary`` event, every rank's at
its end, and the same as OpenTelemetry metrics next to the spans, so that a metrics backend (Prometheus, Grafana
Mimir, ...) can alert on them without trace queries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import Meter, MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

from telemetry_jit.exporters.protocols import SendsMetrics
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import AttributeValue, CompileRecord
from telemetry_jit.schema import COMPILE_DURATION_BOUNDS, CompileAttr, MetricName, otel_name

_MAX_DISTINCT_REASONS = 200
_TOP_REASONS = 5


@dataclass
class CompileStats(CompileListener):
    """Running totals over one ``fit``/``validate``/``test``; constant size whatever the run length."""

    count: int = 0
    frame_compiles: int = 0  # as the summary counts them: dynamo's (or a plug-in backend's) frame compiles,
    backward_graphs: int = 0  # the backward graphs compiled at a frame's first backward,
    thunder_compiles: int = 0  # and thunder's, apart
    recompile_count: int = 0
    graph_break_count: int = 0
    ddp_graph_splits: int = 0
    recompile_limit_hits: int = 0
    total_time_ms: float = 0.0
    cache_hits: int = 0  # graphs the FX graph / AOTAutograd caches had
    cache_misses: int = 0
    cache_time_saved_s: float = 0.0
    recompile_reasons: Counter[str] = field(default_factory=Counter)
    # what runs inside timed training steps: breaks of frames compiled while training, recompiles there that
    # are not the expected one-time price; and the backends compiled with
    train_graph_breaks: int = 0
    train_recompiles: int = 0
    backends: set[str] = field(default_factory=set)
    plain_backends: set[str] = field(default_factory=set)  # of those, the ones that said they do not optimise
    thunder: dict[str, tuple[int, int]] = field(default_factory=dict)  # module -> (cache hits, misses)

    def recorded(self, record: CompileRecord) -> None:
        self.count += 1
        self.backward_graphs += record.trigger == "lazy_backward" and not record.failure  # one that raised built none
        self.thunder_compiles += record.trigger == "thunder"
        self.frame_compiles += record.trigger not in ("lazy_backward", "thunder")
        self.total_time_ms += record.duration_ms
        self.graph_break_count += len(record.graph_breaks)
        self.ddp_graph_splits += record.ddp_graph_splits
        self.recompile_limit_hits += record.recompile_limit_hit
        self.cache_hits += record.cache_hits
        self.cache_misses += record.cache_misses
        self.cache_time_saved_s += record.cache.get("time_saved_s", 0.0)
        if record.backend:
            self.backends.add(record.backend)
            if not record.optimizes:
                self.plain_backends.add(record.backend)
        if record.context is not None and record.context.stage == "train":
            self.train_graph_breaks += len(record.graph_breaks)
            expected = record.cause is not None and record.cause.expected
            self.train_recompiles += record.is_frame_recompile and not expected
        if record.is_frame_recompile:
            self.recompile_count += 1
            reason = record.recompile_reason or "unknown"
            if reason in self.recompile_reasons or len(self.recompile_reasons) < _MAX_DISTINCT_REASONS:
                self.recompile_reasons[reason] += 1

    def attributes(self, wall_time_s: float) -> dict[str, AttributeValue]:
        """The ``compile_summary`` event's attributes, for a call that ran ``wall_time_s`` so far."""
        return {
            CompileAttr.COUNT: self.count,
            CompileAttr.RECOMPILE_COUNT: self.recompile_count,
            CompileAttr.GRAPH_BREAK_COUNT: self.graph_break_count,
            CompileAttr.DDP_GRAPH_SPLITS: self.ddp_graph_splits,
            CompileAttr.RECOMPILE_LIMIT_HITS: self.recompile_limit_hits,
            CompileAttr.TOTAL_TIME_MS: round(self.total_time_ms, 3),
            CompileAttr.CACHE_HITS: self.cache_hits,
            CompileAttr.CACHE_MISSES: self.cache_misses,
            CompileAttr.CACHE_TIME_SAVED_S: round(self.cache_time_saved_s, 3),
            CompileAttr.WALL_TIME_MS: round(wall_time_s * 1000, 3),
            CompileAttr.TIME_SHARE: round(self.total_time_ms / 1000 / wall_time_s, 6) if wall_time_s > 0 else 0.0,
            CompileAttr.TOP_RECOMPILE_REASONS: [
                f"{count}x {reason}" for reason, count in self.recompile_reasons.most_common(_TOP_REASONS)
            ],
            CompileAttr.THUNDER_MODULES: list(self.thunder),
            CompileAttr.THUNDER_CACHE_HITS: [hits for hits, _ in self.thunder.values()],
            CompileAttr.THUNDER_CACHE_MISSES: [misses for _, misses in self.thunder.values()],
        }


@dataclass(frozen=True)
class RankTotals:
    """Every rank's compile count and compile time at the end of a loop, by rank."""

    counts: list[int]
    time_ms: list[float]

    def divergence(self, skew_warning_s: float) -> str | None:
        """What rank zero should say when ranks compiled unalike: a different number of compiles, or compile
        times further apart than ``skew_warning_s`` (``None`` when they did not)."""
        problems = []
        if len(set(self.counts)) > 1:
            problems.append(f"a different number of times ({self.counts}, by rank)")
        seconds = [ms / 1000 for ms in self.time_ms]
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        fastest = min(range(len(seconds)), key=seconds.__getitem__)
        skew = seconds[slowest] - seconds[fastest]
        if skew > skew_warning_s:
            problems.append(
                f"for {skew:.1f} s longer on rank {slowest} ({seconds[slowest]:.1f} s) than on rank {fastest} "
                f"({seconds[fastest]:.1f} s)"
            )
        if not problems:
            return None
        return (
            f"telemetry-jit: ranks compiled {' and '.join(problems)}. Ranks that compile differently wait for "
            "each other at the next collective, and can desynchronise and hang: see `telemetry-jit summary` over "
            "every rank's file (a compile-cache miss on one node, a shape only some ranks see)."
        )


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
