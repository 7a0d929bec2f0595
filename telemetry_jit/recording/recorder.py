"""Turns :class:`CompileRecord` objects into nv-one-logger spans and events."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

import torch
from nv_one_logger.core.attributes import AttributeValue
from nv_one_logger.core.event import Event
from nv_one_logger.core.span import Span
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.compat.nv_one_logger import telemetry_enabled
from telemetry_jit.exporters import identity
from telemetry_jit.exporters.finished import FinishedEvent, FinishedSpan
from telemetry_jit.probes import thunder as thunder_probe
from telemetry_jit.probes.dynamo import DynamoProbe
from telemetry_jit.probes.thunder import ThunderSource
from telemetry_jit.recording.console import CompileConsole
from telemetry_jit.recording.metrics import CompileMetrics
from telemetry_jit.recording.records import CompileRecord, GraphBreak
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.schema import (
    LOOP_SPAN_NAMES,
    CompileAttr,
    DdpAttr,
    GraphBreakAttr,
    JitEventName,
    JitSpanName,
    TrainAttr,
)

_MAX_DISTINCT_REASONS = 200
_TOP_REASONS = 5
_MAX_FAILURE_TEXT = 2000


Position = Callable[[], tuple[int, str]]  # where the training loop is: (global step, stage)


def _nowhere() -> tuple[int, str]:
    return 0, ""


@dataclass
class CompileContext:
    """Where training was when a compile started."""

    global_step: int
    stage: str
    parent: Span | None


def active_span(provider: TrainingTelemetryProvider, name: str) -> Span | None:
    """The running nv-one-logger span called ``name`` (the newest), while telemetry records."""
    if not telemetry_enabled():
        return None
    spans = provider.recorder.get_active_spans_by_name(name)
    return spans[-1] if spans else None


def record_attributes(record: CompileRecord, context: CompileContext) -> dict[str, AttributeValue]:
    attributes = {
        CompileAttr.SOURCE: record.source,
        CompileAttr.ID: record.compile_id,
        CompileAttr.TRIGGER: record.trigger,
        CompileAttr.BACKEND: record.backend,
        CompileAttr.FRAME: record.frame,
        CompileAttr.LOCATION: record.location,
        CompileAttr.IS_RECOMPILE: record.is_recompile,
        CompileAttr.RECOMPILE_REASON: record.recompile_reason,
        CompileAttr.GRAPH_BREAKS: len(record.graph_breaks),
        CompileAttr.DURATION_MS: round(record.duration_ms, 3),
        CompileAttr.FAILED: bool(record.failure),
        CompileAttr.FELL_BACK_TO_EAGER: record.fell_back_to_eager,
        CompileAttr.FAILURE: record.failure.strip()[:_MAX_FAILURE_TEXT],
        TrainAttr.GLOBAL_STEP: context.global_step,
        TrainAttr.STAGE: context.stage,
    }
    if record.ddp_buckets:
        attributes[CompileAttr.DDP_GRAPH_SPLITS] = record.ddp_graph_splits
        attributes[CompileAttr.DDP_BUCKET_CAP_BYTES] = record.ddp_bucket_cap_bytes
    attributes.update({CompileAttr.phase_time(phase): value for phase, value in record.phase_times_s.items()})
    attributes.update({CompileAttr.cache(outcome): value for outcome, value in record.cache.items()})
    if record.cache_bypasses:
        attributes[CompileAttr.CACHE_BYPASSES] = record.cache_bypasses
    attributes.update({CompileAttr.PREFIX + name: value for name, value in record.extra.items()})
    if record.unavailable:
        attributes[CompileAttr.UNAVAILABLE] = list(record.unavailable)
    return attributes


class CompileRecorder:
    """Records compilations seen by the probes as ``compilation`` spans.

    A span hangs under the loop span that was running when its compile started (or the
    application span), never under a span the configured exporters drop.
    """

    def __init__(self, provider: TrainingTelemetryProvider, console: CompileConsole | None = None) -> None:
        self._provider = provider
        self.console = console
        self._position: Position = _nowhere
        self._probe = DynamoProbe(on_compile_start=self._on_compile_start, on_compile_end=self._on_compile_end)
        self._warned_frames: set[str] = set()
        self._warned_failure = False
        self.stats = CompileStats()
        self._started_at = 0.0
        self._batch_step: int | None = None
        self._metrics: list[CompileMetrics] = []
        self._thunder: dict[int, ThunderSource] = {}  # by id: the thunder compilations watched this run
        self._thunder_before: dict[int, tuple[int, int]] = {}  # function id -> (hits, misses) when first seen

    # -- lifecycle, driven by the trainer callback -------------------------------------------
    def start(self, position: Position) -> None:
        """Begin a run: ``position()`` says where the loop is, as ``(global step, stage)``."""
        self._position = position
        self.stats = CompileStats()
        self._started_at = time.perf_counter()
        self._batch_step = position()[0]
        self._thunder, self._thunder_before = {}, {}
        self._metrics = [CompileMetrics(provider) for provider in self._meter_providers()]
        self._probe.attach()

    def _meter_providers(self) -> list[MeterProvider]:
        """Where compile metrics go: each exporter that sends metrics too (OTLP), and the
        application's own global MeterProvider when it set one."""
        recorder = self._recorder()
        exporters = nv_one_logger_compat.exporters(recorder) if recorder is not None else []
        providers = [p for e in exporters if (p := getattr(e, "meter_provider", None)) is not None]
        application = metrics.get_meter_provider()
        if isinstance(application, SdkMeterProvider):
            providers.append(application)
        return providers

    def watch_thunder(self, model: torch.nn.Module) -> None:
        """Record the thunder compilations installed on ``model`` (cheap to repeat; call it after
        modules may have been compiled, e.g. at each loop's first batch)."""
        for source in thunder_probe.sources_in(model):
            if id(source) in self._thunder:
                continue
            self._thunder[id(source)] = source
            for function in source.functions:
                function.take_records()  # compiled before this run (a module called by hand): not this run's
                self._thunder_before[id(function)] = (function.stats.cache_hits, function.stats.cache_misses)

    def poll(self) -> None:
        for record in self._probe.poll():
            self._record_safely(record)
        if self._thunder:
            for record in self._thunder_records():
                self._record_safely(record)

    def _thunder_records(self) -> list[CompileRecord]:
        return [record for source in self._thunder.values() for f in source.functions for record in f.take_records()]

    def ensure_registered(self) -> None:
        self._probe.ensure_registered()

    def batch_started(self, global_step: int) -> None:
        """A step begins: the steps before are recorded, compiles the probe could not bracket
        (``torch._dynamo.reset()`` cleared its callbacks) belong to this step, and the callbacks come
        back if they were cleared."""
        self.poll()
        self._batch_step = global_step
        self._probe.ensure_registered()

    def stop(self, exception: BaseException | None = None) -> None:
        """Record what is left and detach; with ``exception``, the compiles that failed in the
        step that raised are marked with it (torch's own text stays in ``compile.failure``)."""
        for record in [*self._probe.poll(final=True), *self._thunder_records()]:
            if exception is not None and record.failure:
                record.fell_back_to_eager = False
                record.failure = f"{type(exception).__name__}: {exception} (torch: {record.failure})"
            self._record_safely(record)
        self._probe.detach()

    def emit_summary(self, span: Span | None, count_by_rank: list[int] | None = None) -> CompileStats:
        """Add ``compile_summary`` to ``span`` (the loop that is ending) and return the totals."""
        self.poll()
        stats = self.stats
        recorder = self._recorder()
        target = span if span is not None else self._current_parent()
        stats.thunder = self._thunder_counts()
        if recorder is not None and target is not None and nv_one_logger_compat.is_running(target):
            attributes = stats.attributes(time.perf_counter() - self._started_at)
            if count_by_rank is not None:
                attributes.add(CompileAttr.COUNT_BY_RANK, count_by_rank)
            recorder.event(target, Event.create(JitEventName.COMPILE_SUMMARY, attributes))
        return stats

    def _thunder_counts(self) -> dict[str, tuple[int, int]]:
        """Cache hits and misses per thunder-compiled module during this call."""
        counts = {}
        for function in sorted(
            (f for source in self._thunder.values() for f in source.functions), key=attrgetter("name")
        ):
            hits, misses = self._thunder_before.get(id(function), (0, 0))
            stats = function.stats
            if stats.cache_misses - misses or stats.cache_hits - hits:
                counts[function.name] = (stats.cache_hits - hits, stats.cache_misses - misses)
        return counts

    # -- recording ---------------------------------------------------------------------------
    def _on_compile_start(self, compile_id: str, trigger: str, description: str) -> CompileContext:
        self.poll()  # flush the compiles that finished before this one, while their loop is running
        if self.console is not None:
            self.console.compile_started(description)
        return self._context()

    def _on_compile_end(self, compile_id: str) -> None:
        if self.console is not None:
            self.console.compile_finished()

    def _context(self, global_step: int | None = None) -> CompileContext:
        step, stage = self._position()
        return CompileContext(
            global_step=step if global_step is None else global_step, stage=stage, parent=self._current_parent()
        )

    def _recorder(self) -> TrainingRecorder | None:
        """nv-one-logger's recorder while it records; ``None`` otherwise (then compiles are only counted)."""
        return self._provider.recorder if telemetry_enabled() else None

    def _current_parent(self) -> Span | None:
        recorder = self._recorder()
        if recorder is None:
            return None
        for name in LOOP_SPAN_NAMES:
            spans = recorder.get_active_spans_by_name(name)
            if spans:
                return _exported_ancestor(recorder, spans[-1])
        return None

    def _record_safely(self, record: CompileRecord) -> None:
        try:
            self._record(record)
        except Exception as error:  # noqa: BLE001 - a telemetry bug must cost a warning, not the run
            if not self._warned_failure:
                self._warned_failure = True
                warnings.warn(
                    f"telemetry-jit: could not record a compilation ({error!r}); training goes on, "
                    "later failures are not reported.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _record(self, record: CompileRecord) -> None:
        if record.trigger == "dynamo":
            for source in self._thunder.values():
                record.graph_breaks.extend(source.take_splits(record.compile_id))
        context = record.context if isinstance(record.context, CompileContext) else self._context(self._batch_step)
        self.stats.add(record)
        for compile_metrics in self._metrics:
            compile_metrics.record(record, identity.this_process.current().rank)
        if self.console is not None:
            self.console.recorded(record, context.global_step)
        if record.recompile_limit_hit:
            self._warn_recompile_limit(record)
        recorder = self._recorder()
        if recorder is None:
            return
        if context.parent is not None and not nv_one_logger_compat.is_running(context.parent):
            context.parent = self._current_parent()
        events = [_graph_break_event(graph_break, record.start_ns) for graph_break in record.graph_breaks]
        if record.ddp_graph_splits:
            events.append(_ddp_split_event(record))
        if record.recompile_limit_hit:
            message = f"{record.frame or 'frame'} hit the recompile limit; it now runs eagerly"
            events.append(FinishedEvent.error_event(message, record.end_ns))
        elif record.failure and not record.fell_back_to_eager:
            events.append(FinishedEvent.error_event(f"compilation failed: {record.failure}", record.end_ns))
        span = FinishedSpan(
            name=JitSpanName.COMPILATION.value,
            parent=context.parent,
            start_unix_ns=record.start_ns,
            end_unix_ns=record.end_ns,
            attributes=record_attributes(record, context),
            events=tuple(events),
        )
        nv_one_logger_compat.export_finished_span(recorder, span)

    def _warn_recompile_limit(self, record: CompileRecord) -> None:
        frame_id = record.compile_id.rsplit("/", 1)[0]
        if frame_id in self._warned_frames:
            return
        self._warned_frames.add(frame_id)
        limit = torch_compat.recompile_limit()
        warnings.warn(
            f"telemetry-jit: {record.frame or 'a frame'} ({record.location or 'unknown location'}) hit "
            f"torch._dynamo.config.recompile_limit ({limit}) and now runs eagerly, without compilation. "
            f"Last recompile reason: {record.recompile_reason or 'unknown'}. Mark the changing dimension "
            "dynamic (torch._dynamo.mark_dynamic / dynamic=True) or raise the limit.",
            RuntimeWarning,
            stacklevel=2,
        )


def graph_break_attributes(graph_break: GraphBreak) -> dict[str, AttributeValue]:
    return {
        GraphBreakAttr.REASON: graph_break.summary,
        GraphBreakAttr.REASON_FULL: graph_break.reason,
        GraphBreakAttr.LOCATION: graph_break.location,
        GraphBreakAttr.COUNTED_BY_TORCH: graph_break.counted_by_torch,
        GraphBreakAttr.COMPILER: graph_break.compiler,
    }


def _graph_break_event(graph_break: GraphBreak, time_unix_ns: int) -> FinishedEvent:
    return FinishedEvent(JitEventName.GRAPH_BREAK.value, time_unix_ns, graph_break_attributes(graph_break))


def _ddp_split_event(record: CompileRecord) -> FinishedEvent:
    return FinishedEvent(
        JitEventName.DDP_GRAPH_SPLIT.value,
        record.start_ns,
        {
            DdpAttr.SPLITS: record.ddp_graph_splits,
            DdpAttr.SUBGRAPHS: sum(record.ddp_buckets),
            DdpAttr.BUCKET_CAP_BYTES: record.ddp_bucket_cap_bytes,
            DdpAttr.REASON: "DDPOptimizer split the graph at DDP gradient-bucket boundaries so all-reduce "
            "overlaps backward; not a graph break in user code",
        },
    )


def _exported_ancestor(recorder: TrainingRecorder, span: Span | None) -> Span | None:
    while span is not None and not nv_one_logger_compat.is_exported(recorder, span):
        span = span.parent_span
    return span
