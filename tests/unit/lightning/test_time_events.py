"""``lightning.time_events``: the callback as a spawned rank receives it."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from telemetry_jit import TimeEventCallback

pytestmark = pytest.mark.any_torch


class UsersTimeEvents(TimeEventCallback):
    def __init__(self, provider: Any = None, *, tag: str = "default", **settings: Any) -> None:
        super().__init__(provider, **settings)
        self.tag = tag


def test_a_users_subclass_with_arguments_of_its_own_is_rebuilt_with_its_settings_in_a_spawned_rank() -> None:
    # ddp_spawn pickles the callbacks: rebuilt by keyword, never starting the application span again
    time_events = pickle.loads(pickle.dumps(UsersTimeEvents(None, call_on_app_start=False, iteration_fast_path=False)))
    assert type(time_events) is UsersTimeEvents and time_events.iteration_fast_path is False
