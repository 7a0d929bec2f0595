"""Is compiling worth it? Measured in the run itself, from Lightning's training hooks."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from telemetry_jit.lightning.compile_telemetry import CompileTelemetryCallback
from telemetry_jit.recording.figures import payoff_figures
from telemetry_jit.recording.payoff import PayoffMeter, PayoffSettings
from telemetry_jit.records import Payoff, why_slower
from telemetry_jit.schema import JitEventName


class CompilePayoffCallback(Callback):
    """Time compiled and eager training steps of the same model in the same run, and say what
    compiling bought: each mode's step time, the speedup, the step by which compile time is repaid,
    and at the end of training the time won or lost.

    Once compiling has settled, ``settings.blocks`` blocks of ``settings.block_steps`` steps run
    eagerly (``torch.compiler.set_stance("force_eager")``), interleaved with as many compiled blocks;
    no other step changes, nothing compiles for it. The result is a ``compile_payoff`` event on the
    ``training_loop`` span, a console line, ``compile/payoff_*`` figures in the trainer's loggers, and
    ``last_payoff``.

    Example::

        HookedTrainer, callback = hook_trainer_cls(Trainer, provider, jit_config=..., payoff=True)
        trainer = HookedTrainer(max_epochs=3)
        trainer.fit(model)
        print(trainer.compile_payoff.last_payoff.sentence())
    """

    def __init__(self, compile_telemetry: CompileTelemetryCallback, settings: PayoffSettings | None = None) -> None:
        self.compile_telemetry = compile_telemetry
        self.settings = settings or PayoffSettings()
        self.last_payoff: Payoff | None = None
        self._meter: PayoffMeter | None = None
        self._said = False

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        recorder = self.compile_telemetry.recorder
        self._meter = PayoffMeter(
            self.settings,
            compilations=lambda: recorder.stats.count,
            on_cuda=trainer.strategy.root_device.type == "cuda",
        )
        self._said = False
        self.last_payoff = None

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._meter is not None:
            self._meter.step_started(trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        meter = self._meter
        if meter is None:
            return
        meter.step_ended()
        if meter.result is not None and not self._said:
            self._said = True
            payoff = meter.result
            payoff.compile_s = self.compile_telemetry.recorder.stats.total_time_ms / 1000
            if trainer.is_global_zero:
                stats = self.compile_telemetry.recorder.stats
                why = why_slower(stats.graph_break_count, stats.recompile_count)
                line = f"telemetry-jit: compile payoff: {payoff.sentence(why)}"
                bar = trainer.progress_bar_callback
                if bar is not None:
                    bar.print(line)
                else:
                    rank_zero_info(line)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._meter is not None:
            self._meter.abandon()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        meter, self._meter = self._meter, None
        if meter is None:
            return
        meter.abandon()
        payoff = meter.result
        if payoff is None:
            return
        recorder = self.compile_telemetry.recorder
        payoff.compile_s = recorder.stats.total_time_ms / 1000
        payoff.steps = trainer.global_step
        self.last_payoff = payoff
        recorder.emit_event(None, JitEventName.COMPILE_PAYOFF, payoff.attributes())  # the training loop still runs
        for logger in trainer.loggers:
            logger.log_metrics(payoff_figures(payoff), step=trainer.global_step)
