"""Lightning's internals telemetry-jit reads: the step its loggers log at, its counter of optimizer steps,
whether the running batch is its epoch's last."""

from __future__ import annotations

from typing import Any, Protocol

import lightning.pytorch as pl


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning's loggers log at now (``_batches_that_stepped``: during a fit's validation one behind
    ``global_step``), or ``global_step`` where Lightning lacks it."""
    stepped = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    return stepped if isinstance(stepped, int) else trainer.global_step


def is_last_batch(trainer: pl.Trainer) -> bool:
    """Whether the running batch is its epoch's last, as Lightning knows by fetching ahead (a loader without a
    length too); ``False`` where Lightning does not say."""
    loop: Any = getattr(trainer, "_active_loop", None)  # fit, evaluation or prediction loop; Lightning >= 2.0
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
    loop: Any = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    module = trainer.lightning_module
    try:
        if module is None or module.automatic_optimization:
            counter = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            counter = loop.manual_optimization.optim_step_progress.total
    except AttributeError:
        return _GlobalStepProperty(trainer)
    if getattr(counter, "completed", None) != trainer.global_step:
        return _GlobalStepProperty(trainer)
    return counter
