"""``session``: what ``configure`` refuses before it changes anything, and what a session owns."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.records import CompileRecord
from telemetry_jit.session import Session
from tests.unit.recording.test_recorder import record


class Broken(CompileListener):
    def recorded(self, record: CompileRecord) -> None:
        raise KeyError("a listener's bug")


def _run(name: str, tmp_path: Path, failures: int) -> tuple[Session, list[str]]:
    """A session whose recorder's listener fails ``failures`` times: the session and what it said."""
    nv_one_logger_compat.forget_configuration()
    session = telemetry_jit.configure(name, file=tmp_path / f"{name}.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder = CompileRecorder(session, listeners=[Broken()])
        recorder.start(lambda: Position(0, "train"))
        for attempt in range(failures):
            recorder.record(record(f"0/{attempt}"))
        recorder.stop()
        session.shutdown()
    return session, [str(w.message) for w in caught if "telemetry-jit" in str(w.message)]


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


@pytest.mark.any_torch
def test_two_sessions_one_after_another_each_say_their_warnings_and_count_their_failures(tmp_path: Path) -> None:
    first, first_said = _run("first", tmp_path, failures=2)
    second, second_said = _run("second", tmp_path, failures=3)
    nv_one_logger_compat.forget_configuration()
    for said in (first_said, second_said):
        assert sum("compile listener" in line and "a listener's bug" in line for line in said) == 1
    assert first.health()["failed_calls"]["recording.listener"]["count"] == 2  # its own, read after the second ran
    assert second.health()["failed_calls"]["recording.listener"]["count"] == 3
    assert first.account is not second.account and first.looked_before and second.looked_before


def test_a_session_leaves_the_environment_as_it_found_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run id a session made is in the environment for the ranks it launches while it runs, never after."""
    from telemetry_jit import identity

    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "LSB_JOBID", "PMIX_NAMESPACE", identity.RUN_ID_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    nv_one_logger_compat.forget_configuration()
    session = telemetry_jit.configure("environment", file=tmp_path / "t.jsonl")
    made = identity.run_id()
    assert len(made) == 32
    session.shutdown()
    assert identity.RUN_ID_VARIABLE not in os.environ
    nv_one_logger_compat.forget_configuration()
    telemetry_jit.configure("again", file=tmp_path / "t.jsonl").shutdown()  # a new run: a new id, put back too
    assert identity.RUN_ID_VARIABLE not in os.environ
    runs = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")
    assert len(runs) == 2 and runs[0].run_id == made != runs[1].run_id
