"""What a session owns: two sessions one after another in one process each keep their own account."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.records import CompileRecord
from telemetry_jit.session import Session
from tests.unit.test_recorder import record


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
