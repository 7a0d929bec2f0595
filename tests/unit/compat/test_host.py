"""``compat.host``: the process's own clocks."""

from __future__ import annotations

import pytest

from telemetry_jit.compat import host

pytestmark = pytest.mark.any_torch


def test_own_cpu_counts_less_than_a_clock_tick() -> None:
    """A compile of a few ms of CPU reads more than 0 s (os.times() counted 10 ms ticks: lstm's 14 ms read 0.0)."""
    readings = [host.own_cpu()[0] for _ in range(5000)]
    steps = [later - earlier for earlier, later in zip(readings, readings[1:], strict=False) if later > earlier]
    # os.times() moves by whole 10 ms ticks or not at all; other threads' CPU can only make a step larger
    assert steps and min(steps) < 0.001
