"""Compile telemetry for any training loop: a plain PyTorch loop, Lightning Fabric, or your own."""

from __future__ import annotations

import logging
from types import TracebackType

import torch
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

from telemetry_jit.boundary import guarded
from telemetry_jit.notices import warn_once
from telemetry_jit.recording.console import CompileConsole, say_line
from telemetry_jit.recording.payoff import PayoffSettings, PayoffTracker
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import Payoff
from telemetry_jit.session import Session, resolve

_log = logging.getLogger("telemetry_jit")


class CompileTelemetry:
    """Record every compilation while a block runs, as a ``HookedTrainer`` does for ``fit``.

    Compilation spans, recompiles with torch's reasons, graph breaks and a ``compile_summary`` go to
    the session's exporters. Tell it which step the loop is on with :meth:`step` (spans carry it as
    ``train.global_step``); nothing else runs per step. Compile spans hang under the nv-one-logger loop
    span running when they start (``training_loop`` if you record one with nv-one-logger's
    ``on_train_start``), else the application span, which is started here (and ended on exit) if none
    is running.

    Args:
        provider: the :class:`~telemetry_jit.session.Session` (or nv-one-logger's provider) to record
            through (default: the running session).
        stage: what the loop does, ``train.stage`` on the spans.
        live: announce slow compiles and warn about recompile storms on the console.
        payoff: measure what compiling buys (compiled against eager steps, docs/payoff.md); a step is
            timed from one :meth:`step` call to the next. The result: ``last_payoff``, a
            ``compile_payoff`` event, a console line.

    Example::

        telemetry_jit.configure("my-loop", file="runs/telemetry.jsonl")
        model = torch.compile(model)
        with telemetry_jit.CompileTelemetry() as telemetry:
            for step, (x, y) in enumerate(loader):
                telemetry.step(step)
                loss = loss_fn(model(x), y)
                ...
        print(telemetry.stats.count, "compilations")
    """

    def __init__(
        self,
        provider: Session | TrainingTelemetryProvider | None = None,
        *,
        stage: str = "train",
        live: bool = True,
        payoff: bool | PayoffSettings = False,
    ) -> None:
        self._given = provider
        self._session = resolve(provider)
        self.stage = stage
        self.global_step = 0
        self._steps = 0  # step() calls so far: the steps the loop ran
        self._recorder = CompileRecorder(self._session, listeners=[CompileConsole()] if live else [])
        self._rank = 0
        self._owns_application = False
        self.stats: CompileStats | None = None
        if not isinstance(payoff, (bool, PayoffSettings)):
            raise TypeError(f"CompileTelemetry(payoff=...) takes True, False or a PayoffSettings, got {payoff!r}.")
        self.payoff_settings = (payoff if isinstance(payoff, PayoffSettings) else PayoffSettings()) if payoff else None
        self.last_payoff = Payoff(not_measured="payoff was not asked for" if not payoff else "the loop has not run")
        self._tracker: PayoffTracker | None = None

    @guarded
    def step(self, global_step: int) -> None:
        """The loop is at ``global_step`` now (cheap: call it every step). With ``payoff``, a step runs
        from one call to the next, and some run eagerly."""
        self.global_step = global_step
        self._steps += 1
        self._recorder.batch_started(global_step, stage=self.stage)
        if self._tracker is not None:
            measured = self._tracker.step_ended()
            if measured is not None and self._rank == 0:
                say_line(_log.warning, self._tracker.line(measured))
            self._tracker.step_started(global_step)

    def set_rank(self, rank: int, local_rank: int, world_size: int) -> None:
        """Which process of a distributed job this is, for every record (files become per rank)."""
        self._rank = rank
        self._session.set_rank(rank, local_rank, world_size)

    def __enter__(self) -> CompileTelemetry:
        self._start()
        return self

    @guarded
    def _start(self) -> None:
        self._session = self._recorder.session = resolve(self._given)
        self._steps = 0
        if not self._session.recording:
            if not (self._session.inert or self._session.ended):
                warn_once(
                    "loop not configured",
                    "telemetry-jit: the telemetry provider is not configured, so compilations are only counted. "
                    "Call telemetry_jit.configure(app_name, file=...) first.",
                )
        else:
            self._owns_application = self._session.start_application()
        self._recorder.start(self._position, rank=self._rank)
        if self.payoff_settings is not None:
            on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            self._tracker = PayoffTracker(self.payoff_settings, self._recorder, on_cuda=on_cuda)

    @guarded
    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.abandon()  # the last step has no end to time
        self._recorder.stop(error)
        self.stats = self._recorder.emit_summary(None)
        if tracker is not None:
            self.last_payoff = tracker.finish(self._steps)
            if self._rank == 0 and (self.last_payoff.measured or error is None):
                say_line(_log.warning, tracker.line(self.last_payoff))
        if self._owns_application:  # it started the application: its end is the session's
            self._owns_application = False
            self._session.shutdown()

    def _position(self) -> Position:
        return Position(self.global_step, self.stage)
