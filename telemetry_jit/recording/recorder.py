"""Records what the probes observed: each compilation as a ``compilation`` span under the loop that
was running, and its listeners told."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch
from nv_one_logger.core.attributes import Attributes
from nv_one_logger.core.event import Event
from nv_one_logger.core.span import Span
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder

from telemetry_jit import identity
from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.causes import Classified, RecompileClassifier
from telemetry_jit.compat import compile_timers
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.exporters.finished import export_finished
from telemetry_jit.notices import Notices, warn_once
from telemetry_jit.probes.backends import Observer, backends
from telemetry_jit.probes.dynamo import TORCH, DynamoProbe
from telemetry_jit.recording.compile_spans import compilation_span, out_of_step_span
from telemetry_jit.recording.console import CompileConsole, EagerFallbackAlert, say_line
from telemetry_jit.recording.fallback_cost import FallbackCostMeter
from telemetry_jit.recording.listener import CompileListener, FirstStep, FirstSteps
from telemetry_jit.recording.out_of_step import Finding
from telemetry_jit.recording.progress import CompileProgress
from telemetry_jit.recording.rank_watch import RankWatch, RankWatchSettings
from telemetry_jit.recording.resources import ResourceMeter
from telemetry_jit.recording.stats import CompileMetrics, CompileStats, RankTotals, meter_providers
from telemetry_jit.records import (
    AttributeValue,
    CompileContext,
    CompiledBefore,
    CompileRecord,
    CompileResources,
    NotCompiled,
)
from telemetry_jit.schema import (
    LOOP_SPAN_NAMES,
    CompileAttr,
    JitEventName,
    TrainAttr,
    TrainingSpanName,
)
from telemetry_jit.session import Session
from telemetry_jit.terminal import error_text

_log = logging.getLogger("telemetry_jit")
_OBSERVER = call_site("compiler.observer", "a compiler backend's observer (thunder's or a plug-in's)")
_EVENT = call_site("nv_one_logger.event", "nv-one-logger's recorder (adding an event to a span)")
_MAX_NAMED = 20
_EXPORT = call_site("nv_one_logger.export", "recording a compilation span (through nv-one-logger's exporters)")
_METRICS = call_site("opentelemetry.metrics", "OpenTelemetry's meter (creating the compile metrics)")
_LISTENER = call_site("recording.listener", "a compile listener (metrics, console, alerts, figures, or your own)")


@dataclass(frozen=True)
class Position:
    """Where the training loop is, as its driver knows it when a compile begins."""

    global_step: int
    stage: str  # train, sanity_check, validate, test, predict, tuner (Lightning's stage; the tuner's trials)
    batches: int | None = None  # batches in the running loop's dataloader (the epoch), where known and finite
    log_step: int | None = None  # the step the driver's loggers log at now, where it is not global_step
    last_batch: bool = False  # the running batch is its epoch's last, where the driver knows (a loader of no length)


Where = Callable[[], Position]


def active_span(session: Session, name: str) -> Span | None:
    """The running nv-one-logger span called ``name`` (the newest), while the session records."""
    if not session.recording:
        return None
    spans = session.provider.recorder.get_active_spans_by_name(name)
    return spans[-1] if spans else None


class CompileRecorder:
    """Records the compilations the probes observe between :meth:`start` and :meth:`stop`: each gets its context
    and a recompile its cause; the listeners are told; it becomes a ``compilation`` span under the loop span running
    when it began (never one the exporters drop). The first step of each stage becomes a ``first_step`` event."""

    def __init__(self, session: Session, listeners: Sequence[CompileListener] = ()) -> None:
        self.session = session
        self.listeners = list(listeners)
        self._notices = Notices()
        self._not_compiled: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # said to compile nothing
        self._rank = 0
        self._meter = ResourceMeter()
        self._probe = DynamoProbe(
            context=self._context,
            on_compile_start=self._compile_started,
            on_compile_end=self._compile_finished,
            meter=self._meter,
        )
        self._progress = CompileProgress(self._compile_in_progress)
        self._run_listeners: list[CompileListener] = []
        self._batch_loader: int | None = None
        self._stage_batches: dict[str, int | None] = {}  # stage -> its loop's batches, as the driver last said
        self._rank_watch: RankWatch | None = None
        self._watch_span: Span | None = None
        self._observers: list[Observer] = []  # the backends' own, for the run (thunder's, a plug-in's)
        self._plain: set[str] = set()  # the backends that say they do not optimise
        self._reset(lambda: Position(0, ""))

    def _reset(self, where: Where) -> None:
        """A run's own state, fresh."""
        self._where, self.stats, self._started_at = where, CompileStats(), time.perf_counter()
        position = where()
        self._batch_step, self._batch_stage = position.global_step, position.stage
        self._batch_index: int | None = None
        self._classifier, self._first_steps = RecompileClassifier(), FirstSteps()
        self._fallback_cost = FallbackCostMeter()
        self._causes: dict[str, Classified] = {}  # compile id -> its cause, for its backward graph

    # -- lifecycle, driven by the trainer callback or a loop ---------------------------------
    def start(self, where: Where, rank: int = 0) -> None:
        """Begin a run: ``where()`` says where the loop is (asked when a compile begins)."""
        self._meter.start()  # first: a TELEMETRY_JIT_MEMORY_LIMIT that is no size raises before anything starts
        self._rank = rank
        self._reset(where)
        parent = identity.forked_from
        if parent is not None:
            warn_once(
                "forked child",
                f"telemetry-jit: this process (pid {os.getpid()}) was forked from pid {parent} after telemetry was "
                "configured there, so it records nothing: the parent's file, exporters and application span are not "
                "its own. Start workers with the spawn method, or configure telemetry in each of them.",
                every_rank=True,
            )
        recorder = self._recorder()
        exporters = nv_one_logger_compat.exporters(recorder) if recorder is not None else []
        metrics = [m for p in meter_providers(exporters) if (m := _METRICS.call(CompileMetrics, p)) is not FAILED]
        self._run_listeners = [self.stats, *metrics, EagerFallbackAlert(), self._fallback_cost, *self.listeners]
        # this rank's heartbeat published (every rank's watched, on the watcher rank) where a process group of
        # several ranks runs; settings that cannot mean anything raise here, before training starts
        if self._rank_watch is not None:
            self._rank_watch.stop(None)
        self._watch_span = active_span(self.session, TrainingSpanName.APPLICATION)
        settings, position = RankWatchSettings.from_environment(), lambda: (self._batch_step, self._batch_stage)
        self._rank_watch = RankWatch.start(settings, position, self._out_of_step)
        if self._rank_watch is not None:
            self._run_listeners.append(self._rank_watch.publisher)
        if not self.session.looked_before:  # the frames compiled before: a recompile not met may have been paid then
            self.session.looked_before = True
            frames = TORCH.call(torch_compat.frames_holding_compiled_code)
            if frames is not FAILED and frames:
                named = frames[:_MAX_NAMED]
                before = CompiledBefore(len(frames), tuple(name for name, _ in named), tuple(at for _, at in named))
                self.emit_event(None, JitEventName.COMPILED_BEFORE_RUN, before.attributes())
        self._probe.attach()
        found = backends()
        self._observers = [o for b in found if (o := _OBSERVER.call(b.observer)) is not FAILED and o is not None]
        self._plain = {backend.name for backend in found if not getattr(backend, "optimizes", True)}
        for observer in self._observers:
            _OBSERVER.call(observer.attach)

    def _out_of_step(self, finding: Finding) -> None:
        """What the rank watcher found, said at once (its thread): on the console and as an event."""
        console = next((listener for listener in self.listeners if isinstance(listener, CompileConsole)), None)
        print_fn = console.print_fn if console is not None and console.print_fn is not None else _log.warning
        say_line(print_fn, f"telemetry-jit: {finding.line}")
        recorder, parent = self._recorder(), self._watch_span
        if recorder is not None and parent is not None and nv_one_logger_compat.is_running(parent):
            span = out_of_step_span(finding.attributes(), finding.seconds if "stall" in finding.kind else 0.0, parent)
            _EXPORT.call(nv_one_logger_compat.export_each, recorder, span, export_finished)

    def watch_thunder(self, model: torch.nn.Module) -> None:
        """Show ``model`` to each observer that has ``watch`` (thunder's); cheap to repeat, at each loop's start."""
        for observer in self._observers:
            if hasattr(observer, "watch"):
                _OBSERVER.call(observer.watch, model)

    def check_compiled_modules(self, modules: Iterable[tuple[str, str, torch.nn.Module]]) -> None:
        """Warn once, with a ``module_not_compiled`` event, of each of ``modules`` (``(attribute path, JitConfig
        selector or "", module)``) that ``Module.compile()`` compiles nothing of; at a loop's start."""
        if torch_compat.MODULE_COMPILE_TRACES_TORCH_LAYERS:
            return
        for name, selector, module in modules:
            if module in self._not_compiled or not TORCH.call(torch_compat.compiles_nothing, module):
                continue
            self._not_compiled.add(module)
            kind = f"{type(module).__module__}.{type(module).__qualname__}"
            found = NotCompiled(name, kind, torch.__version__, selector)
            self._notices.warn(("not compiled", id(module)), f"telemetry-jit: {found.words()}. Fix: {found.fix()}.")
            self.emit_event(None, JitEventName.MODULE_NOT_COMPILED, found.attributes())

    def poll(self) -> None:
        """Record the compilations that finished since the last call."""
        for record in TORCH.call(self._probe.poll) or ():
            self.record(record)
        self._poll_observers()

    def _poll_observers(self, at_step: bool = False) -> None:
        for observer in self._observers:
            if at_step and not getattr(observer, "watching", True):  # nothing to poll yet: a step costs nothing
                continue
            for record in _OBSERVER.call(observer.poll) or ():
                self.record(record)

    def ensure_registered(self) -> None:
        TORCH.call(self._probe.ensure_registered)

    def batch_started(
        self, global_step: int, batch_index: int | None = None, stage: str = "", loader: int | None = None
    ) -> None:
        """A step begins (of the ``loader``-th dataloader): the compiles before are recorded (those after a
        ``torch._dynamo.reset()`` belong to the step that just ran), cleared callbacks come back, and the first
        step of a stage is measured."""
        if self._probe.has_news():
            self.poll()
            self.ensure_registered()
        elif self._observers:
            self._poll_observers(at_step=True)
        self._batch_step, self._batch_index, self._batch_loader = global_step, batch_index, loader
        if stage:
            self._batch_stage = stage
            if batch_index == 0:  # once a loop: what a compile seen only after its loop ended is judged by
                self._stage_batches[stage] = self._where().batches
        finished = self._first_steps.batch_started(stage, global_step, batch_index)
        if finished is not None:
            self._first_step_measured(finished)
        self._fallback_cost.batch_started(stage, global_step, time.perf_counter_ns())

    def batch_ended(self) -> None:
        """The batch running ended (an adapter with batch-end hooks says so): a first step ends here."""
        self._first_steps.batch_ended()

    def running_eagerly(self, global_step: int) -> None:
        """``global_step`` runs eagerly on purpose (a payoff measurement): no batch to judge a fallback by."""
        self._fallback_cost.running_eagerly(global_step)

    def loop_ended(self) -> None:
        """A loop ends: its compiles are recorded, and a first step still being measured ends with it."""
        self.poll()
        if self._rank_watch is not None:
            self._rank_watch.loop_ended()
        self._fallback_cost.loop_ended()
        finished = self._first_steps.loop_ended()
        if finished is not None:
            self._first_step_measured(finished)

    def stop(self, exception: BaseException | None = None) -> None:
        """Record what is left and detach; with ``exception``, the compiles that failed in its step are marked."""
        records = [
            *(TORCH.call(self._probe.poll, final=True) or ()),
            *(record for observer in self._observers for record in _OBSERVER.call(observer.poll) or ()),
        ]
        for record in records:
            if exception is not None and record.failure:
                record.fell_back_to_eager = False
                said = error_text(exception)  # torch's own text, unless the exception already says it
                record.failure = said if record.failure[:200] in said else f"{said} (torch: {record.failure})"
            self.record(record)
        self._probe.detach()
        self._meter.stop()
        for observer in self._observers:  # kept until the next start: the summary still asks their cache counts
            _OBSERVER.call(observer.detach)
        self._compile_finished(None)  # one still open (it raised): ended, unmeasured
        watch, self._rank_watch = self._rank_watch, None
        if watch is not None:
            watch.stop(exception)

    def emit_summary(
        self, span: Span | None, by_rank: RankTotals | None = None, loop: dict[str, AttributeValue] | None = None
    ) -> CompileStats:
        """Add ``compile_summary`` (with ``by_rank``: every rank's totals; ``loop``: what the driver knows of the
        loop) to ``span``, the loop ending."""
        self.loop_ended()
        stats = self.stats
        stats.thunder = {
            name: counts
            for observer in self._observers
            if hasattr(observer, "cache_counts")
            for name, counts in (_OBSERVER.call(observer.cache_counts) or {}).items()
        }
        attributes = stats.attributes(time.perf_counter() - self._started_at)
        attributes[TrainAttr.GLOBAL_STEP] = self._where().global_step  # the loop's last: "N steps since"
        attributes[CompileAttr.TORCH_FEATURES] = compile_timers.features()
        attributes.update(loop or {})
        if by_rank is not None:
            attributes[CompileAttr.COUNT_BY_RANK] = by_rank.counts
            attributes[CompileAttr.TIME_MS_BY_RANK] = [round(ms, 3) for ms in by_rank.time_ms]
        self.emit_event(span, JitEventName.COMPILE_SUMMARY, attributes)
        for cost in self._fallback_cost.costs():
            self.emit_event(span, JitEventName.FALLBACK_COST, cost.attributes())
        return stats

    def emit_event(self, span: Span | None, name: JitEventName, attributes: dict[str, AttributeValue]) -> None:
        """Add the event ``name`` to ``span`` (by default the loop span running now), while it runs."""
        recorder = self._recorder()
        target = span if span is not None else self._current_parent()
        if recorder is not None and target is not None and nv_one_logger_compat.is_running(target):
            _EVENT.call(recorder.event, target, Event.create(name, Attributes(attributes)))

    # -- while torch compiles (inside its callbacks) ------------------------------------------
    def _context(self, global_step: int | None = None) -> CompileContext:
        where = self._where()
        if global_step is None:
            # the step of the batch running (manual optimization with several optimizers steps within a batch)
            global_step = self._batch_step if where.stage == self._batch_stage else where.global_step
        batches = where.batches
        if batches is None and where.last_batch and self._batch_index is not None:
            batches = self._batch_index + 1  # a loader of no length: its epoch ends with this batch
        self._stage_batches[where.stage] = batches
        return CompileContext(
            global_step=global_step,
            stage=where.stage,
            parent=self._current_parent(),
            rank=self._rank,
            batch_index=self._batch_index,
            batches=batches,
            loader=self._batch_loader,
            log_step=where.log_step,
        )

    def _compile_started(self, description: str) -> None:
        self._progress.start(description)
        for listener in self._run_listeners:
            _LISTENER.call(listener.compile_started, description)

    def _compile_in_progress(self, description: str, elapsed_s: float, phase: str) -> None:
        attributes: dict[str, AttributeValue] = {
            CompileAttr.IN_PROGRESS: description,
            CompileAttr.ELAPSED_S: round(elapsed_s, 3),
            CompileAttr.PHASE: phase,
        }
        self.emit_event(None, JitEventName.COMPILE_PROGRESS, attributes)
        for listener in self._run_listeners:
            _LISTENER.call(listener.compile_progress, description, elapsed_s, phase)

    def _compile_finished(self, resources: CompileResources | None) -> None:
        self._progress.stop()
        for listener in self._run_listeners:
            if resources is not None:
                _LISTENER.call(listener.compile_measured, resources)
            _LISTENER.call(listener.compile_finished)

    # -- recording ---------------------------------------------------------------------------
    def _recorder(self) -> TrainingRecorder | None:
        """nv-one-logger's recorder while the session records (else compiles are only counted)."""
        return self.session.provider.recorder if self.session.recording else None

    def _context_of_batch_that_ran(self) -> CompileContext:
        """Where training was for a compile no callback bracketed (recompile limit, thunder's, a plug-in's): the
        batch that ran before this poll, whose loop may have ended since (an epoch's last, polled at validation)."""
        context = self._context(self._batch_step)
        if not self._batch_stage or context.stage == self._batch_stage:
            return context
        batches = self._stage_batches.get(self._batch_stage)
        return replace(context, stage=self._batch_stage, batches=batches, log_step=None)

    def _current_parent(self) -> Span | None:
        """The newest loop span running, or its nearest ancestor the exporters keep."""
        recorder = self._recorder()
        if recorder is None:
            return None
        running = (spans[-1] for name in LOOP_SPAN_NAMES if (spans := recorder.get_active_spans_by_name(name)))
        span = next(running, None)
        while span is not None and not nv_one_logger_compat.is_exported(recorder, span):
            span = span.parent_span
        return span

    def record(self, record: CompileRecord) -> None:
        """Record one finished compilation: tell each listener, then export its span; a failure costs a warning."""
        if record.trigger == "dynamo":
            for observer in self._observers:
                if hasattr(observer, "take_splits"):
                    record.graph_breaks.extend(_OBSERVER.call(observer.take_splits, record.compile_id) or ())
        record.optimizes = record.backend not in self._plain
        try:
            context = record.context or self._context_of_batch_that_ran()
            if context.parent is not None and not nv_one_logger_compat.is_running(context.parent):
                context = replace(context, parent=self._current_parent())
            record.context = context
            record.cause = self._cause(record)
        except Exception as error:  # noqa: BLE001 - a telemetry bug must cost a warning, not the run
            self._notices.warn(
                "recording failed",
                f"telemetry-jit: could not record a compilation ({error!r}); training goes on, "
                "later failures are not reported.",
            )
            record.context = context = CompileContext()
        self._first_steps.recorded(record)
        for listener in self._run_listeners:
            _LISTENER.call(listener.recorded, record)
        recorder = self._recorder()
        if recorder is not None:
            _EXPORT.call(self._export, recorder, record, context)

    @staticmethod
    def _export(recorder: TrainingRecorder, record: CompileRecord, context: CompileContext) -> None:
        nv_one_logger_compat.export_each(recorder, compilation_span(record, context), export_finished)

    def _cause(self, record: CompileRecord) -> Classified | None:
        """Why it recompiled (a backward graph: its forward's cause); ``None`` for a first compile."""
        if record.trigger == "lazy_backward":
            return self._causes.get(record.compile_id)
        context = record.context or CompileContext()
        cause = self._classifier.observe(
            record.frame_id,
            context.stage,
            reason=record.recompile_reason,
            is_recompile=record.is_frame_recompile,
            batch_index=context.batch_index,
            batches=context.batches,
            limit_hit=record.recompile_limit_hit,
            step=context.global_step,
            dynamic=str(record.options.get("dynamic", "")),
            reasons=record.recompile_reasons,
            trigger=record.trigger,
            compile_id=record.compile_id,
            caller=record.caller,
            specialized=[fixed.split(" = ", 1)[0] for fixed in record.specializations],
            input_shapes=record.input_shapes,
        )
        if cause is not None and cause.reason:  # the reason of the entry that says what changed
            record.recompile_reason = cause.reason
        if cause is not None:
            if len(self._causes) > 10_000:  # a backward graph follows its forward within a step or two
                self._causes.clear()
            self._causes[record.compile_id] = cause
        return cause

    def _first_step_measured(self, step: FirstStep) -> None:
        for listener in self._run_listeners:
            _LISTENER.call(listener.first_step, step)
        self.emit_event(None, JitEventName.FIRST_STEP, step.attributes())
