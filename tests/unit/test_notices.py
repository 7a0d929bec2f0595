"""Warnings said once, by the rank that should say them."""

from __future__ import annotations

import time
import warnings

import pytest
from lightning_utilities.core.rank_zero import rank_zero_only

from telemetry_jit.notices import Notices


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch):
    def set_rank(value: int, world_size: int = 2) -> None:
        monkeypatch.setattr(rank_zero_only, "rank", value, raising=False)
        monkeypatch.setenv("WORLD_SIZE", str(world_size))

    return set_rank


def said(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return list(caught)


def test_a_key_is_said_once(rank) -> None:
    rank(0, world_size=1)
    notices = Notices()
    first = said(lambda: notices.warn("disk", "telemetry-jit: the disk is full"))
    again = said(lambda: notices.warn("disk", "telemetry-jit: the disk is full"))
    assert [str(w.message) for w in first] == ["telemetry-jit: the disk is full"] and again == []
    notices.forget()
    assert len(said(lambda: notices.warn("disk", "telemetry-jit: the disk is full"))) == 1


def test_facts_about_the_job_are_said_by_rank_zero_alone(rank) -> None:
    rank(1)
    assert said(lambda: Notices().warn("torch", "telemetry-jit: torch lacks a field")) == []
    rank(0)
    assert len(said(lambda: Notices().warn("torch", "telemetry-jit: torch lacks a field"))) == 1


def test_facts_about_one_process_are_said_by_every_rank_with_its_number(rank) -> None:
    rank(3, world_size=4)
    (warning,) = said(lambda: Notices().warn("disk", "telemetry-jit: the disk is full", every_rank=True))
    assert str(warning.message) == "[rank: 3] telemetry-jit: the disk is full"


def test_the_origin_is_the_users_line(rank, tmp_path) -> None:
    rank(0, world_size=1)
    user_file = tmp_path / "train.py"
    (warning,) = said(lambda: Notices().warn("storm", "recompiling", origin=f"{user_file}:42"))
    assert (warning.filename, warning.lineno) == (str(user_file), 42)


def test_escape_sequences_in_a_warning_reach_the_terminal_cleaned(rank) -> None:
    with pytest.warns(RuntimeWarning) as said:
        Notices().warn("hostile", "frame forward\x1b[2J\x1b]0;owned\x07 recompiled")
    assert str(said[0].message) == "frame forward?[2J?]0;owned? recompiled"


def test_the_live_consoles_lines_are_cleaned() -> None:
    from telemetry_jit.recording.console import CompileConsole

    printed: list[str] = []
    console = CompileConsole(threshold_s=0.0, print_fn=printed.append)
    console.compile_started("forward\x1b[31m (train.py:3)")
    deadline = time.monotonic() + 5
    while not printed and time.monotonic() < deadline:  # announced from its timer thread
        time.sleep(0.01)
    console.compile_finished()
    assert printed and all("\x1b" not in line for line in printed)
    assert printed[0] == "telemetry-jit: compiling forward?[31m (train.py:3) ..."
