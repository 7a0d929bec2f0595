"""``hook_trainer_cls``: a drop-in for nv-one-logger's, working on lightning 2.5 and 2.6, that never
mutates the class it is given and adds compile telemetry and ``JitTransform``."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from nv_one_logger.core.span import Span
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.training_telemetry.api import callbacks as one_logger
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.exporters import identity
from telemetry_jit.lightning.jit_transform import JitConfig, JitTransform
from telemetry_jit.recording.console import CompileConsole
from telemetry_jit.recording.recorder import CompileRecorder, CompileStats, telemetry_enabled


class TelemetryCallback(Callback):
    """nv-one-logger's ``TimeEventCallback`` (same hooks and ``on_*`` methods) plus compile telemetry.

    Implicit: training loop and iterations, validation loop and iterations, checkpoint saves (through
    ``HookedTrainer.save_checkpoint``), and one ``compilation`` span per compile. Explicit: the
    ``on_*`` methods below, as in nv-one-logger.

    Args:
        training_telemetry_provider: the configured ``TrainingTelemetryProvider``.
        call_on_app_start: start the application span now, unless one is already running.
        compile_telemetry: record compilation spans and ``compile_summary`` events.
        live: say on the console what is compiling when a compile takes longer than a second, and
            warn about recompile storms while training runs.
        live_all_ranks: do that on every rank, not only rank zero.

    Example::

        callback = TelemetryCallback(TrainingTelemetryProvider.instance())
        trainer = Trainer(callbacks=[callback])
        callback.on_model_init_start()
    """

    def __init__(
        self,
        training_telemetry_provider: TrainingTelemetryProvider,
        call_on_app_start: bool = True,
        compile_telemetry: bool = True,
        live: bool = True,
        live_all_ranks: bool = False,
    ) -> None:
        self._provider = training_telemetry_provider
        self._live = (live, live_all_ranks)
        self.compiles = CompileRecorder(training_telemetry_provider) if compile_telemetry else None
        self.last_compile_stats: CompileStats | None = None
        self._call_on_app_start = call_on_app_start
        self._warned_not_configured = False
        self._spawned_configuration: dict[str, Any] | None = None
        self._owns_application = False
        self._training_loop: Span | None = None
        # nv-one-logger's is_train/validation_iterations_enabled, read when each loop starts
        self._train_iterations = False
        self._validation_iterations = False
        if not call_on_app_start:
            return
        if self._ready():
            if not nv_one_logger_compat.application_running(self._provider):
                one_logger.on_app_start()
        else:
            self._warn_not_configured()

    def _warn_not_configured(self) -> None:
        if self._warned_not_configured:
            return
        self._warned_not_configured = True
        warnings.warn(
            "telemetry-jit: the telemetry provider is not configured, so nothing is recorded; training runs as usual. "
            "Call telemetry_jit.configure(app_name, file=...) (or nv-one-logger's configure_provider()) before "
            "hook_trainer_cls, or at least before fit.",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- processes started by spawning (ddp_spawn): pickled here, configured again there -----------
    def __getstate__(self) -> dict[str, Any]:
        from telemetry_jit.configure import configuration

        return {"configuration": configuration(), "compile_telemetry": self.compiles is not None, "live": self._live}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            TrainingTelemetryProvider.instance(),
            call_on_app_start=False,
            compile_telemetry=state["compile_telemetry"],
            live=state["live"][0],
            live_all_ranks=state["live"][1],
        )
        self._spawned_configuration = state["configuration"]

    def _configure_spawned_rank(self) -> None:
        """In a process started by spawning, configure telemetry as the launching process did."""
        from telemetry_jit.configure import configure

        configure(**self._spawned_configuration)
        one_logger.on_app_start()
        self._owns_application = True

    # -- state -------------------------------------------------------------------------------
    def _ready(self) -> bool:
        return telemetry_enabled()

    def _active_span(self, name: str) -> Any:
        if not self._ready():
            return None
        spans = self._provider.recorder.get_active_spans_by_name(name)
        return spans[-1] if spans else None

    # -- Lightning hooks -----------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # the strategy has set up the ranks by now; exporters put them on every record
        identity.update(trainer.global_rank, trainer.local_rank, trainer.world_size)
        if not self._ready() and self._spawned_configuration is not None:
            self._configure_spawned_rank()
        if not self._ready():
            self._warn_not_configured()
        elif self._call_on_app_start and not nv_one_logger_compat.application_running(self._provider):
            # configured after hook_trainer_cls: the application span can only start now
            warnings.warn(
                "telemetry-jit: the telemetry provider was configured after hook_trainer_cls; the application span "
                "starts at this fit/validate/test. Configure before hooking to include start-up.",
                RuntimeWarning,
                stacklevel=2,
            )
            one_logger.on_app_start()
        if self.compiles is not None:
            live, all_ranks = self._live
            show = live and (all_ranks or trainer.is_global_zero)
            bar = trainer.progress_bar_callback
            self.compiles.console = CompileConsole(print_fn=bar.print if bar is not None else None) if show else None
            self.compiles.start(functools.partial(_position, trainer))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.compiles is not None:
            self.compiles.stop()
        if self._owns_application:  # a spawned rank: nobody else ends its application
            self._owns_application = False
            self.on_app_end()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Close what the failed run left open, marked with the error; the exception itself goes on unchanged."""
        if self.compiles is not None:
            self.compiles.stop(exception)
        if not self._ready():
            return
        self._summarize(self._active_span("training_loop") or self._active_span("validation_loop"))
        message = f"{type(exception).__name__}: {exception}"
        for name, end in (
            ("validation_single_iteration", one_logger.on_validation_single_iteration_end),
            ("training_single_iteration", one_logger.on_training_single_iteration_end),
            ("validation_loop", one_logger.on_validation_end),
            ("training_loop", one_logger.on_train_end),
        ):
            span = self._active_span(name)
            if span is not None:
                self._provider.recorder.error(span, message)
                end()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._ready():
            return
        config = self._provider.config.telemetry_config
        if config is None:
            warnings.warn(
                "telemetry-jit: no training telemetry config is set, so training-loop spans are skipped. "
                "Use telemetry_jit.configure(...) or provider.set_training_telemetry_config(...) before fit.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        target = None if config.train_iterations_target else max(int(trainer.estimated_stepping_batches), 1)
        one_logger.on_train_start(
            train_iterations_start=trainer.global_step,
            train_samples_start=trainer.global_step * config.global_batch_size,
            train_iterations_target_or_fn=target,
        )
        self._training_loop = self._active_span("training_loop")
        self._train_iterations = config.is_train_iterations_enabled

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.compiles is not None:
            self.compiles.ensure_registered()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training_loop = None
        loop = self._active_span("training_loop")
        self._summarize(loop, trainer)
        if loop is not None:
            one_logger.on_train_end()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.compiles is not None:
            self.compiles.batch_started()
        if self._train_iterations and self._ready():
            # per-step calls go to the recorder itself, not nv-one-logger's callbacks module: one
            # safe-execution wrapper per call instead of two (~24 us a step)
            self._provider.recorder.on_training_single_iteration_start(TracingTimestamp.now())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.compiles is not None:
            self.compiles.poll()
        if self._train_iterations and self._ready():
            self._provider.recorder.on_training_single_iteration_end(TracingTimestamp.now())
            if self._training_loop is not None:
                nv_one_logger_compat.forget_exported_events(self._training_loop)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.compiles is not None:
            self.compiles.ensure_registered()
        if self._ready():
            config = self._provider.config.telemetry_config
            self._validation_iterations = config is not None and config.is_validation_iterations_enabled
            one_logger.on_validation_start()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._ready():
            return
        # Lightning may skip on_validation_batch_end (lightning#20999); close the iteration first.
        if self._active_span("validation_single_iteration") is not None:
            one_logger.on_validation_single_iteration_end()
        if trainer.state.fn == "validate":
            self._summarize(self._active_span("validation_loop"), trainer)
        one_logger.on_validation_end()

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.compiles is not None:
            self.compiles.batch_started()
        if not (self._validation_iterations and self._ready()):
            return
        recorder = self._provider.recorder
        if recorder.get_active_spans_by_name("validation_single_iteration"):
            # Lightning skipped the batch end (lightning#20999)
            recorder.on_validation_single_iteration_end(TracingTimestamp.now())
        recorder.on_validation_single_iteration_start(TracingTimestamp.now())

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.compiles is not None:
            self.compiles.poll()
        if self._validation_iterations and self._ready():
            self._provider.recorder.on_validation_single_iteration_end(TracingTimestamp.now())

    def on_test_batch_start(self, *args: Any, **kwargs: Any) -> None:
        if self.compiles is not None:
            self.compiles.batch_started()

    def on_predict_batch_start(self, *args: Any, **kwargs: Any) -> None:
        if self.compiles is not None:
            self.compiles.batch_started()

    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.compiles is not None:
            self.compiles.poll()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._summarize(self._active_span("testing_loop"), trainer)

    def _summarize(self, span: Any, trainer: pl.Trainer | None = None) -> None:
        if self.compiles is None:
            return
        counts = None
        if trainer is not None and trainer.world_size > 1:
            # every rank reaches this hook: a collective is safe here, and ranks that compile a
            # different number of times are a classic cause of hangs
            self.compiles.poll()
            gathered = trainer.strategy.all_gather(torch.tensor([self.compiles.stats.count]))
            counts = [int(count) for count in gathered.flatten().tolist()]
            if len(set(counts)) > 1:
                rank_zero_warn(
                    f"telemetry-jit: ranks compiled a different number of times ({counts}, by rank). Ranks that "
                    "recompile differently can desynchronise collectives and hang; see the compile spans per rank."
                )
        self.last_compile_stats = self.compiles.emit_summary(span, count_by_rank=counts)

    # -- checkpoint saves, called by HookedTrainer.save_checkpoint ----------------------------
    def on_save_checkpoint_start(self, global_step: int) -> None:
        if self._ready():
            one_logger.on_save_checkpoint_start(global_step)

    def on_save_checkpoint_success(self, global_step: int) -> None:
        if self._ready():
            one_logger.on_save_checkpoint_success(global_step=global_step)

    def on_save_checkpoint_end(self, global_step: int | None = None) -> None:
        if self._ready():
            one_logger.on_save_checkpoint_end()

    # -- explicit calls, as in nv-one-logger ---------------------------------------------------
    def _explicit(self, call: Any) -> None:
        if self._ready():
            call()
        else:
            self._warn_not_configured()

    def on_app_end(self) -> None:
        if self._ready() and nv_one_logger_compat.application_running(self._provider):
            one_logger.on_app_end()

    def on_model_init_start(self) -> None:
        self._explicit(one_logger.on_model_init_start)

    def on_model_init_end(self) -> None:
        self._explicit(one_logger.on_model_init_end)

    def on_dataloader_init_start(self) -> None:
        self._explicit(one_logger.on_dataloader_init_start)

    def on_dataloader_init_end(self) -> None:
        self._explicit(one_logger.on_dataloader_init_end)

    def on_optimizer_init_start(self) -> None:
        self._explicit(one_logger.on_optimizer_init_start)

    def on_optimizer_init_end(self) -> None:
        self._explicit(one_logger.on_optimizer_init_end)

    def on_load_checkpoint_start(self) -> None:
        self._explicit(one_logger.on_load_checkpoint_start)

    def on_load_checkpoint_end(self) -> None:
        self._explicit(one_logger.on_load_checkpoint_end)

    def on_testing_start(self) -> None:
        self._explicit(one_logger.on_testing_start)

    def on_testing_end(self) -> None:
        self._explicit(one_logger.on_testing_end)


def _position(trainer: pl.Trainer) -> tuple[int, str]:
    stage = trainer.state.stage
    return trainer.global_step, stage.value if stage is not None else ""


def _as_callback_list(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    return list(callbacks)


def hook_trainer_cls(
    trainer_cls: type[pl.Trainer],
    training_telemetry_provider: TrainingTelemetryProvider,
    telemetry_callback: Any = None,
    *,
    jit_config: JitConfig | Sequence[JitConfig] | None = None,
    compile_telemetry: bool = True,
    live: bool = True,
) -> tuple[type[pl.Trainer], Any]:
    """Return ``(HookedTrainer, callback)``: a subclass of ``trainer_cls`` carrying telemetry.

    Same arguments and return value as nv-one-logger's ``hook_trainer_cls``; ``trainer_cls`` itself is
    left untouched, so a plain ``Trainer`` built later has no telemetry and two calls give two
    independent classes.

    Args:
        trainer_cls: ``lightning.pytorch.Trainer`` or a subclass.
        training_telemetry_provider: ``TrainingTelemetryProvider.instance()``, configured.
        telemetry_callback: reuse this callback (a :class:`TelemetryCallback` or nv-one-logger's
            ``TimeEventCallback``); one is created otherwise.
        jit_config: compile these modules with a :class:`JitTransform` added to every trainer
            (unless the trainer is given its own ``JitTransform``).
        compile_telemetry: record compilation spans (only for a callback created here).
        live: console messages for slow compiles and recompile storms, on rank zero (only for a
            callback created here).

    Example::

        HookedTrainer, callback = hook_trainer_cls(Trainer, TrainingTelemetryProvider.instance(),
                                                   jit_config=JitConfig(use_torch=True))
        trainer = HookedTrainer(max_epochs=2)
        trainer.fit(model)
        callback.on_app_end()
    """
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, pl.Trainer)):
        raise TypeError(
            f"hook_trainer_cls expects a Lightning Trainer class (lightning.pytorch.Trainer or a subclass), "
            f"got {trainer_cls!r}. Pass the class, not an instance."
        )
    if not isinstance(training_telemetry_provider, TrainingTelemetryProvider):
        raise TypeError(
            "hook_trainer_cls expects nv-one-logger's TrainingTelemetryProvider.instance(), got "
            f"{type(training_telemetry_provider).__name__}. Configure it first, e.g. with telemetry_jit.configure(...)."
        )
    if jit_config is not None:
        JitTransform(jit_config)  # fail now, before any trainer is built, on a bad config
    if telemetry_callback is None:
        telemetry_callback = TelemetryCallback(
            training_telemetry_provider, compile_telemetry=compile_telemetry, live=live
        )

    return _hooked_class(trainer_cls, telemetry_callback, jit_config), telemetry_callback


def _hooked_class(trainer_cls: type[pl.Trainer], telemetry_callback: Any, jit_config: Any) -> type[pl.Trainer]:
    """A new subclass of ``trainer_cls`` that adds ``telemetry_callback`` (and a ``JitTransform``)."""

    class HookedTrainer(trainer_cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            callbacks = [cb for cb in _as_callback_list(kwargs.get("callbacks")) if cb is not telemetry_callback]
            if jit_config is not None and not any(isinstance(cb, JitTransform) for cb in callbacks):
                callbacks.append(JitTransform(jit_config))
            kwargs["callbacks"] = [telemetry_callback, *callbacks]
            super().__init__(*args, **kwargs)
            self._nv_one_logger_callback = telemetry_callback

        @property
        def nv_one_logger_callback(self) -> Any:
            """The telemetry callback, for the explicit ``on_*`` calls."""
            return self._nv_one_logger_callback

        def save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            callback = self._nv_one_logger_callback
            callback.on_save_checkpoint_start(global_step=self.global_step)
            try:
                result = super().save_checkpoint(*args, **kwargs)
                callback.on_save_checkpoint_success(global_step=self.global_step)
            finally:
                callback.on_save_checkpoint_end()
            return result

        def __reduce__(self) -> tuple[Any, ...]:
            # the class lives in a closure: ddp_spawn and friends rebuild it from its ingredients
            return _rebuild_hooked_trainer, (trainer_cls, telemetry_callback, jit_config), self.__dict__

    HookedTrainer.__name__ = HookedTrainer.__qualname__ = f"Hooked{trainer_cls.__name__}"
    return HookedTrainer


def _rebuild_hooked_trainer(trainer_cls: type[pl.Trainer], telemetry_callback: Any, jit_config: Any) -> pl.Trainer:
    cls = _hooked_class(trainer_cls, telemetry_callback, jit_config)
    return cls.__new__(cls)
