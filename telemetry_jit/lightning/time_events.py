"""nv-one-logger's time events from Lightning's hooks: the application, training and validation
loops and iterations, checkpoint saves, and the explicit ``on_*`` calls."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from nv_one_logger.training_telemetry.api import callbacks as one_logger
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from typing_extensions import override

from telemetry_jit.boundary import call_site, guarded, guards_itself
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat.nv_one_logger import ITERATION_FAST_PATH_VERIFIED, IterationBookkeeping
from telemetry_jit.notices import Notices, user_line, warn_once
from telemetry_jit.recording.driver import record_error, say_trained_nothing
from telemetry_jit.recording.recorder import active_span
from telemetry_jit.schema import TrainingSpanName
from telemetry_jit.session import Session, resolve
from telemetry_jit.terminal import error_text

_CALLBACKS = call_site("nv_one_logger.callbacks", "nv-one-logger's time-event calls (on_train_start, ...)")
_ITERATIONS = call_site("nv_one_logger.iterations", "nv-one-logger's per-iteration bookkeeping")


def _explicit_call(call: Callable[[], None]) -> Callable[[TimeEventCallback], None]:
    """One of nv-one-logger's explicit calls (``on_model_init_start``, ...) as a guarded method of the callback."""

    def explicit(self: TimeEventCallback) -> None:
        self._explicit(call)

    explicit.__name__ = call.__name__
    explicit.__qualname__ = f"TimeEventCallback.{call.__name__}"
    return guarded(explicit)


class TimeEventCallback(Callback):
    """nv-one-logger's ``TimeEventCallback``, on lightning 2.5 and 2.6: the same hooks, spans and ``on_*`` methods
    (the training and validation loops and iterations; checkpoint saves through ``HookedTrainer.save_checkpoint``;
    the explicit ``on_*`` calls, e.g. ``callback.on_model_init_start()``).

    Args:
        training_telemetry_provider: the configured ``TrainingTelemetryProvider``.
        call_on_app_start: start the application span now, unless one is already running.
        iteration_fast_path: do nv-one-logger's per-iteration bookkeeping without the iteration
            spans when they are not exported (its default): the same exported records at a fraction
            of the per-step cost (see :class:`~telemetry_jit.compat.nv_one_logger.IterationBookkeeping`).
    """

    def __init__(
        self,
        training_telemetry_provider: Session | TrainingTelemetryProvider | None,
        call_on_app_start: bool = True,
        iteration_fast_path: bool = True,
    ) -> None:
        self._given = training_telemetry_provider
        self._session = resolve(training_telemetry_provider)
        self._call_on_app_start = call_on_app_start
        self.iteration_fast_path = iteration_fast_path
        self._iterations: IterationBookkeeping | None = None
        self._notices = Notices()
        # nv-one-logger's is_train/validation_iterations_enabled, read when each loop starts
        self._training_start: Callable[[], None] | None = None
        self._training_end: Callable[[], None] | None = None
        self._validation_iterations: IterationBookkeeping | None = None
        self.failures_recorded = 0  # Lightning's on_exception and HookedTrainer's call both may say one failure
        # training loops begun: Lightning starts none in a fit that has nothing to train (its loop is skipped)
        self.training_starts = 0
        if call_on_app_start and self._session.recording:
            self._session.start_application()
        elif call_on_app_start:
            self._warn_not_configured()

    @property
    def _provider(self) -> TrainingTelemetryProvider:
        return self._session.provider

    def __reduce__(self) -> tuple[Any, ...]:
        # the session is per process: a spawned rank records through its own, found at setup
        return functools.partial(
            type(self), None, call_on_app_start=False, iteration_fast_path=self.iteration_fast_path
        ), ()

    def _bookkeeping(self) -> IterationBookkeeping:
        """nv-one-logger's per-iteration calls, for the recorder of this configuration."""
        recorder = self._provider.recorder
        if self._iterations is None or self._iterations.recorder is not recorder:
            self._iterations = IterationBookkeeping(recorder, fast=self.iteration_fast_path)
            release = self._iterations.unverified_release
            if release and self.iteration_fast_path:
                warn_once(
                    "iteration fast path unverified",
                    f"telemetry-jit: nv-one-logger-training-telemetry {release} is not a release its per-iteration "
                    f"fast path was verified against ({', '.join(ITERATION_FAST_PATH_VERIFIED)}); nv-one-logger's own "
                    "(slower) per-iteration path is used.",
                )
        return self._iterations

    def _warn_not_configured(self) -> None:
        if self._session.inert:
            return  # a spawned worker re-running the script: not the run
        if self._session.ended:
            self._session.account.notices.warn(  # the ended session's own: said once for it
                "session ended",
                "telemetry-jit: this trainer was hooked to a telemetry session that has ended (telemetry_jit.shutdown "
                "or on_app_end ran), so it trains without telemetry. To record it, hook again with the session a "
                "new telemetry_jit.configure(...) returns.",
                origin=user_line(),
            )
            return
        self._notices.warn(
            "not configured",
            "telemetry-jit: the telemetry provider is not configured, so nothing is recorded; training runs as usual. "
            "Call telemetry_jit.configure(app_name, file=...) (or nv-one-logger's configure_provider()) before "
            "hook_trainer_cls, or at least before fit.",
            stacklevel=3,
        )

    # -- the loops ------------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._session = resolve(self._given)  # configured since it was given, or a spawned rank's own
        if not self._session.recording:
            self._warn_not_configured()
        elif self._call_on_app_start and not nv_one_logger_compat.application_running(self._provider):
            self._notices.warn(
                "configured late",
                "telemetry-jit: the telemetry provider was configured after hook_trainer_cls; the application span "
                "starts at this fit/validate/test. Configure before hooking to include start-up.",
            )
            self._session.start_application()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.training_starts += 1
        self._training_start = self._training_end = None
        if not self._session.recording:
            return
        config = self._provider.config.telemetry_config
        if config is None:
            self._notices.warn(
                "no training config",
                "telemetry-jit: no training telemetry config is set, so training-loop spans are skipped. "
                "Use telemetry_jit.configure(...) or provider.set_training_telemetry_config(...) before fit.",
            )
            return
        target = None if config.train_iterations_target else max(int(trainer.estimated_stepping_batches), 1)
        _CALLBACKS.call(
            one_logger.on_train_start,
            train_iterations_start=trainer.global_step,
            train_samples_start=trainer.global_step * config.global_batch_size,
            train_iterations_target_or_fn=target,
        )
        if config.is_train_iterations_enabled:
            iterations = self._bookkeeping()
            self._training_start = _ITERATIONS.bind(iterations.training_start)
            self._training_end = _ITERATIONS.bind(iterations.training_end)

    @override
    @guards_itself
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # nv-one-logger's per-iteration calls without its callbacks module: the bookkeeping asks whether
        # nv-one-logger still records only where it matters (asking costs ~4 us in a real loop); guarded
        # inline, as _ITERATIONS.call would guard them, without its call every step
        if (start := self._training_start) is not None:
            try:
                start()
            except Exception as error:  # noqa: BLE001 - the guard
                _ITERATIONS.failed(error, start)

    @override
    @guards_itself
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (end := self._training_end) is not None:
            try:
                end()
            except Exception as error:  # noqa: BLE001 - the guard
                _ITERATIONS.failed(error, end)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if active_span(self._session, TrainingSpanName.TRAINING_LOOP) is not None:
            _CALLBACKS.call(one_logger.on_train_end)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._session.recording:
            config = self._provider.config.telemetry_config
            enabled = config is not None and config.is_validation_iterations_enabled
            self._validation_iterations = self._bookkeeping() if enabled else None
            _CALLBACKS.call(one_logger.on_validation_start)

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if (iterations := self._validation_iterations) is not None:
            _ITERATIONS.call(iterations.validation_start)

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
        if (iterations := self._validation_iterations) is not None:
            _ITERATIONS.call(iterations.validation_end)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._session.recording:
            return
        # Lightning may skip on_validation_batch_end (lightning#20999); close the iteration first.
        _ITERATIONS.call(self._bookkeeping().validation_end)
        _CALLBACKS.call(one_logger.on_validation_end)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """End what the failed run left open, marked with the error; the exception goes on unchanged."""
        if self._session.recording:
            stage = trainer.state.stage.value if trainer.state.stage is not None else "run"
            _CALLBACKS.call(self._end_failed, exception, f"{stage} step {trainer.global_step}")

    def _end_failed(self, exception: BaseException, where: str) -> None:
        self.failures_recorded += 1
        message = f"{error_text(exception)} (at {where})"
        typed = exception if isinstance(exception, Exception) else None  # nv-one-logger takes no KeyboardInterrupt
        iterations = self._bookkeeping()
        ended_loop = False
        for name, end in (
            (TrainingSpanName.VALIDATION_ITERATION, iterations.validation_end),
            (TrainingSpanName.TRAINING_ITERATION, iterations.training_end),
        ):
            span = active_span(self._session, name)  # none on the fast path: the error would go nowhere anyway
            if span is not None:
                self._provider.recorder.error(span, message, typed)
            end()
        for name, end_loop in (
            (TrainingSpanName.VALIDATION_LOOP, one_logger.on_validation_end),
            (TrainingSpanName.TRAINING_LOOP, one_logger.on_train_end),
        ):
            span = active_span(self._session, name)
            if span is not None:
                self._provider.recorder.error(span, message, typed)
                end_loop()
                ended_loop = True
        application = active_span(self._session, TrainingSpanName.APPLICATION)
        if not ended_loop and application is not None:
            # it failed before or between its loops (setup, configure_optimizers, a warning made an error): the
            # run failed all the same, so the application span carries the error, as a plain loop's does
            record_error(self._session, application, exception, where)

    @guarded
    def on_fit_ended(self, trainer: pl.Trainer, training_starts_before: int) -> None:
        """After a fit that returned: say so on the application span where it began no training loop (a count of
        batches would not tell: a resumed fit restores the count its checkpoint holds)."""
        if not self._session.recording or self.training_starts != training_starts_before:
            return
        say_trained_nothing(self._session, _why_nothing(trainer))

    # -- checkpoint saves, called by HookedTrainer.save_checkpoint (guarded, as every hook: never the run's end) --
    @guarded
    def on_save_checkpoint_start(self, global_step: int) -> None:
        if self._session.recording:
            _CALLBACKS.call(one_logger.on_save_checkpoint_start, global_step)

    @guarded
    def on_save_checkpoint_success(self, global_step: int) -> None:
        if self._session.recording:
            _CALLBACKS.call(one_logger.on_save_checkpoint_success, global_step=global_step)

    @guarded
    def on_save_checkpoint_end(self, global_step: int | None = None) -> None:
        if self._session.recording:
            _CALLBACKS.call(one_logger.on_save_checkpoint_end)

    def _explicit(self, call: Callable[[], None]) -> None:
        if self._session.recording:
            _CALLBACKS.call(call)
        else:
            self._warn_not_configured()

    @guarded
    def on_app_end(self) -> None:
        """End the application: the session's telemetry is flushed and closed (as :func:`telemetry_jit.shutdown`)."""
        if self._session.configuration is not None:
            self._session.shutdown()
        elif self._session.recording and nv_one_logger_compat.application_running(self._provider):
            _CALLBACKS.call(one_logger.on_app_end)

    # -- explicit calls, as in nv-one-logger: recorded, or a warning that nothing is --------------
    on_model_init_start = _explicit_call(one_logger.on_model_init_start)
    on_model_init_end = _explicit_call(one_logger.on_model_init_end)
    on_dataloader_init_start = _explicit_call(one_logger.on_dataloader_init_start)
    on_dataloader_init_end = _explicit_call(one_logger.on_dataloader_init_end)
    on_optimizer_init_start = _explicit_call(one_logger.on_optimizer_init_start)
    on_optimizer_init_end = _explicit_call(one_logger.on_optimizer_init_end)
    on_load_checkpoint_start = _explicit_call(one_logger.on_load_checkpoint_start)
    on_load_checkpoint_end = _explicit_call(one_logger.on_load_checkpoint_end)
    on_testing_start = _explicit_call(one_logger.on_testing_start)
    on_testing_end = _explicit_call(one_logger.on_testing_end)


def _why_nothing(trainer: pl.Trainer) -> str:
    """Lightning's reason for a fit without a training step, as the trainer's settings tell it."""
    if trainer.max_steps == 0:
        return "max_steps=0"
    if trainer.max_epochs == 0:
        return "max_epochs=0"
    if trainer.limit_train_batches == 0:
        return "limit_train_batches=0"
    if not trainer.num_training_batches:
        return "no training batches: the training dataloader is empty"
    if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return f"it had reached max_steps={trainer.max_steps} already (resumed from a finished checkpoint)"
    if trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch:
        return f"it had reached max_epochs={trainer.max_epochs} already (resumed from a finished checkpoint)"
    return "Lightning stopped the fit before its first training step"
