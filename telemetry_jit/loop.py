"""Compile telemetry for any training loop: a plain PyTorch loop, Lightning Fabric, or your own."""

from __future__ import annotations

import logging
from types import TracebackType

import torch
from nv_one_logger.training_telemetry.api import callbacks as one_logger
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat.nv_one_logger import telemetry_enabled
from telemetry_jit.configuration import set_rank as tell_exporters_rank
from telemetry_jit.notices import warn_once
from telemetry_jit.recording.console import CompileConsole
from telemetry_jit.recording.payoff import PayoffMeter, PayoffSettings
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import Payoff, why_slower
from telemetry_jit.schema import JitEventName


class CompileTelemetry:
    """Record every compilation while a block runs, as a ``HookedTrainer`` does for ``fit``.

    Compilation spans, recompiles with torch's reasons, graph breaks and a ``compile_summary`` go to
    nv-one-logger's provider and its exporters. Tell it which step the loop is on with :meth:`step`
    (spans carry it as ``train.global_step``); nothing else runs per step. Compile spans hang under
    the nv-one-logger loop span running when they start (``training_loop`` if you record one with
    nv-one-logger's ``on_train_start``), else the application span, which is started here (and
    ended on exit) if none is running.

    Args:
        provider: the configured ``TrainingTelemetryProvider`` (default: ``instance()``).
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
        provider: TrainingTelemetryProvider | None = None,
        *,
        stage: str = "train",
        live: bool = True,
        payoff: bool | PayoffSettings = False,
    ) -> None:
        self._provider = provider or TrainingTelemetryProvider.instance()
        self.stage = stage
        self.global_step = 0
        self._recorder = CompileRecorder(self._provider, listeners=[CompileConsole()] if live else [])
        self._rank = 0
        self._owns_application = False
        self.stats: CompileStats | None = None
        if not isinstance(payoff, (bool, PayoffSettings)):
            raise TypeError(f"CompileTelemetry(payoff=...) takes True, False or a PayoffSettings, got {payoff!r}.")
        self.payoff_settings = (payoff if isinstance(payoff, PayoffSettings) else PayoffSettings()) if payoff else None
        self.last_payoff: Payoff | None = None
        self._meter: PayoffMeter | None = None

    def step(self, global_step: int) -> None:
        """The loop is at ``global_step`` now (cheap: call it every step). With ``payoff``, a step runs
        from one call to the next, and some run eagerly."""
        self.global_step = global_step
        self._recorder.batch_started(global_step, stage=self.stage)
        if self._meter is not None:
            self._meter.step_ended()
            self._meter.step_started(global_step)

    def set_rank(self, rank: int, local_rank: int, world_size: int) -> None:
        """Which process of a distributed job this is, for every record (files become per rank)."""
        self._rank = rank
        tell_exporters_rank(self._provider, rank, local_rank, world_size)

    def __enter__(self) -> CompileTelemetry:
        if not telemetry_enabled():
            warn_once(
                "loop not configured",
                "telemetry-jit: the telemetry provider is not configured, so compilations are only counted. "
                "Call telemetry_jit.configure(app_name, file=...) first.",
            )
        elif not nv_one_logger_compat.application_running(self._provider):
            one_logger.on_app_start()
            self._owns_application = True
        self._recorder.start(self._position, rank=self._rank)
        if self.payoff_settings is not None:
            recorder = self._recorder
            on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            self._meter = PayoffMeter(self.payoff_settings, compilations=lambda: recorder.stats.count, on_cuda=on_cuda)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        meter, self._meter = self._meter, None
        if meter is not None:
            meter.abandon()  # the last step has no end to time
        self._recorder.stop(error)
        self.stats = self._recorder.emit_summary(None)
        if meter is not None and meter.result is not None:
            self._report_payoff(meter.result, self.stats)
        if self._owns_application:
            self._owns_application = False
            one_logger.on_app_end()

    def _report_payoff(self, payoff: Payoff, stats: CompileStats) -> None:
        payoff.compile_s, payoff.steps = stats.total_time_ms / 1000, self.global_step + 1
        self.last_payoff = payoff
        self._recorder.emit_event(None, JitEventName.COMPILE_PAYOFF, payoff.attributes())
        if self._rank == 0:
            why = why_slower(stats.graph_break_count, stats.recompile_count)
            logging.getLogger("telemetry_jit").warning("telemetry-jit: compile payoff: %s", payoff.sentence(why))

    def _position(self) -> Position:
        return Position(self.global_step, self.stage)
