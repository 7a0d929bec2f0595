"""nv-one-logger's per-iteration bookkeeping without the spans nobody exports: the same seeded run,
recorded with the fast path and with nv-one-logger's own path, exports the same records."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from nv_one_logger.api.one_logger_provider import OneLoggerProvider
from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName

import telemetry_jit
from telemetry_jit import TimeEventCallback, hook_trainer_cls
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from tests.e2e.conftest import fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader

# values that are clocks or measured durations: equal in kind, not in value, between two runs
_MEASURED = ("time", "timestamp", "throughput", "duration", "_msec", "_sec")
_IDS = ("span_id", "parent_id", "run", "pid", "writer", "start_unix_ns", "end_unix_ns", "time_unix_ns")


def record_run(
    folder: Path, fast: bool, callbacks: tuple[pl.Callback, ...] = (), **config: Any
) -> tuple[list[dict[str, Any]], TimeEventCallback]:
    fresh_provider_state()
    torch._dynamo.reset()
    path = folder / f"{'fast' if fast else 'upstream'}.jsonl"
    settings = {
        "global_batch_size": 4,
        "log_every_n_train_iterations": 2,
        "seq_length_or_fn": 16,
        "train_samples_target_or_fn": 40,
        "flops_per_sample_or_fn": 1000,
        "is_log_throughput_enabled_or_fn": True,
    }
    provider = telemetry_jit.configure("iterations", file=path, **{**settings, **config})
    callback = TimeEventCallback(provider, iteration_fast_path=fast)
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, provider, telemetry_callback=callback, compile_telemetry=False)
    pl.seed_everything(0, verbose=False)
    HookedTrainer(max_epochs=2, callbacks=list(callbacks), **TRAINER_DEFAULTS).fit(Net(), loader(18, 4), loader(8, 4))
    telemetry_jit.shutdown()
    fresh_provider_state()
    return [json.loads(line) for line in path.read_text().splitlines()], callback


def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with ids and clocks taken out: parents by name, measured values by kind."""
    names = {r["span_id"]: r["name"] for r in records if r["kind"] == "span_start"}
    result = []
    for record in records:
        kept = {key: value for key, value in record.items() if key not in _IDS}
        if "parent_id" in record:
            kept["parent"] = names.get(record["parent_id"])
        if "span_id" in record:
            kept["span"] = names.get(record["span_id"])
        if "attributes" in record:
            kept["attributes"] = {
                key: (type(value).__name__ if any(part in key for part in _MEASURED) else value)
                for key, value in record["attributes"].items()
            }
        result.append(kept)
    return result


def metric_updates(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["attributes"] for r in records if r.get("name") == "training_metrics_update"]


def test_the_fast_path_exports_the_same_records_as_nv_one_loggers_own(tmp_path: Path) -> None:
    fast, fast_callback = record_run(tmp_path, fast=True)
    upstream, upstream_callback = record_run(tmp_path, fast=False)
    assert fast_callback._iterations.fast and not upstream_callback._iterations.fast
    assert not [r for r in fast + upstream if r["kind"] == "telemetry_data_error"]
    assert comparable(fast) == comparable(upstream)  # every record, field by field, in order
    updates = metric_updates(fast)
    assert len(updates) == len(metric_updates(upstream)) == 5  # 10 steps, every 2
    for update in updates:  # the measured figures are consistent in themselves
        assert (
            0 < update["min_iteration_time_sec"] <= update["avg_iteration_time_sec"] <= update["max_iteration_time_sec"]
        )
        assert update["total_iteration_time_sec"] == pytest.approx(
            update["avg_iteration_time_sec"] * update["num_iterations"], rel=1e-6
        )
        assert update["train_throughput_per_gpu"] > 0 and update["train_tokens"] == 16 * update["num_train_samples"]


class TimerReads(pl.Callback):
    """What nv-one-logger's training-iteration timer and counters say to a reader in a user's callback
    (which runs after telemetry's): once an iteration has started, and once it has ended."""

    def __init__(self) -> None:
        self.reads: list[tuple[Any, ...]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        self.reads.append(("started", self._timer().total_window_count))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        timer, state = self._timer(), OneLoggerProvider.instance().recorder._training_state
        assert timer.avg_window_duration_sec == timer.total_time_sec / timer.total_window_count
        assert timer.min_window_duration_sec <= timer.latest_window_duration_sec <= timer.max_window_duration_sec
        assert timer.latest_window_end is state.last_logged_train_iterations_finish_time
        assert (
            timer.first_window_start.seconds_since_epoch
            < state.first_logged_train_iterations_finish_time.seconds_since_epoch
        )
        self.reads.append(
            ("ended", timer.total_window_count, timer.is_active, state.completed_training_iterations_overall)
        )

    @staticmethod
    def _timer() -> Any:
        state = OneLoggerProvider.instance().recorder._training_state
        return state.multi_iteration_timers[StandardTrainingJobSpanName.TRAINING_SINGLE_ITERATION]


def test_nv_one_loggers_timer_reads_as_its_own_path_leaves_it(tmp_path: Path) -> None:
    reads = {}
    for fast in (True, False):
        timer_reads = TimerReads()
        record_run(tmp_path, fast, (timer_reads,))
        reads[fast] = timer_reads.reads
    assert reads[True] == reads[False]
    assert reads[True][:4] == [("started", 1), ("ended", 1, False, 1), ("started", 2), ("ended", 2, False, 2)]
    assert len(reads[True]) == 20  # 10 steps


class SequenceLength(pl.Callback):
    """A sequence length that changes from step to step, which nv-one-logger reads through a function."""

    def __init__(self) -> None:
        self.length = 8
        self.asked = 0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        self.length = 8 + trainer.global_step % 3

    def __call__(self) -> int:
        self.asked += 1
        return self.length


def test_settings_given_as_functions_are_asked_at_every_step(tmp_path: Path) -> None:
    runs = {}
    for fast in (True, False):
        length = SequenceLength()
        records, _ = record_run(
            tmp_path, fast, (length,), seq_length_or_fn=length, is_log_throughput_enabled_or_fn=lambda: True
        )
        runs[fast] = (records, length.asked)
    assert comparable(runs[True][0]) == comparable(runs[False][0])
    assert runs[True][1] >= 10 and runs[False][1] >= 10  # asked at each of the 10 steps
    lengths = {update["train_tokens"] / update["num_train_samples"] for update in metric_updates(runs[True][0])}
    assert len(lengths) > 1  # the tokens follow the length of the step


def test_iteration_spans_asked_for_take_nv_one_loggers_own_path_and_are_exported(tmp_path: Path) -> None:
    records, callback = record_run(tmp_path, fast=True, export_iteration_spans=True)
    assert not callback._iterations.fast
    iterations = [r for r in records if r["kind"] == "span_start" and r["name"] == "training_single_iteration"]
    assert len(iterations) == 10


def test_an_unverified_nv_one_logger_falls_back_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nv_one_logger_compat, "ITERATION_FAST_PATH_VERIFIED", ("0.0.0",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, callback = record_run(tmp_path, fast=True)
    assert not callback._iterations.fast
    said = [w for w in caught if "is not a release its per-iteration fast path was verified against" in str(w.message)]
    assert len(said) == 1
    assert len(metric_updates(records)) == 5


class StopRecordingMidStep(pl.Callback):
    """nv-one-logger stops recording after an internal error; here between a step's start and end
    (a user's callback runs after the telemetry's)."""

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == 5:
            OneLoggerProvider.instance().force_disable_logging()


def test_nothing_is_exported_once_nv_one_logger_stops_recording_mid_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fast, _ = record_run(tmp_path, fast=True, callbacks=(StopRecordingMidStep(),))
    upstream, _ = record_run(tmp_path, fast=False, callbacks=(StopRecordingMidStep(),))
    assert comparable(fast) == comparable(upstream)
    assert "because OneLogger is not enabled" not in caplog.text  # nv-one-logger's recorder is not called
    # updates after iterations 2 and 4; the one due when step 5 (the sixth iteration) ends is not sent
    assert [u["current_iteration"] for u in metric_updates(fast)] == [1, 3]
