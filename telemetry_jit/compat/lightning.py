"""Lightning's internals telemetry-jit reads: its loggers' step, its optimizer-step counter, an epoch's last batch."""

from __future__ import annotations

from typing import Any, Protocol

import lightning.pytorch as pl


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning's loggers log at now (during a fit's validation one behind ``global_step``)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def is_last_batch(trainer: pl.Trainer) -> bool:
    """Whether the running batch is its epoch's last, as Lightning knows, fetching ahead (loaders of no length too)."""
    loop: Any = trainer._active_loop  # fit, evaluation or prediction loop
    loop = getattr(loop, "epoch_loop", loop)  # fit: its training epoch loop
    return getattr(getattr(loop, "batch_progress", None), "is_last_batch", False) is True


class StepCounter(Protocol):
    """Something whose ``completed`` is ``trainer.global_step``."""

    @property
    def completed(self) -> int: ...


class _GlobalStepProperty:
    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer

    @property
    def completed(self) -> int:
        return self._trainer.global_step


def global_step_counter(trainer: pl.Trainer) -> StepCounter:
    """Lightning's tracker of optimizer steps, whose ``completed`` is ``trainer.global_step`` (one attribute read
    a batch instead of four properties), else the property. Taken at each loop's first batch: the module decides
    which tracker counts, and a restored checkpoint fills them before that."""
    loop = trainer.fit_loop.epoch_loop
    module = trainer.lightning_module
    if module is None or module.automatic_optimization:
        counter: StepCounter = loop.automatic_optimization.optim_progress.optimizer.step.total
    else:
        counter = loop.manual_optimization.optim_step_progress.total
    return counter if counter.completed == trainer.global_step else _GlobalStepProperty(trainer)
