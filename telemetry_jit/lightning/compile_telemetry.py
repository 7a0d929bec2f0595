"""Compile telemetry from Lightning's hooks: a ``compilation`` span per compile and a
``compile_summary`` per loop."""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from typing_extensions import override

from telemetry_jit.causes import BY_ITSELF
from telemetry_jit.compat import lightning as lightning_compat
from telemetry_jit.lightning.jit_transform import selector_for
from telemetry_jit.recording.console import CompileConsole, say_line
from telemetry_jit.recording.driver import TelemetryDriver
from telemetry_jit.recording.recorder import Position, active_span
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import StoppedEarly
from telemetry_jit.schema import TrainingSpanName
from telemetry_jit.session import Session


class CompileTelemetryCallback(Callback):
    """Record every ``torch.compile`` and thunder compilation while the trainer runs: a ``compilation`` span
    under the running loop each, a ``compile_summary`` event at each loop's end (every rank's totals).

    Args:
        training_telemetry_provider: the session, or nv-one-logger's configured provider.
        console: announces slow compiles and warns about recompile storms; ``None`` for silence. Without a
            ``print_fn`` of its own it prints through the progress bar.
        console_all_ranks: use the console on every rank, not only on rank zero.
        skew_warning_s: rank zero warns when the ranks' compile times at a loop's end lie further apart.
        log_figures: log compile figures (``compile/time_s``, ...) to the trainer's loggers at their step.
        log_figures_per_rank: also each rank's figures at each loop's end (``compile/rank<R>/...``).
    """

    def __init__(
        self,
        training_telemetry_provider: Session | TrainingTelemetryProvider | None,
        console: CompileConsole | None = None,
        console_all_ranks: bool = False,
        skew_warning_s: float = 60.0,
        log_figures: bool = True,
        log_figures_per_rank: bool = False,
    ) -> None:
        self.skew_warning_s = skew_warning_s
        self.log_figures = log_figures
        self.log_figures_per_rank = log_figures_per_rank
        self.console = console
        self.console_all_ranks = console_all_ranks
        self._print_fn = console.print_fn if console is not None else None
        self.driver = TelemetryDriver(training_telemetry_provider)
        self.last_stats: CompileStats | None = None  # the totals of the last loop that ended
        self.loader: int | None = None  # the running evaluation loop's dataloader, where it has several
        self._tuner = False  # the trainer has the Tuner's callback: its trials are a stage of their own

    def __reduce__(self) -> tuple[Any, ...]:
        # the provider is per process: a spawned rank uses its own
        return functools.partial(type(self), None, **{name: getattr(self, name) for name in _SETTINGS}), ()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.driver.resolve()  # a spawned rank's own, or configured late
        bar = trainer.progress_bar_callback  # lines printed through it keep its bar whole
        bar_print = bar.print if bar is not None else None
        console = self.console if self.console_all_ranks or trainer.is_global_zero else None
        if console is not None:
            if self._print_fn is None:  # one of its own is kept
                console.print_fn = bar_print
            console.stage_names = {stage: BY_ITSELF[stage]} if stage in BY_ITSELF else {}
        self.driver.listen([console] if console is not None else [])
        self._tuner = _has_tuner(trainer)
        self.driver.skew_warning_s, self.driver.log_figures_per_rank = self.skew_warning_s, self.log_figures_per_rank
        logs = [(logger.log_metrics, type(logger).__name__) for logger in trainer.loggers] if self.log_figures else []
        self.driver.log_to(logs, trainer.loggers)
        self.driver.say = functools.partial(say_line, bar_print or rank_zero_info)
        self.driver.start(functools.partial(_position, trainer, self), rank=trainer.global_rank)
        self._steps = lightning_compat.global_step_counter(trainer)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.driver.loop_started()

    on_validation_start = on_train_epoch_start

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # a training batch's stage is "train" but in the Tuner's trials: no lookup at every step
        self._batch_started(trainer, batch_idx, _stage(trainer, True) if self._tuner else "train")

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_started(trainer, batch_idx, _stage(trainer, self._tuner), dataloader_idx)

    on_test_batch_start = on_predict_batch_start = on_validation_batch_start

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.driver.batch_ended()  # a first step ends with its batch (one attribute read on the others)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.driver.batch_ended()

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end

    # a batch's compiles are recorded when the next batch starts or the loop ends (its end only ends a first step)
    def _batch_started(self, trainer: pl.Trainer, batch_idx: int, stage: str, loader: int | None = None) -> None:
        self.loader = loader if loader is not None and _loaders(trainer) > 1 else None
        if batch_idx == 0:  # every loop's JitTransform has compiled by its first batch
            pl_module = trainer.lightning_module
            self._steps = lightning_compat.global_step_counter(trainer)
            if stage != "sanity_check":  # before the first training epoch, which JitTransform compiles for
                self.driver.model_ready(pl_module, functools.partial(selector_for, pl_module))
            else:
                self.driver.watch(pl_module)
        # figures are logged up to the step this batch logs at, as _position says it (the steps before it are
        # over); a figure of this loop's own step stays pending through the rest of its batches
        step = self._steps.completed  # trainer.global_step, without its four properties
        self.driver.batch_started(step, batch_idx, stage, self.loader, lightning_compat.logging_step(trainer))

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stopped = lightning_compat.stopped_early(trainer)  # said on the training loop, before its summary
        if stopped is not None:
            self.driver.stopped_early(StoppedEarly(*stopped))
        self._summarize(trainer, TrainingSpanName.TRAINING_LOOP)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "validate":
            self._summarize(trainer, TrainingSpanName.VALIDATION_LOOP)
        else:  # in fit: its compiles go in the training summary, their spans under this loop, which ends next
            self.driver.loop_paused()

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._summarize(trainer, TrainingSpanName.TESTING_LOOP)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.driver.stop()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Keep what compiled; mark the compile that failed with the error."""
        self.driver.failed(exception, mark=False)  # Lightning's time events end its spans with the error
        session = self.driver.session
        loop = active_span(session, TrainingSpanName.TRAINING_LOOP) or active_span(
            session, TrainingSpanName.VALIDATION_LOOP
        )
        self.last_stats = self.driver.loop_ended(loop)  # with the figures of the steps that compiled before it

    def _summarize(self, trainer: pl.Trainer, loop_name: str) -> None:
        # every rank reaches this hook: a collective (the strategy's all_gather) is safe here
        self.last_stats = self.driver.loop_ended(
            active_span(self.driver.session, loop_name),
            loop=loop_name,
            step=lightning_compat.logging_step(trainer),  # where each rank's figures are logged
            world_size=trainer.world_size,
            gather=trainer.strategy.all_gather,
        )


def _position(trainer: pl.Trainer, callback: CompileTelemetryCallback) -> Position:
    stage = _stage(trainer, callback._tuner)
    # compile figures go to the loggers at the step Lightning logs that batch's own metrics at: the batches that
    # stepped (not global_step, which counts optimizer steps: two a batch under manual optimization with two
    # optimizers, and one more mid-batch after the first); during a fit's validation, one behind global_step
    log_step = lightning_compat.logging_step(trainer)
    batches = _batches(trainer, stage, callback.loader)
    last = batches is None and lightning_compat.is_last_batch(trainer)  # a loader of no length knows at its end
    return Position(trainer.global_step, stage, batches, log_step, last_batch=last)


def _stage(trainer: pl.Trainer, tuner: bool = False) -> str:
    """Lightning's stage (``train``, ``validate``, ...), or ``tuner`` while the Tuner's trials run (``tuner``: the
    trainer has the Tuner's callback, which Lightning takes out of ``trainer.callbacks`` while its trials run)."""
    if tuner and not _has_tuner(trainer):
        return "tuner"
    stage = trainer.state.stage
    return stage.value if stage is not None else ""


def _has_tuner(trainer: pl.Trainer) -> bool:
    callbacks: list[Callback] = getattr(trainer, "callbacks", [])  # set by Lightning's callback connector
    return any(isinstance(callback, (BatchSizeFinder, LearningRateFinder)) for callback in callbacks)


_SETTINGS = ("console", "console_all_ranks", "skew_warning_s", "log_figures", "log_figures_per_rank")
_BATCH_COUNTS = {  # Lightning's stage -> the Trainer property counting its batches
    "train": "num_training_batches",
    "sanity_check": "num_sanity_val_batches",
    "validate": "num_val_batches",
    "test": "num_test_batches",
    "predict": "num_predict_batches",
}


def _loaders(trainer: pl.Trainer) -> int:
    """How many dataloaders the running evaluation loop has."""
    counts = getattr(trainer, _BATCH_COUNTS.get(_stage(trainer), ""), None)
    return len(counts) if isinstance(counts, list) else 1


def _batches(trainer: pl.Trainer, stage: str, loader: int | None) -> int | None:
    """How many batches the running loop's dataloader has (the ``loader``-th, for several), where finite."""
    counts = getattr(trainer, _BATCH_COUNTS.get(stage, ""), None)
    if isinstance(counts, list):
        counts = counts[loader or 0] if len(counts) > (loader or 0) else None
    return int(counts) if isinstance(counts, (int, float)) and counts != float("inf") else None
