"""Warnings said once, by the rank that should say them."""

from __future__ import annotations

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
    assert str(warning.message) == "[rank 3] telemetry-jit: the disk is full"


def test_the_origin_is_the_users_line(rank, tmp_path) -> None:
    rank(0, world_size=1)
    user_file = tmp_path / "train.py"
    (warning,) = said(lambda: Notices().warn("storm", "recompiling", origin=f"{user_file}:42"))
    assert (warning.filename, warning.lineno) == (str(user_file), 42)
