"""Records what the probes observed: each compilation as a ``compilation`` span under the loop that
was running, and its listeners told."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from nv_one_logger.core.attributes import Attributes
from nv_one_logger.core.event import Event
from nv_one_logger.core.span import Span
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat.nv_one_logger import telemetry_enabled
from telemetry_jit.exporters.finished import export_finished
from telemetry_jit.notices import Notices
from telemetry_jit.probes.dynamo import DynamoProbe
from telemetry_jit.probes.thunder import ThunderWatch
from telemetry_jit.recording.alerts import RecompileLimitAlert
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.metrics import CompileMetrics, meter_providers
from telemetry_jit.recording.spans import compilation_span
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import CompileContext, CompileRecord
from telemetry_jit.schema import LOOP_SPAN_NAMES, CompileAttr, JitEventName

Position = Callable[[], tuple[int, str]]  # where the training loop is: (global step, stage)


def _nowhere() -> tuple[int, str]:
    return 0, ""


def active_span(provider: TrainingTelemetryProvider, name: str) -> Span | None:
    """The running nv-one-logger span called ``name`` (the newest), while telemetry records."""
    if not telemetry_enabled():
        return None
    spans = provider.recorder.get_active_spans_by_name(name)
    return spans[-1] if spans else None


class CompileRecorder:
    """Records the compilations the probes observe between :meth:`start` and :meth:`stop`.

    Each becomes a ``compilation`` span under the loop span that was running when it started (or
    the application span), never under a span the configured exporters drop; then each listener is
    told: the run's totals (:attr:`stats`), OpenTelemetry metrics, the recompile-limit alert, and
    whatever ``listeners`` were given (the live console, ...).

    Example::

        recorder = CompileRecorder(provider, listeners=[CompileConsole()])
        recorder.start(lambda: (step, "train"))
        ...  # train; call recorder.batch_started(step) at each step
        recorder.stop()
        stats = recorder.emit_summary(loop_span)
    """

    def __init__(self, provider: TrainingTelemetryProvider, listeners: Sequence[CompileListener] = ()) -> None:
        self._provider = provider
        self.listeners = list(listeners)
        self.stats = CompileStats()
        self._notices = Notices()
        self._position: Position = _nowhere
        self._rank = 0
        self._probe = DynamoProbe(
            context=self._context, on_compile_start=self._compile_started, on_compile_end=self._compile_finished
        )
        self._thunder = ThunderWatch()
        self._run_listeners: list[CompileListener] = []
        self._started_at = 0.0
        self._batch_step = 0

    # -- lifecycle, driven by the trainer callback or a loop ---------------------------------
    def start(self, position: Position, rank: int = 0) -> None:
        """Begin a run: ``position()`` says where the loop is, as ``(global step, stage)``."""
        self._position, self._rank = position, rank
        self.stats = CompileStats()
        self._started_at = time.perf_counter()
        self._batch_step = position()[0]
        self._thunder = ThunderWatch()
        recorder = self._recorder()
        exporters = nv_one_logger_compat.exporters(recorder) if recorder is not None else []
        metrics = [CompileMetrics(provider) for provider in meter_providers(exporters)]
        self._run_listeners = [self.stats, *metrics, RecompileLimitAlert(), *self.listeners]
        self._probe.attach()

    def watch_thunder(self, model: torch.nn.Module) -> None:
        """Record the thunder compilations installed on ``model`` (cheap to repeat)."""
        self._thunder.watch(model)

    def poll(self) -> None:
        """Record the compilations that finished since the last call."""
        for record in self._probe.poll():
            self.record(record)
        if self._thunder:
            for record in self._thunder.take_records():
                self.record(record)

    def ensure_registered(self) -> None:
        self._probe.ensure_registered()

    def batch_started(self, global_step: int) -> None:
        """A step begins: the steps before are recorded (compiles the probe could not bracket because
        ``torch._dynamo.reset()`` cleared its callbacks belong to the step that just ran), and the
        callbacks come back if they were cleared."""
        if self._thunder or self._probe.has_news():
            self.poll()
            self._probe.ensure_registered()
        self._batch_step = global_step

    def stop(self, exception: BaseException | None = None) -> None:
        """Record what is left and detach; with ``exception``, the compiles that failed in the
        step that raised are marked with it (torch's own text stays in ``compile.failure``)."""
        for record in [*self._probe.poll(final=True), *self._thunder.take_records()]:
            if exception is not None and record.failure:
                record.fell_back_to_eager = False
                record.failure = f"{type(exception).__name__}: {exception} (torch: {record.failure})"
            self.record(record)
        self._probe.detach()
        self._compile_finished()

    def emit_summary(self, span: Span | None, count_by_rank: list[int] | None = None) -> CompileStats:
        """Add ``compile_summary`` to ``span`` (the loop that is ending) and return the totals."""
        self.poll()
        stats = self.stats
        stats.thunder = self._thunder.cache_counts()
        recorder = self._recorder()
        target = span if span is not None else self._current_parent()
        if recorder is not None and target is not None and nv_one_logger_compat.is_running(target):
            attributes = stats.attributes(time.perf_counter() - self._started_at)
            if count_by_rank is not None:
                attributes[CompileAttr.COUNT_BY_RANK] = count_by_rank
            recorder.event(target, Event.create(JitEventName.COMPILE_SUMMARY, Attributes(attributes)))
        return stats

    # -- while torch compiles (inside its callbacks) ------------------------------------------
    def _context(self, global_step: int | None = None) -> CompileContext:
        step, stage = self._position()
        return CompileContext(
            global_step=step if global_step is None else global_step,
            stage=stage,
            parent=self._current_parent(),
            rank=self._rank,
        )

    def _compile_started(self, description: str) -> None:
        for listener in self._run_listeners:
            listener.compile_started(description)

    def _compile_finished(self) -> None:
        for listener in self._run_listeners:
            listener.compile_finished()

    # -- recording ---------------------------------------------------------------------------
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

    def record(self, record: CompileRecord) -> None:
        """Record one finished compilation (the probes' are recorded by :meth:`poll`): tell each
        listener, then export its span. Whatever fails costs one warning, never the run."""
        if record.trigger == "dynamo" and self._thunder:
            record.graph_breaks.extend(self._thunder.take_splits(record.compile_id))
        try:
            context = record.context or self._context(self._batch_step)
            if context.parent is not None and not nv_one_logger_compat.is_running(context.parent):
                context = CompileContext(context.global_step, context.stage, self._current_parent(), context.rank)
            record.context = context
        except Exception as error:  # noqa: BLE001 - a telemetry bug must cost a warning, not the run
            self._failed(error)
            record.context = context = CompileContext()
        for listener in self._run_listeners:
            try:
                listener.recorded(record)
            except Exception as error:  # noqa: BLE001
                self._failed(error, listener)
        recorder = self._recorder()
        if recorder is not None:
            try:
                nv_one_logger_compat.export_each(recorder, compilation_span(record, context), export_finished)
            except Exception as error:  # noqa: BLE001
                self._failed(error)

    def _failed(self, error: Exception, listener: CompileListener | None = None) -> None:
        where = f" in {type(listener).__name__}" if listener is not None else ""
        self._notices.warn(
            ("recording failed", type(listener)),
            f"telemetry-jit: could not record a compilation{where} ({error!r}); training goes on, "
            "later failures are not reported.",
        )


def _exported_ancestor(recorder: TrainingRecorder, span: Span | None) -> Span | None:
    while span is not None and not nv_one_logger_compat.is_exported(recorder, span):
        span = span.parent_span
    return span
