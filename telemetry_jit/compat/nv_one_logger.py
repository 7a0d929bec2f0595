"""The nv-one-logger adapter: the internals of nv-one-logger 2.3 that telemetry-jit relies on (its public API,
``TrainingTelemetryProvider``, the ``callbacks`` module, ``Span``/``Event``, is used directly)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

from nv_one_logger.api.one_logger_provider import OneLoggerProvider
from nv_one_logger.core.exceptions import assert_that
from nv_one_logger.core.span import Span, StandardSpanName
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.exporter.exporter import Exporter
from nv_one_logger.recorder.default_recorder import DefaultRecorder
from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder

S = TypeVar("S")


def telemetry_enabled() -> bool:
    """Whether nv-one-logger is configured and recording (it disables itself after an internal error)."""
    return OneLoggerProvider.instance().one_logger_enabled


class _DisableWatch(logging.Handler):
    """Hears nv-one-logger's one log line saying that it switched itself off."""

    def __init__(self, said: Callable[[str], None]) -> None:
        super().__init__(logging.ERROR)
        self._said = said

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Disabling OneLogger" in message:
            self._said(message.rpartition("Error: ")[2] or message)


def when_disabled(said: Callable[[str], None]) -> None:
    """Call ``said(error)`` when nv-one-logger disables itself (only its log says so); replaces an earlier watch."""
    logger = logging.getLogger("nv_one_logger")  # its modules' loggers propagate here
    for handler in [h for h in logger.handlers if isinstance(h, _DisableWatch)]:
        logger.removeHandler(handler)
    logger.addHandler(_DisableWatch(said))


def switched_itself_off() -> bool:
    """Whether nv-one-logger is configured but has disabled itself (after an error in its own code)."""
    provider = OneLoggerProvider.instance()
    return provider.one_logger_ready and provider._logging_force_disabled


def disable() -> None:
    """Switch nv-one-logger off in this process for good (it records nothing more)."""
    OneLoggerProvider.instance().force_disable_logging()


def application_running(provider: Any) -> bool:
    """Whether nv-one-logger's ``application`` span is running (it allows one per process)."""
    return bool(provider.recorder.get_active_spans_by_name(StandardSpanName.APPLICATION))


def application_ended(provider: Any) -> bool:
    """Whether nv-one-logger's application ended (its recorder closed): nothing more can be recorded."""
    return bool(getattr(provider.recorder, "_closed", False))


def is_exported(recorder: DefaultRecorder, span: Any) -> bool:
    """Whether the recorder's export filter (its span blacklist, which reads only ``span.name``) lets it through."""
    return recorder._should_export_span(span)


def export_each(recorder: DefaultRecorder, span: S, deliver: Callable[[Exporter, S], None]) -> None:
    """``deliver(exporter, span)`` (a span recorded after it ended, whole) for each of the recorder's exporters,
    through its export filter and per-exporter error handling."""
    if not is_exported(recorder, span):
        return
    for exporter in recorder._exporters:
        recorder._execute_export(exporter, deliver, exporter, span)


def exporters(recorder: DefaultRecorder) -> list[Exporter]:
    """The exporters the recorder sends to."""
    return list(recorder._exporters)


def is_running(span: Span) -> bool:
    """``span.active``, without formatting every event of the span into an assertion message (as it does)."""
    return span.stop_event is None


def forget_configuration() -> None:
    """Forget the process's nv-one-logger configuration (one per process; tests and benchmarks need several)."""
    from nv_one_logger.core.internal.singleton import SingletonMeta

    SingletonMeta._instances.clear()


# -- per-iteration bookkeeping -------------------------------------------------------------------
# The nv-one-logger-training-telemetry releases whose TrainingRecorder.on_{training,validation}_single_iteration_*
# the fast path reproduces (the state each updates; the span it starts is the only difference).
ITERATION_FAST_PATH_VERIFIED = ("2.3.1",)
_TRAINING = StandardTrainingJobSpanName.TRAINING_SINGLE_ITERATION
_VALIDATION = StandardTrainingJobSpanName.VALIDATION_SINGLE_ITERATION


@functools.cache
def _installed_release() -> str:
    # read once: importlib.metadata scans the installed packages (tens of ms at each fit's start)
    return metadata.version("nv-one-logger-training-telemetry")


# TracingTimestamp.now() (2.3.1) without its frozen-dataclass __init__ (a third of the fast path's cost a step),
# built inline where a training iteration ends
_new_timestamp, _wall_clock, _perf_counter = object.__new__, time.time, time.perf_counter


class IterationBookkeeping:
    """nv-one-logger's per-iteration calls, at a fraction of their cost when nobody sees the spans.

    ``TrainingRecorder.on_training_single_iteration_start/end`` also start and stop an iteration span, most of
    the ~200 us a step, which nv-one-logger's default blacklist keeps from every exporter. When the spans would
    not be exported and the installed nv-one-logger is one this was verified against, the fast path does the same
    bookkeeping without the span: exporters receive the same records, nv-one-logger's timers read the same once an
    iteration ends (a running training iteration's start, past the first, is held here: nv-one-logger reads a
    running window only to end it). Otherwise (or ``fast=False``) it calls nv-one-logger's own methods."""

    def __init__(self, recorder: TrainingRecorder, fast: bool = True) -> None:
        self.recorder = recorder
        # the iteration spans are created only to be exported: with the default blacklist, nobody sees them
        exported = any(is_exported(recorder, Span.create(name=name)) for name in (_TRAINING, _VALIDATION))
        version = _installed_release()  # nv-one-logger's own path runs on a release the fast path was not verified on
        self.unverified_release = "" if version in ITERATION_FAST_PATH_VERIFIED else version
        self.fast = fast and not exported and not self.unverified_release
        # nv-one-logger's own timer objects (its training state lives as long as its recorder)
        self._state = recorder._training_state
        self._config: Any = None  # nv-one-logger's training config, read at the first iteration's end
        self._training_started: float | None = None  # a running training iteration's start, past the first
        timers = self._state.multi_iteration_timers
        self._training_timer, self._validation_timer = timers[_TRAINING], timers[_VALIDATION]

    def _own_path(self, call: Any, now: TracingTimestamp) -> None:
        if telemetry_enabled():  # its recorder would log a warning for each call it skips
            call(now)

    def training_start(self) -> None:
        if self.fast:
            timer = self._training_timer
            if timer._first_window_start is None:
                timer.start()  # the first keeps its timestamp: nv-one-logger's first_window_start
            else:  # counted as MultiWindowTimer.start counts it; no timestamp built, none put on the timer
                timer._total_window_count += 1
                self._training_started = _perf_counter()
        else:
            self._own_path(self.recorder.on_training_single_iteration_start, TracingTimestamp.now())

    def training_end(self) -> None:
        """End the iteration :meth:`training_start` began, if one is running (Lightning may skip a batch's end).

        The fast path is TrainingRecorder.on_training_single_iteration_end (2.3.1) step 1 inline; step 2
        (the metrics update, which checks again whether it is due) runs only when due; step 3 stops
        the span, which the fast path never started. Recheck these three on an nv-one-logger upgrade. Once
        nv-one-logger has stopped recording, the fast path keeps its timers going and sends nothing."""
        timer = self._training_timer
        started = self._training_started
        if started is None:
            if timer._current_window_start is None:
                return
            started = timer._current_window_start._perf_counter_seconds
        self._training_started = None
        state = self._state
        if not self.fast:
            self._own_path(self.recorder.on_training_single_iteration_end, TracingTimestamp.now())
            config = self.recorder._config.telemetry_config
        else:  # MultiWindowTimer.stop (2.3.1) inline, in its order of operations (so the same floating-point values)
            now = _new_timestamp(TracingTimestamp)
            fields = now.__dict__
            fields["_seconds_since_epoch"] = _wall_clock()
            fields["_perf_counter_seconds"] = perf = _perf_counter()
            duration = perf - started
            timer._latest_window_end = now
            timer._latest_window_duration_sec = duration
            if duration < timer._min_window_duration_sec:  # min() and max(), without two calls a step
                timer._min_window_duration_sec = duration
            if duration > timer._max_window_duration_sec:
                timer._max_window_duration_sec = duration
            timer._total_time_sec += duration
            timer._avg_window_duration_sec = timer._total_time_sec / timer._total_window_count
            timer._current_window_start = None
            state.completed_training_iterations_overall += 1
            config = self._config
            if config is None:  # nv-one-logger's is set before a training loop starts, and only once
                config = self._config = self.recorder._config.telemetry_config
            # evaluate_value(x) for each of the config's three values, without three calls a step
            samples = config.global_batch_size_or_fn
            if callable(samples):
                samples = samples()
            state.train_samples_processed_current_job += samples
            seq_length = config.seq_length_or_fn
            if callable(seq_length):
                seq_length = seq_length()
            if seq_length:
                state.train_tokens_current_job = seq_length * state.train_samples_processed_current_job
            state.last_logged_train_iterations_finish_time = now
            if not state.first_logged_train_iterations_finish_time:
                state.first_logged_train_iterations_finish_time = now
            throughput = config.is_log_throughput_enabled_or_fn
            if callable(throughput):
                throughput = throughput()
            if throughput:
                self._count_flops(samples, config)
        completed = state.completed_training_iterations_overall
        # TrainingRecorder._maybe_send_training_metrics_update's own condition, asked before calling it
        if completed > 1 and completed % config.log_every_n_train_iterations == 0:
            recorder = self.recorder
            if self.fast and telemetry_enabled():
                recorder._maybe_send_training_metrics_update()
            # nv-one-logger keeps every event of a running span (only the start is needed) and formats them all
            # on each look-up
            for loop in recorder.get_active_spans_by_name(StandardTrainingJobSpanName.TRAINING_LOOP):
                del loop.events[1:]

    def _count_flops(self, samples: int, config: Any) -> None:
        state = self._state
        assert_that(
            config.flops_per_sample and config.flops_per_sample > 0,
            "flops_per_sample must be set to a positive value when is_log_throughput_enabled is True",
        )
        flops = samples * config.flops_per_sample
        assert_that(
            state.completed_floating_point_operations_overall is not None,
            "completed_floating_point_operations_overall must be initialized.",
        )
        state.completed_floating_point_operations_overall += flops
        state.total_flops_current_job += flops
        total = self._training_timer.total_time_sec
        assert_that(total > 0, "train_iterations_time_total must be greater than 0")
        state.tflops_per_gpu.add_value(
            float(state.total_flops_current_job) / (total * 10**12 * self.recorder._config.world_size)
        )

    def validation_start(self) -> None:
        self.validation_end()  # one still running: Lightning skipped its batch end (lightning#20999)
        if self.fast:
            self._validation_timer.start()
        else:
            self._own_path(self.recorder.on_validation_single_iteration_start, TracingTimestamp.now())

    def validation_end(self) -> None:
        """End the validation iteration :meth:`validation_start` began, if one is running."""
        timer = self._validation_timer
        if timer._current_window_start is None:
            return
        if self.fast:
            timer.stop()
        else:
            self._own_path(self.recorder.on_validation_single_iteration_end, TracingTimestamp.now())
