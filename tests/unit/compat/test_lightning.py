"""``compat.lightning``: Lightning's private counters read where they are, ``global_step`` where they are not."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from telemetry_jit.compat import lightning as lightning_compat

pytestmark = pytest.mark.any_torch


def test_a_trainer_without_lightnings_private_counters_is_read_by_its_global_step() -> None:
    # a Lightning that renames them (the pin has no upper bound), a trainer of the user's own loops: the step
    # each record carries falls back to the public property instead of failing every batch
    trainer = SimpleNamespace(
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()), lightning_module=None, global_step=7
    )
    assert lightning_compat.logging_step(trainer) == 7
    assert lightning_compat.global_step_counter(trainer).completed == 7
    assert lightning_compat.is_last_batch(SimpleNamespace()) is False
