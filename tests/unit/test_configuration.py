"""What ``configure`` refuses, before it changes anything."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import telemetry_jit


def test_a_misspelt_training_config_field_is_named_with_the_right_one(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'log_every_n_train_iteration'.*Did you mean 'log_every_n_train_iterations'"):
        telemetry_jit.configure("typo", file=tmp_path / "t.jsonl", log_every_n_train_iteration=1)
    assert not (tmp_path / "t.jsonl").exists()  # refused before anything was set up


def test_an_unknown_training_config_field_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown training-config field 'some_token'.*seq_length_or_fn"):
        telemetry_jit.configure("unknown", file=tmp_path / "t.jsonl", some_token="x")


def test_fields_configure_names_itself_point_to_its_own_argument(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pass global_batch_size="):
        telemetry_jit.configure("own", file=tmp_path / "t.jsonl", global_batch_size_or_fn=8)


def test_when_nv_one_logger_switches_itself_off_the_user_hears_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nv_one_logger.core.internal import safe_execution
    from nv_one_logger.training_telemetry.api import callbacks as one_logger

    from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat

    nv_one_logger_compat.forget_configuration()
    # nv-one-logger writes its "Disabling OneLogger" line once per process; a new process would write it
    monkeypatch.setattr(safe_execution, "__telemetry_data_issue_already_logged", False)
    telemetry_jit.configure("disabled", file=tmp_path / "t.jsonl")
    try:
        one_logger.on_app_start()
        one_logger.on_train_start(train_iterations_start=0, train_samples_start=0)
        with pytest.warns(RuntimeWarning, match="switched telemetry off.*Cannot start span training_loop") as said:
            one_logger.on_train_start(train_iterations_start=0, train_samples_start=0)  # a second, while one runs
        assert not nv_one_logger_compat.telemetry_enabled()
        assert len([w for w in said if "switched telemetry off" in str(w.message)]) == 1
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            telemetry_jit.shutdown()
        nv_one_logger_compat.forget_configuration()


def test_a_second_switch_off_in_one_process_is_still_said_at_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nv_one_logger.core.internal import safe_execution
    from nv_one_logger.training_telemetry.api import callbacks as one_logger

    from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat

    nv_one_logger_compat.forget_configuration()
    monkeypatch.setattr(safe_execution, "__telemetry_data_issue_already_logged", True)  # said once already
    telemetry_jit.configure("disabled-again", file=tmp_path / "t.jsonl")
    try:
        one_logger.on_app_start()
        one_logger.on_train_start(train_iterations_start=0, train_samples_start=0)
        one_logger.on_train_start(train_iterations_start=0, train_samples_start=0)  # nv-one-logger says nothing now
        with pytest.warns(RuntimeWarning, match="switched telemetry off"):
            telemetry_jit.shutdown()
    finally:
        nv_one_logger_compat.forget_configuration()
