"""``lightning.compile_telemetry``: the callback as a spawned rank receives it."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from telemetry_jit import CompileTelemetryCallback

pytestmark = pytest.mark.any_torch


class UsersCompileTelemetry(CompileTelemetryCallback):
    def __init__(self, provider: Any = None, *, tag: str = "default", **settings: Any) -> None:
        super().__init__(provider, **settings)
        self.tag = tag


def test_a_users_subclass_with_arguments_of_its_own_is_rebuilt_with_its_settings_in_a_spawned_rank() -> None:
    # ddp_spawn pickles the callbacks: each is rebuilt from its settings by keyword, whatever the subclass adds
    compiles = pickle.loads(pickle.dumps(UsersCompileTelemetry(None, skew_warning_s=5.0, log_figures=False)))
    assert type(compiles) is UsersCompileTelemetry
    assert (compiles.skew_warning_s, compiles.log_figures) == (5.0, False)
