"""The one driver every adapter (Lightning's callbacks, Fabric's, a plain loop's ``CompileTelemetry``) maps its
hooks onto, so each per-run output (figures, payoff, every rank's totals, W&B summary, thunder's compiles) is
written once; compile figures go to the metric loggers people already watch (TensorBoard, CSV, MLflow, W&B, ...)
under one prefix. It imports no training framework."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from nv_one_logger.core.attributes import Attributes
from nv_one_logger.core.event import Event
from nv_one_logger.core.span import Span

from telemetry_jit import identity
from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import Notices
from telemetry_jit.recording.console import say_line
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.payoff import PayoffMeter, PayoffSettings
from telemetry_jit.recording.recorder import CompileRecorder, Position, active_span
from telemetry_jit.recording.stats import CompileStats, RankTotals
from telemetry_jit.records import CompileNotRun, CompileRecord, Payoff, StoppedEarly, why_slower
from telemetry_jit.schema import LOOP_SPAN_NAMES, JitEventName, TrainAttr, TrainingSpanName
from telemetry_jit.session import Session, resolve
from telemetry_jit.terminal import error_text

_log = logging.getLogger("telemetry_jit")
_RECORDER = call_site("nv_one_logger.recorder", "nv-one-logger's recorder (an error or an event on a span)")
_GATHER = call_site("lightning.all_gather", "the all_gather of every rank's compile totals (a strategy's, Fabric's)")
PREFIX = "compile/"
LOG_METRICS = call_site("logger.log_metrics", "a metrics logger's log_metrics (Lightning's or Fabric's loggers)")


class GuardedLog:
    """One logger's ``log(metrics, step=...)``, guarded: a failure is caught, counted and said once, never
    raised into training. When a call fails, each of its keys is tried alone once; a key the logger refuses
    while it takes others (a name with ``/`` some tracking servers reject) is never sent to it again."""

    def __init__(self, log: Callable[..., Any], name: str) -> None:
        self._log = log
        self.name = name
        self.refused: set[str] = set()
        self._notices = Notices()

    def __call__(self, metrics: Mapping[str, float], step: int) -> None:
        wanted = {key: value for key, value in metrics.items() if key not in self.refused}
        if not wanted or LOG_METRICS.call(self._log, wanted, step=step) is not FAILED or len(wanted) == 1:
            return
        failed = [
            key for key, value in wanted.items() if LOG_METRICS.call(self._log, {key: value}, step=step) is FAILED
        ]
        if len(failed) < len(wanted):  # the logger works: these keys are what it refuses
            self.refused.update(failed)
            self._notices.warn(
                ("refused", tuple(failed)),
                f"telemetry-jit: the logger {self.name} refuses {', '.join(failed)}; telemetry-jit does not send "
                "those to it again (the other compile figures still go to it).",
                every_rank=True,
                origin="telemetry-jit:0",
            )


class CompileFigures(CompileListener):
    """The compile seconds of each step that compiled, to log at that step with the run's totals as they are
    then: one value per key per step, so a step is given out once it is over; validation's compiles count at
    the step Lightning logs validation's metrics at."""

    def __init__(self) -> None:
        self._pending: dict[int, float] = {}  # step -> compile seconds in it, not yet taken
        self._last: tuple[int, float] = (-1, 0.0)  # the last step taken and its seconds so far

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def recorded(self, record: CompileRecord) -> None:
        context = record.context
        step = 0 if context is None else context.global_step if context.log_step is None else context.log_step
        self._pending[step] = self._pending.get(step, 0.0) + record.duration_ms / 1000

    def take(self, stats: CompileStats, current_step: int | None = None) -> list[tuple[int, dict[str, float]]]:
        """The figures of each step that compiled and is over (before ``current_step``; ``None``: every step),
        by step: its compile seconds and ``stats``' totals."""
        over = [step for step in self._pending if current_step is None or step < current_step]
        if not over:
            return []
        pending = {step: self._pending.pop(step) for step in sorted(over)}
        last_step, last_seconds = self._last
        if last_step in pending:  # a step given out before compiled again (another loop at the same step):
            pending[last_step] += last_seconds  # the figure at a step is all of that step's compiling
        self._last = max(pending.items())
        totals: dict[str, float] = {
            f"{PREFIX}total_time_s": round(stats.total_time_ms / 1000, 6),
            f"{PREFIX}frame_compiles": stats.frame_compiles,
            f"{PREFIX}backward_graphs": stats.backward_graphs,
            f"{PREFIX}recompiles": stats.recompile_count,
            f"{PREFIX}graph_breaks": stats.graph_break_count,
        }
        if stats.thunder_compiles:
            totals[f"{PREFIX}thunder_compiles"] = stats.thunder_compiles
        if stats.cache_hits or stats.cache_misses:  # only where the backend has a cache (inductor's, AOTAutograd's)
            totals[f"{PREFIX}cache_hits"] = stats.cache_hits
            totals[f"{PREFIX}cache_time_saved_s"] = round(stats.cache_time_saved_s, 6)
        return [(step, {f"{PREFIX}time_s": seconds, **totals}) for step, seconds in pending.items()]


class TelemetryDriver:
    """One run's compile telemetry: ``given`` is the session to record through (``None``: the running one)."""

    def __init__(self, given: Any = None, listeners: Iterable[CompileListener] = ()) -> None:
        self._given = given
        self.session = resolve(given)
        self.recorder = CompileRecorder(self.session, listeners=list(listeners))
        self.skew_warning_s = 60.0  # on several ranks, rank zero warns when compile times lie further apart
        self.log_figures_per_rank = False  # on several ranks, every rank's totals to the loggers at a loop's end
        self.figures: CompileFigures | None = None
        self._logs: list[GuardedLog] = []
        self._loggers: list[Any] = []
        self.payoff: PayoffMeter | None = None  # measuring what compiling buys
        self.batches = 0  # the batches begun since the run started
        self._rank = 0
        self.say: Callable[[str], None] = lambda line: say_line(_log.warning, line)  # a console line
        self._disabled_checked = False  # whether this run's first batch asked if compiling is switched off
        self._disabled_said: set[int] = set()  # the compiled modules whose disabled forward was said

    def resolve(self) -> Session:
        """The session again: one configured since the adapter was made, or a spawned rank's own."""
        self.session = self.recorder.session = resolve(self._given)
        return self.session

    def log_to(self, logs: Sequence[tuple[Callable[..., Any], str]], loggers: Iterable[Any] = ()) -> None:
        """Compile figures go to each of ``logs`` (a ``log(metrics, step=...)`` and its name) at their step; a W&B
        logger among ``loggers`` gets the run's totals in its summary."""
        if self.figures is not None and self.figures in self.recorder.listeners:
            self.recorder.listeners.remove(self.figures)
        self._logs = [GuardedLog(log, name) for log, name in logs]
        self._loggers = list(loggers) if logs else []
        self.figures = CompileFigures() if logs else None
        if self.figures is not None:
            self.recorder.listeners.append(self.figures)

    def listen(self, listeners: Iterable[CompileListener]) -> None:
        """What is told of each compile besides the run's own listeners (a console), from the next start on."""
        self.recorder.listeners = [*listeners, *([self.figures] if self.figures is not None else [])]

    def start(self, where: Callable[[], Position], rank: int = 0, model: torch.nn.Module | None = None) -> None:
        """A run begins: ``where()`` says where the loop is; thunder's compiles in ``model`` are recorded."""
        self.recorder.start(where, rank=rank)
        self._disabled_checked = False
        self._disabled_said.clear()
        self.batches, self._rank = 0, rank
        if model is not None:
            self.watch(model)

    def loop_started(self) -> None:
        """A loop begins: torch's compile callbacks, which a ``torch._dynamo.reset()`` clears, are back."""
        self.recorder.ensure_registered()

    def watch(self, model: torch.nn.Module) -> None:
        """Thunder's compiles in ``model`` are recorded (cheap to repeat, at each loop's start)."""
        self.recorder.watch_thunder(model)

    def model_ready(self, model: torch.nn.Module, selector: Callable[[str], str] = lambda name: "") -> None:
        """The model a loop runs has been compiled as it will run (by its first batch): thunder's compiles in it
        are recorded, and each of its modules that ``Module.compile()`` compiles nothing of is said once, with a
        ``module_not_compiled`` record (``selector(name)``: the JitConfig selector that chose the module, or "")."""
        self.watch(model)
        modules = list(model.named_modules())
        self.recorder.check_compiled_modules((name, selector(name), module) for name, module in modules)
        for name, module in modules:  # the user's torch.compile(module) of a disabled forward (JitTransform's: its own)
            if id(module) not in self._disabled_said and torch_compat.compiles_a_disabled_forward(module):
                self._disabled_said.add(id(module))
                inner = getattr(module, "_orig_mod", None)
                label = f"{name or '<root>'} ({type(inner if inner is not None else module).__name__})"
                how = "torch.compile" if inner is not None else "Module.compile()"
                found = CompileNotRun("never_ran", label, "its forward is torch.compiler.disable-d")
                self.session.account.notices.warn(
                    ("disabled forward", id(module)),
                    f"telemetry-jit: {how} compiled {label}, but {found.words()}. Fix: remove "
                    "torch.compiler.disable from its forward, or compile a module that is not disabled.",
                )
                self.compile_not_run(found)

    def batch_started(
        self, step: int, batch: int | None = None, stage: str = "", loader: int | None = None, log_step: int = 0
    ) -> None:
        """A batch begins; the figures of the steps before ``log_step`` go to the loggers."""
        self.batches += 1
        self.recorder.batch_started(step, batch, stage, loader)
        if not self._disabled_checked:  # at the first batch: its loop span runs, to hold the record
            self._disabled_checked = True
            disabled = torch_compat.compiling_disabled()
            if disabled:
                self.compile_not_run(CompileNotRun("disabled", detail=disabled))
        if self.figures is not None and self.figures.pending:
            self.log_figures(log_step)

    def batch_ended(self) -> None:
        """The batch running ended (for adapters with batch-end hooks): a stage's first step ends with it."""
        self.recorder.batch_ended()

    def log_figures(self, current_step: int | None = None) -> None:
        """Each step's figures once it is over (``None``: the loop ended, all): one value per key per step."""
        if self.figures is not None:
            for step, metrics in self.figures.take(self.recorder.stats, current_step):
                self.log(metrics, step)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """``metrics`` to every log figures go to, each call guarded."""
        for log in self._logs:
            log(metrics, step=step)

    def loop_ended(
        self,
        span: Span | None,
        *,
        loop: str = "",
        step: int = 0,
        world_size: int = 1,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> CompileStats:
        """A loop ends: its ``compile_summary`` on ``span``, its figures logged; with ``gather`` (an all_gather
        every rank reaches) on several ranks, every rank's totals too, and a warning on skew."""
        by_rank = None
        if gather is not None and world_size > 1:
            # ranks that compile differently (more often, or for longer) are a classic cause of stalls and hangs
            self.recorder.poll()
            stats = self.recorder.stats
            gathered = _GATHER.call(gather, torch.tensor([stats.count, stats.total_time_ms], dtype=torch.float64))
            if gathered is not FAILED:
                rows = gathered.reshape(-1, 2).tolist()
                by_rank = RankTotals([int(count) for count, _ in rows], [ms for _, ms in rows])
                warning = by_rank.divergence(self.skew_warning_s)
                if warning is not None:
                    self.session.account.notices.warn(("skew", loop, step), warning)
                if self.log_figures_per_rank:  # the loggers log on rank zero: it logs every rank's
                    figures: dict[str, float] = {}
                    for rank, (count, ms) in enumerate(zip(by_rank.counts, by_rank.time_ms, strict=True)):
                        figures[f"{PREFIX}rank{rank}/compilations"] = count
                        figures[f"{PREFIX}rank{rank}/total_time_s"] = round(ms / 1000, 6)
                    self.log(figures, step=step)
        stats = self.recorder.emit_summary(span, by_rank, {TrainAttr.BATCHES_RUN: self.batches})
        if self.figures is not None:
            self.log_figures()
            # W&B's summary keeps a metric's last value: there compile/time_s becomes the run's total (W&B has no
            # summing summary to ask for)
            for logger in self._loggers:
                experiment = getattr(logger, "experiment", None) if type(logger).__name__ == "WandbLogger" else None
                if (summary := getattr(experiment, "summary", None)) is not None:
                    LOG_METRICS.call(summary.update, {f"{PREFIX}time_s": round(stats.total_time_ms / 1000, 6)})
        return stats

    def compile_not_run(self, found: CompileNotRun) -> None:
        """Compiled code did not run (compiling switched off, a module's compiled code never ran): a record on the
        loop running, which ``check --no-eager-fallback`` fails."""
        self.recorder.emit_event(None, JitEventName.COMPILE_NOT_RUN, found.attributes())

    def stopped_early(self, found: StoppedEarly) -> None:
        """A loop ended before the length it was given: a record on the loop running (``check --no-early-stop``)."""
        self.recorder.emit_event(None, JitEventName.STOPPED_EARLY, found.attributes())

    def loop_paused(self) -> None:
        """A loop inside another ended (validation inside fit): its compiles are recorded, its summary is the
        outer loop's."""
        self.recorder.loop_ended()

    def stop(self) -> None:
        """The run ended: what is left is recorded and torch's callbacks detached."""
        self.recorder.stop()

    def failed(self, error: BaseException, where: str = "", *, mark: bool = True) -> None:
        """The run raised ``error``: the compile that failed in its step is marked with it; with ``mark``, the
        newest loop span running (else the application's) carries the error, as a span that raised does (an
        adapter whose framework ends its spans with the error itself, as Lightning's time events do, says
        ``mark=False``)."""
        self.recorder.stop(error)
        if mark and self.session.recording:
            spans = (active_span(self.session, name) for name in LOOP_SPAN_NAMES)
            span = next((span for span in spans if span is not None), None)
            if span is not None:
                record_error(self.session, span, error, where)

    def ended(self, error: BaseException | None, nothing: str) -> None:
        """The run ended (with ``error``, or returned): one that returned without a batch or a compile (a block
        that never says its steps still runs what it compiles) says so on the application span (``nothing``: why,
        as the framework tells it); on rank zero the reading hint is said, once per session."""
        if error is None and self.batches == 0 and self.recorder.stats.count == 0:
            say_trained_nothing(self.session, nothing)
        if self._rank == 0:
            say_where_to_read(self.session, self.say)

    def payoff_started(self, settings: PayoffSettings, on_cuda: bool | None = None) -> None:
        """Measure what compiling buys from now on; ``on_cuda``: the loop's device is a GPU (default: CUDA is
        in use in this process), so that steps are timed to the end of their GPU work."""
        if on_cuda is None:
            on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.payoff = PayoffMeter(settings, compilations=lambda: self.recorder.stats.count, on_cuda=on_cuda)

    def step_started(self, step: int) -> None:
        """An optimizer step begins (for the payoff): one step however many batches it took."""
        if self.payoff is not None:
            self.payoff.step_started(step)
            if self.payoff.running_eagerly:
                self.recorder.running_eagerly(step)

    def step_ended(self, say: bool) -> None:
        """An optimizer step ended; ``say``: the payoff's line when it is first measured."""
        meter = self.payoff
        if meter is None or meter.result is not None:
            return
        meter.step_ended()
        if meter.result is not None and say:  # measured at this step
            self.say(self._payoff_line(self._costed(meter.result, steps=0)))

    def payoff_abandoned(self) -> None:
        """The step running has no end to time (the loop failed or ended within it)."""
        if self.payoff is not None:
            self.payoff.abandon()

    def payoff_finished(self, steps: int, log_step: int, *, say_measured: bool, say_not: bool) -> Payoff | None:
        """The loop's payoff (or why it has none) over ``steps`` steps: its event, its figures at ``log_step``, its
        line (``say_measured``, else ``say_not``); ``None`` when it was not measured for."""
        meter, self.payoff = self.payoff, None
        if meter is None:
            return None
        meter.abandon()
        payoff = self._costed(meter.result or Payoff(not_measured=meter.why_not()), steps)
        self.recorder.emit_event(None, JitEventName.COMPILE_PAYOFF, payoff.attributes())
        if payoff.measured:  # compile/payoff_speedup, compile/payoff_eager_step_ms, ...
            numbers = {name: value for name, value in payoff.attributes().items() if isinstance(value, (int, float))}
            self.log({f"{PREFIX}payoff_{name.removeprefix('payoff.')}": v for name, v in numbers.items()}, log_step)
        if say_measured if payoff.measured else say_not:
            self.say(self._payoff_line(payoff))
        return payoff

    def _costed(self, payoff: Payoff, steps: int) -> Payoff:
        payoff.compile_s = self.recorder.stats.total_time_ms / 1000
        payoff.steps = steps
        return payoff

    def _payoff_line(self, payoff: Payoff) -> str:
        """The console's line: the answer and, when compiling loses, the likely reason."""
        stats = self.recorder.stats
        why = why_slower(stats.train_graph_breaks, stats.train_recompiles, stats.backends, stats.plain_backends)
        return f"telemetry-jit: compile payoff: {payoff.sentence(why)}"


def record_error(session: Session, span: Span, error: BaseException, where: str = "") -> None:
    """``error`` on ``span`` (its status ERROR over OTLP, ``error.type``, an exception event), ``where``: the
    stage and step it raised at."""
    message = f"{error_text(error)} (at {where})" if where else error_text(error)
    typed = error if isinstance(error, Exception) else None  # nv-one-logger takes no KeyboardInterrupt
    _RECORDER.call(session.provider.recorder.error, span, message, typed)


def say_trained_nothing(session: Session, reason: str) -> None:
    """The ``trained_nothing`` record on the application span: the run returned without running a batch."""
    application = active_span(session, TrainingSpanName.APPLICATION)
    if application is not None:
        event = Event.create(JitEventName.TRAINED_NOTHING, Attributes({"reason": reason}))
        _RECORDER.call(session.provider.recorder.event, application, event)


def say_where_to_read(session: Session, say: Callable[[str], None]) -> None:
    """Where the session's telemetry is and the command that reads it, once per session (not in a forked child,
    whose session is its parent's, nor once the session ended)."""
    if identity.forked_from is not None or not session.recording or session.configuration is None:
        return
    hint = session.reading_hint()
    if hint and not session.said_where:
        session.said_where = True
        say(hint)
