"""``hook_trainer_cls``: a drop-in for nv-one-logger's, working on lightning 2.5 and 2.6, that never
mutates the class it is given and adds compile telemetry and ``JitTransform``."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from typing_extensions import TypeVar, override

from telemetry_jit.boundary import OWN_CODE, guarded, own_code_failed
from telemetry_jit.lightning.compile_telemetry import CompileTelemetryCallback
from telemetry_jit.lightning.jit_transform import JitConfig, JitTransform
from telemetry_jit.lightning.payoff_callback import CompilePayoffCallback
from telemetry_jit.lightning.time_events import TimeEventCallback
from telemetry_jit.notices import warn_once
from telemetry_jit.recording.console import CompileConsole
from telemetry_jit.recording.driver import say_where_to_read
from telemetry_jit.recording.payoff import PayoffSettings
from telemetry_jit.session import Configuration, Session, configuration, resolve
from telemetry_jit.terminal import clean

TrainerT = TypeVar("TrainerT", bound=pl.Trainer)
CallbackT = TypeVar("CallbackT", bound=Callback, default=TimeEventCallback)  # no callback given: a TimeEventCallback


def hook_trainer_cls(
    trainer_cls: type[TrainerT],
    training_telemetry_provider: Session | TrainingTelemetryProvider,
    telemetry_callback: CallbackT | None = None,
    *,
    jit_config: JitConfig | Sequence[JitConfig] | None = None,
    compile_telemetry: bool = True,
    live: bool | CompileConsole = True,
    live_all_ranks: bool = False,
    log_figures: bool = True,
    payoff: bool | PayoffSettings = False,
) -> tuple[type[TrainerT], CallbackT]:
    """Return ``(HookedTrainer, callback)``: a subclass of ``trainer_cls`` carrying telemetry.

    nv-one-logger's arguments and return value; ``trainer_cls`` is left untouched (two calls, two classes).

    Args:
        training_telemetry_provider: the ``Session`` of ``telemetry_jit.configure``, or nv-one-logger's provider.
        telemetry_callback: the callback for nv-one-logger's time events; a :class:`TimeEventCallback` otherwise.
        jit_config: compile these modules with a :class:`JitTransform` added to every trainer without one.
        compile_telemetry: record compilation spans (``trainer.compile_telemetry``).
        live: console messages for slow compiles and recompile storms, on rank zero; a ``CompileConsole``
            to set its thresholds. ``live_all_ranks``: on every rank.
        log_figures: log compile figures under ``compile/`` to the trainer's loggers at their steps.
        payoff: measure what compiling buys (:class:`CompilePayoffCallback`); a ``PayoffSettings`` for details.
    """
    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, pl.Trainer)):
        raise TypeError(
            f"hook_trainer_cls expects a Lightning Trainer class (lightning.pytorch.Trainer or a subclass), "
            f"got {trainer_cls!r}. Pass the class, not an instance."
        )
    if not isinstance(training_telemetry_provider, (Session, TrainingTelemetryProvider)):
        raise TypeError(
            "hook_trainer_cls expects the Session telemetry_jit.configure(...) returns, or nv-one-logger's "
            f"TrainingTelemetryProvider.instance(); got {type(training_telemetry_provider).__name__}. Configure "
            "first, e.g. session = telemetry_jit.configure('my-app', file='runs/telemetry.jsonl')."
        )
    if jit_config is not None:
        JitTransform(jit_config)  # fail now, before any trainer is built, on a bad config
    if not isinstance(live, (bool, CompileConsole)):
        raise TypeError(f"hook_trainer_cls(live=...) takes True, False or a CompileConsole, got {live!r}.")
    if not isinstance(payoff, (bool, PayoffSettings)):
        raise TypeError(f"hook_trainer_cls(payoff=...) takes True, False or a PayoffSettings, got {payoff!r}.")
    if payoff is not False and not compile_telemetry:
        raise ValueError(
            "hook_trainer_cls(payoff=...) measures with the compile telemetry: keep compile_telemetry=True."
        )
    if telemetry_callback is None:
        telemetry_callback = cast(CallbackT, TimeEventCallback(training_telemetry_provider))
    compiles = payoff_callback = None
    if compile_telemetry:
        console = live if isinstance(live, CompileConsole) else (CompileConsole() if live else None)
        compiles = CompileTelemetryCallback(
            training_telemetry_provider, console, console_all_ranks=live_all_ranks, log_figures=log_figures
        )
        if payoff is not False:
            payoff_callback = CompilePayoffCallback(compiles, payoff if isinstance(payoff, PayoffSettings) else None)
    given = training_telemetry_provider if isinstance(training_telemetry_provider, Session) else None
    telemetry = _Telemetry(RankTelemetry(given), compiles, telemetry_callback, payoff_callback)
    return _hooked_class(trainer_cls, telemetry, jit_config), telemetry_callback


class RankTelemetry(Callback):
    """Tell the session which rank this process is (known by ``setup``); in a spawned rank (the callbacks are
    pickled into it, this one carrying the configuration) start a session as ``configure`` did, ending it at
    teardown. It must come before the other telemetry callbacks, whose ``setup`` needs the session."""

    def __init__(self, session: Session | None = None, launched_with: Configuration | None = None) -> None:
        self.session = session  # the session given to hook_trainer_cls (None: the one running)
        self._configuration = launched_with  # in a spawned rank: the launching process's
        self._owned: Session | None = None  # the session this callback started (in a spawned rank)

    def __reduce__(self) -> tuple[Any, ...]:
        return RankTelemetry, (None, configuration())

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        session = resolve(self.session)
        if not session.recording and self._configuration is not None and not session.ended:
            # a spawned rank: its module-level configure (if any) was the script's re-import, which records nothing
            session = self._owned = self._configuration.apply(
                trainer.global_rank, trainer.local_rank, trainer.world_size
            )
            session.start_application()
        session.set_rank(trainer.global_rank, trainer.local_rank, trainer.world_size)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        owned, self._owned = self._owned, None
        if owned is not None:  # nobody else ends a spawned rank's session
            owned.shutdown()


_HOOKS = tuple(name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown"))
_BATCH_ENDS = ("on_train_batch_end", "on_validation_batch_end", "on_test_batch_end", "on_predict_batch_end")
# hooks Lightning calls directly on every callback, not through its dispatcher that skips non-callables
_CALLED_DIRECTLY = ("on_save_checkpoint", "on_load_checkpoint")


@dataclass(eq=False)  # a callback compares by identity
class _Telemetry(Callback):
    """The callbacks every trainer of one hooked class shares, as one callback, in the order they must run:
    ranks first, compile summaries before the loop spans they go on end. One, because Lightning spends about
    15 us a step per callback, implemented or not; a hook none implements is ``None``, which Lightning's
    dispatcher skips without its profiler context."""

    ranks: RankTelemetry
    compiles: CompileTelemetryCallback | None
    time_events: Any
    payoff: CompilePayoffCallback | None = None

    def __post_init__(self) -> None:
        # the payoff's event goes on the training loop before the time events end it
        order = (self.ranks, self.compiles, self.payoff, self.time_events)
        self.callbacks = [callback for callback in order if callback is not None]
        for hook in _HOOKS:
            callbacks = self.callbacks
            if hook in _BATCH_ENDS:  # a first step ends with the batch: after the rest of telemetry's work in it
                callbacks = sorted(callbacks, key=lambda callback: callback is self.compiles)
            implementers = [getattr(cb, hook) for cb in callbacks if _implements(cb, hook)]
            if implementers:
                setattr(self, hook, _calling_each(implementers))
            elif hook not in _CALLED_DIRECTLY:
                setattr(self, hook, None)

    def __reduce__(self) -> tuple[Any, ...]:
        return _Telemetry, (self.ranks, self.compiles, self.time_events, self.payoff)


def _implements(callback: Any, hook: str) -> bool:
    return getattr(type(callback), hook, None) is not getattr(Callback, hook)


def _calling_each(hooks: list[Callable[..., Any]]) -> Callable[..., Any]:
    """One hook that calls ``hooks`` in order, each guarded (an error is telemetry's bug, said once, never the
    end of the run). Two are called with no layer between: these run every step, a ``try`` costs nothing."""
    if len(hooks) == 1:
        return guarded(hooks[0])
    if len(hooks) == 2:
        first, second = (OWN_CODE.bind(hook) for hook in hooks)

        def both(*args: Any, **kwargs: Any) -> None:
            try:
                first(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the guard
                own_code_failed(error, hooks[0])
            try:
                second(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the guard
                own_code_failed(error, hooks[1])

        return both
    each_guarded = [guarded(hook) for hook in hooks]

    def each(*args: Any, **kwargs: Any) -> None:
        for hook in each_guarded:
            hook(*args, **kwargs)

    return each


def _hooked_class(
    trainer_cls: type[TrainerT], telemetry: _Telemetry, jit_config: JitConfig | Sequence[JitConfig] | None
) -> type[TrainerT]:

    class HookedTrainer(trainer_cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given = kwargs.get("callbacks") or []
            ours = [telemetry, *telemetry.callbacks]
            callbacks = [
                cb for cb in ([given] if isinstance(given, Callback) else given) if not any(cb is c for c in ours)
            ]
            if jit_config is not None and not any(isinstance(cb, JitTransform) for cb in callbacks):
                callbacks.append(JitTransform(jit_config))
            kwargs["callbacks"] = [telemetry, *callbacks]
            super().__init__(*args, **kwargs)
            self.nv_one_logger_callback = telemetry.time_events  # for the explicit on_* calls
            self.compile_telemetry = telemetry.compiles  # its last_stats: the totals of the last loop
            self.compile_payoff = telemetry.payoff  # with payoff=True; its last_payoff: what compiling bought

        def save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            callback = telemetry.time_events
            callback.on_save_checkpoint_start(global_step=self.global_step)
            try:
                result = super().save_checkpoint(*args, **kwargs)
                callback.on_save_checkpoint_success(global_step=self.global_step)
            finally:
                callback.on_save_checkpoint_end()
            return result

        def __reduce__(self) -> tuple[Any, ...]:
            # the class lives in a closure: ddp_spawn and friends rebuild it from its ingredients
            return _rebuild_hooked_trainer, (trainer_cls, telemetry, jit_config), self.__dict__

    for call in ("fit", "validate", "test", "predict"):
        setattr(HookedTrainer, call, _recorded(trainer_cls, call, telemetry))
    HookedTrainer.__name__ = HookedTrainer.__qualname__ = f"Hooked{trainer_cls.__name__}"
    return HookedTrainer


def _recorded(trainer_cls: type[pl.Trainer], call: str, telemetry: _Telemetry) -> Callable[..., Any]:
    @functools.wraps(getattr(trainer_cls, call))
    def recorded(self: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        with _recording(self, telemetry, call):  # the method looked up now, as super() would: a later patch holds
            return getattr(trainer_cls, call)(self, *args, **kwargs)

    return recorded


# the thread whose trainer records ("thread"): nv-one-logger keeps one training loop per process
_RECORDING: dict[str, int] = {}
_RECORDING_LOCK = threading.Lock()


@contextlib.contextmanager
def _recording(trainer: pl.Trainer, telemetry: _Telemetry, call: str) -> Iterator[None]:
    """Run one trainer call with telemetry, or without it (said once) while another thread's records. An error
    anywhere inside is recorded (``on_exception`` misses what raises outside Lightning's loops)."""
    me = threading.get_ident()
    with _RECORDING_LOCK:
        nested = _RECORDING.get("thread") == me
        records = _RECORDING.setdefault("thread", me) == me
    if records:
        time_events = telemetry.time_events if isinstance(telemetry.time_events, TimeEventCallback) else None
        training_starts = time_events.training_starts if time_events is not None else 0
        failures = time_events.failures_recorded if time_events is not None else 0
        try:
            yield
        except BaseException as error:
            # what Lightning's on_exception did not record (it raised outside Lightning's handling); once: Lightning
            # turns a KeyboardInterrupt it recorded into a SystemExit of its own
            if time_events is not None and time_events.failures_recorded == failures:
                guarded(time_events.on_exception)(trainer, trainer.lightning_module, error)
            raise
        else:
            if time_events is not None and call == "fit" and not nested:
                time_events.on_fit_ended(trainer, training_starts)
        finally:
            if not nested:
                with _RECORDING_LOCK:
                    del _RECORDING["thread"]
                _say_where_to_read(trainer, telemetry)
        return
    warn_once(
        "concurrent trainers",
        f"telemetry-jit: a hooked trainer is already running in another thread of this process "
        f"({threading.current_thread().name} started one more); nv-one-logger records one training at a time per "
        "process, so this one trains without telemetry (its JitTransform still compiles). Its compilations may "
        "be counted in the recording trainer's spans, since torch reports compiles process-wide. Train in "
        "separate processes to record each.",
        every_rank=True,
    )
    holder: Any = trainer  # Lightning's callback connector sets .callbacks; the Trainer does not declare it
    callbacks = holder.callbacks
    holder.callbacks = [callback for callback in callbacks if callback is not telemetry]
    try:
        yield
    finally:
        holder.callbacks = callbacks


@guarded
def _say_where_to_read(trainer: pl.Trainer, telemetry: _Telemetry) -> None:
    """After a trainer call: where the telemetry is and the command that reads it, once per session."""
    if trainer.is_global_zero:
        say_where_to_read(resolve(telemetry.ranks.session), lambda hint: rank_zero_info(clean(hint)))


def _rebuild_hooked_trainer(
    trainer_cls: type[pl.Trainer], telemetry: _Telemetry, jit_config: JitConfig | Sequence[JitConfig] | None
) -> pl.Trainer:
    cls = _hooked_class(trainer_cls, telemetry, jit_config)
    return cls.__new__(cls)
