"""The nv-one-logger adapter: the internals of nv-one-logger 2.3 that telemetry-jit relies on.

Its public API (``TrainingTelemetryProvider``, the ``callbacks`` module, ``Span``/``Event``) is used
directly; what it does not offer publicly is here: handing an already finished span to the
recorder's exporters through its own export filter and error handling, trimming the event list
nv-one-logger keeps on a running span, forgetting the per-process configuration, and its
per-iteration bookkeeping without the iteration spans nobody exports (:class:`IterationBookkeeping`).
"""

from __future__ import annotations

import warnings
from importlib import metadata
from typing import Any

from nv_one_logger.api.one_logger_provider import OneLoggerProvider
from nv_one_logger.core.exceptions import assert_that
from nv_one_logger.core.span import Span, StandardSpanName
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.exporter.exporter import Exporter
from nv_one_logger.recorder.default_recorder import DefaultRecorder
from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder

from telemetry_jit.exporters.finished import FinishedSpan, export_finished


def telemetry_enabled() -> bool:
    """Whether nv-one-logger is configured and recording (it disables itself after an internal error)."""
    return OneLoggerProvider.instance().one_logger_enabled


def application_running(provider: Any) -> bool:
    """Whether nv-one-logger's ``application`` span is running (it allows one per process)."""
    return bool(provider.recorder.get_active_spans_by_name(StandardSpanName.APPLICATION))


def is_exported(recorder: DefaultRecorder, span: Span | FinishedSpan) -> bool:
    """Whether the recorder's export filter (nv-one-logger's span blacklist) lets ``span`` through
    (the filter reads only the name)."""
    return recorder._should_export_span(span)


def export_finished_span(recorder: DefaultRecorder, span: FinishedSpan) -> None:
    """Hand a span recorded after it ended to the recorder's exporters, through the recorder's own
    export filter and per-exporter error handling: whole to the exporters that take whole spans,
    through nv-one-logger's span calls to the others (see :mod:`telemetry_jit.exporters.finished`).
    """
    if not is_exported(recorder, span):
        return
    for exporter in recorder._exporters:
        recorder._execute_export(exporter, export_finished, exporter, span)


def exporters(recorder: DefaultRecorder) -> list[Exporter]:
    """The exporters the recorder sends to."""
    return list(recorder._exporters)


def is_running(span: Span) -> bool:
    """``span.active``, without formatting every event of the span into an assertion message first
    (``Span.active`` does, on every call)."""
    return span.stop_event is None


def forget_exported_events(span: Span) -> None:
    """Drop the events nv-one-logger keeps on a running span once its exporters have them.

    nv-one-logger appends every event to the span's in-memory list until the span ends and formats
    that whole list on every ``Span.active`` check; it needs only the first one (the span start).
    """
    events = span.events
    if len(events) > 1:
        del events[1:]


def forget_configuration() -> None:
    """Forget the process's nv-one-logger configuration, so the next ``instance()`` is unconfigured.

    nv-one-logger allows one configuration per process; tests and benchmarks need several.
    """
    from nv_one_logger.core.internal.singleton import SingletonMeta

    SingletonMeta._instances.clear()


# -- per-iteration bookkeeping -------------------------------------------------------------------
# The nv-one-logger-training-telemetry releases whose TrainingRecorder.on_{training,validation}_single_iteration_*
# the fast path reproduces (the state each updates; the span it starts is the only difference).
ITERATION_FAST_PATH_VERIFIED = ("2.3.1",)
_TRAINING = StandardTrainingJobSpanName.TRAINING_SINGLE_ITERATION
_VALIDATION = StandardTrainingJobSpanName.VALIDATION_SINGLE_ITERATION
_said: set[str] = set()


def _metrics_update_due(completed_iterations: int, every_n: int) -> bool:
    """TrainingRecorder._maybe_send_training_metrics_update's condition, after an iteration ended."""
    return completed_iterations > 1 and completed_iterations % every_n == 0


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


class IterationBookkeeping:
    """nv-one-logger's per-iteration calls, at a fraction of their cost when nobody sees the spans.

    ``TrainingRecorder.on_training_single_iteration_start/end`` update its timers and counters, send
    ``training_metrics_update`` every N iterations, and start and stop an iteration span, which
    costs most of the ~200 us a step and which nv-one-logger's default blacklist keeps from every
    exporter. When the iteration spans would not be exported and the installed nv-one-logger is one
    this was verified against, the fast path does the same bookkeeping without the span: exporters
    receive the same records, nv-one-logger's timers read the same. Otherwise (iteration spans
    exported, an unverified nv-one-logger, or ``fast=False``) it calls nv-one-logger's own methods.

    Example::

        iterations = IterationBookkeeping(provider.recorder)
        iterations.training_start(TracingTimestamp.now())
        ...
        iterations.training_end(TracingTimestamp.now())
    """

    def __init__(self, recorder: TrainingRecorder, fast: bool = True) -> None:
        self.recorder = recorder
        self.fast = fast and self._fast_path_applies()
        # nv-one-logger's own timer objects (its training state lives as long as its recorder)
        timers = recorder._training_state.multi_iteration_timers
        self._training_timer, self._validation_timer = timers[_TRAINING], timers[_VALIDATION]

    def _fast_path_applies(self) -> bool:
        version = metadata.version("nv-one-logger-training-telemetry")
        if version not in ITERATION_FAST_PATH_VERIFIED:
            _say_once(
                "version",
                f"telemetry-jit: nv-one-logger-training-telemetry {version} is not a release its per-iteration fast "
                f"path was verified against ({', '.join(ITERATION_FAST_PATH_VERIFIED)}); nv-one-logger's own (slower) "
                "per-iteration path is used.",
            )
            return False
        # the iteration spans are created only to be exported: with the default blacklist, nobody sees them
        return not any(is_exported(self.recorder, Span.create(name=name)) for name in (_TRAINING, _VALIDATION))

    def _own_path(self, call: Any, now: TracingTimestamp) -> None:
        """nv-one-logger's own per-iteration ``call``, while it records (its recorder would log a
        warning for each call it skips)."""
        if telemetry_enabled():
            call(now)

    def training_start(self, now: TracingTimestamp) -> None:
        if self.fast:
            self._training_timer.start(now)
        else:
            self._own_path(self.recorder.on_training_single_iteration_start, now)

    def training_end(self, now: TracingTimestamp) -> None:
        """End the iteration :meth:`training_start` began (the caller checks that one is running).

        Once nv-one-logger has stopped recording, the fast path keeps its timers going (nobody reads
        them then) and sends nothing."""
        recorder, state = self.recorder, self.recorder._training_state
        config = recorder._get_training_config()
        if self.fast:
            self._training_end_without_span(now, config)
        else:
            self._own_path(recorder.on_training_single_iteration_end, now)
        if _metrics_update_due(state.completed_training_iterations_overall, config.log_every_n_train_iterations):
            if self.fast and telemetry_enabled():
                recorder._maybe_send_training_metrics_update()
            # nv-one-logger keeps every event of a running span and formats them all on each look-up
            for loop in recorder.get_active_spans_by_name(StandardTrainingJobSpanName.TRAINING_LOOP):
                forget_exported_events(loop)

    def _training_end_without_span(self, now: TracingTimestamp, config: Any) -> None:
        """TrainingRecorder.on_training_single_iteration_end (2.3.1), step 1; step 2 (the metrics update,
        which checks again whether it is due) runs only when due; step 3 stops the span."""
        recorder, state = self.recorder, self.recorder._training_state
        timer = self._training_timer
        timer.stop(now)
        state.completed_training_iterations_overall += 1
        samples = config.global_batch_size
        state.train_samples_processed_current_job += samples
        seq_length = config.seq_length
        if seq_length:
            state.train_tokens_current_job = seq_length * state.train_samples_processed_current_job
        state.last_logged_train_iterations_finish_time = now
        if not state.first_logged_train_iterations_finish_time:
            state.first_logged_train_iterations_finish_time = now
        if config.is_log_throughput_enabled:
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
            total = timer.total_time_sec
            assert_that(total > 0, "train_iterations_time_total must be greater than 0")
            state.tflops_per_gpu.add_value(
                float(state.total_flops_current_job) / (total * 10**12 * recorder._config.world_size)
            )

    def validation_start(self, now: TracingTimestamp) -> None:
        if self.fast:
            self._validation_timer.start(now)
        else:
            self._own_path(self.recorder.on_validation_single_iteration_start, now)

    def validation_end(self, now: TracingTimestamp) -> None:
        if self.fast:
            self._validation_timer.stop(now)
        else:
            self._own_path(self.recorder.on_validation_single_iteration_end, now)

    def validation_running(self) -> bool:
        """A validation iteration started and did not end (Lightning skips its batch end, lightning#20999)."""
        return self._validation_timer.is_active

    def training_running(self) -> bool:
        return self._training_timer.is_active
