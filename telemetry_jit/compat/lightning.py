"""Lightning's internals telemetry-jit reads: the step its loggers log at."""

from __future__ import annotations

import lightning.pytorch as pl


def logging_step(trainer: pl.Trainer) -> int:
    """The step Lightning's loggers log at now: ``trainer.fit_loop.epoch_loop._batches_that_stepped``, which
    during a fit's validation is one behind ``global_step`` (``val_loss`` of the validation after step 5 is
    logged at step 4), and ``global_step`` where Lightning lacks it."""
    stepped = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    return stepped if isinstance(stepped, int) else trainer.global_step
