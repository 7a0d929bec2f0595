"""Is compiling worth it? Measured in the run itself, from Lightning's training hooks."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from telemetry_jit.lightning.compile_telemetry import CompileTelemetryCallback
from telemetry_jit.recording.figures import payoff_figures
from telemetry_jit.recording.payoff import PayoffSettings, PayoffTracker
from telemetry_jit.records import Payoff


class CompilePayoffCallback(Callback):
    """Time compiled and eager training steps of the same model in the same run, and say what
    compiling bought: each mode's step time, the speedup, the step by which compile time is repaid,
    and at the end of training the time won or lost.

    A step is an optimizer step: with ``accumulate_grad_batches=4`` it spans four batches. Once compiling
    has settled, ``settings.blocks`` blocks of ``settings.block_steps`` steps run eagerly
    (``torch.compiler.set_stance("force_eager")``), interleaved with as many compiled blocks; no other
    step changes, nothing compiles for it. The result is a ``compile_payoff`` event on the
    ``training_loop`` span, a console line, ``compile/payoff_*`` figures in the trainer's loggers, and
    ``last_payoff``; a loop too short to measure (or with nothing compiled) says why instead.

    Example::

        HookedTrainer, callback = hook_trainer_cls(Trainer, session, jit_config=..., payoff=True)
        trainer = HookedTrainer(max_epochs=3)
        trainer.fit(model)
        print(trainer.compile_payoff.last_payoff.sentence())
    """

    def __init__(self, compile_telemetry: CompileTelemetryCallback, settings: PayoffSettings | None = None) -> None:
        self.compile_telemetry = compile_telemetry
        self.settings = settings or PayoffSettings()
        self.last_payoff = Payoff(not_measured="no training loop has run yet")
        self._tracker: PayoffTracker | None = None
        self._step = -1  # the optimizer step being timed (-1: none)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        on_cuda = trainer.strategy.root_device.type == "cuda"
        self._tracker = PayoffTracker(self.settings, self.compile_telemetry.recorder, on_cuda=on_cuda)
        self._step = -1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._tracker is not None and self._step < 0:  # the first batch of an optimizer step
            self._step = trainer.global_step
            self._tracker.step_started(self._step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        tracker = self._tracker
        if tracker is None or trainer.global_step == self._step:
            return  # gradients still accumulate: the step goes on over the next batch
        self._step = -1
        measured = tracker.step_ended()
        if measured is not None and trainer.is_global_zero:
            self.compile_telemetry.say(trainer, tracker.line(measured))

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self._tracker is not None:
            self._tracker.abandon()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        self.last_payoff = payoff = tracker.finish(trainer.global_step)  # the training loop still runs
        if payoff.measured:
            self.compile_telemetry.log(payoff_figures(payoff), step=trainer.global_step)
        elif trainer.is_global_zero:
            self.compile_telemetry.say(trainer, tracker.line(payoff))
