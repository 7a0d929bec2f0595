"""Lightning's internals telemetry-jit reads: the step its loggers log at, its counter of optimizer steps,
whether the running batch is its epoch's last."""

from __future__ import annotations

from typing import Any, Protocol, cast

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


def stopped_early(trainer: pl.Trainer) -> tuple[str, str] | None:
    """What ended a fit's training before the length it was given (``fast_dev_run``, ``max_time``,
    ``should_stop`` before its last epoch or step, ``limit_train_batches``), and in words; ``None`` where nothing
    did. Asked at the training loop's end."""
    from lightning.pytorch.callbacks import Timer

    step, held = trainer.global_step, cast(Any, trainer)  # Lightning's connectors set these; the Trainer declares none
    if held.fast_dev_run:
        return "fast_dev_run", f"fast_dev_run={held.fast_dev_run} (a smoke test) ended training at step {step}"
    timer = next((callback for callback in held.callbacks if isinstance(callback, Timer)), None)
    left = timer.time_remaining("train") if timer is not None else None
    if timer is not None and left is not None and left <= 0:
        return "max_time", f"max_time ran out at step {step} (after {timer.time_elapsed('train'):.1f} s of training)"
    max_steps, max_epochs = trainer.max_steps, trainer.max_epochs
    loop: Any = getattr(trainer, "fit_loop", None)
    batches = getattr(getattr(getattr(loop, "epoch_loop", None), "batch_progress", None), "current", None)
    in_epoch = getattr(batches, "completed", None)
    per_epoch = trainer.num_training_batches
    epoch_cut = isinstance(in_epoch, int) and isinstance(per_epoch, int) and 0 < in_epoch < per_epoch
    epochs_left = max_epochs is not None and max_epochs >= 0 and trainer.current_epoch < max_epochs
    if trainer.should_stop and not (max_steps >= 0 and step >= max_steps) and (epoch_cut or epochs_left):
        return "should_stop", f"trainer.should_stop (EarlyStopping, or the model) ended training at step {step}"
    limit = trainer.limit_train_batches
    try:
        full = len(trainer.train_dataloader)  # type: ignore[arg-type]
    except TypeError:  # no loader, or one without a length: a limit below 1.0 (or any count) cuts it, as far as known
        full = None
    cut = limit < 1.0 if isinstance(limit, float) else full is None or limit < full
    if limit is not None and cut:
        return (
            "limit_train_batches",
            f"limit_train_batches={limit}: each epoch ran {per_epoch} of its {full or 'unknown number of'} batches",
        )
    return None
