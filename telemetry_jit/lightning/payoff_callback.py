"""Is compiling worth it? Measured in the run itself, from Lightning's training hooks."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from telemetry_jit.compat import lightning as lightning_compat
from telemetry_jit.lightning.compile_telemetry import CompileTelemetryCallback
from telemetry_jit.recording.driver import TelemetryDriver
from telemetry_jit.recording.payoff import PayoffSettings
from telemetry_jit.records import Payoff


class CompilePayoffCallback(Callback):
    """Time compiled and eager optimizer steps of the same model in the same run (some blocks of steps run
    under ``set_stance("force_eager")`` once compiling has settled) and say what compiling bought: step times,
    speedup, the step by which compile time is repaid, time won or lost (``last_payoff``, a ``compile_payoff``
    event, a console line, ``compile/payoff_*`` figures); a loop too short to measure says why."""

    def __init__(self, compile_telemetry: CompileTelemetryCallback, settings: PayoffSettings | None = None) -> None:
        self.compile_telemetry = compile_telemetry
        self.settings = settings or PayoffSettings()
        self.last_payoff = Payoff(not_measured="no training loop has run yet")
        self._step = -1  # the optimizer step being timed (-1: none)

    @property
    def _driver(self) -> TelemetryDriver:
        return self.compile_telemetry.driver

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._driver.payoff_started(self.settings, on_cuda=trainer.strategy.root_device.type == "cuda")
        self._step = -1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._step < 0:  # the first batch of an optimizer step
            self._step = trainer.global_step
            self._driver.step_started(self._step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self._step:  # else gradients still accumulate: the step goes on
            self._step = -1
            self._driver.step_ended(say=trainer.is_global_zero)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._driver.payoff_abandoned()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        steps = trainer.global_step  # the training loop still runs
        log_step = lightning_compat.logging_step(trainer)  # batches that stepped: not optimizer steps
        payoff = self._driver.payoff_finished(steps, log_step, say_measured=False, say_not=trainer.is_global_zero)
        self.last_payoff = payoff or self.last_payoff
