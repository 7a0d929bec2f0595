"""The oracle's own reading of torch's record (oracle/judge.py), and the product's CPU clock, on torch 2.8's cases."""

from __future__ import annotations

import pytest

from oracle.judge import acceptable_causes
from telemetry_jit.compat import host

pytestmark = pytest.mark.any_torch


def test_a_size_one_guard_on_a_spaced_source_is_size_one() -> None:
    """torch 2.8's guard on a resume function's stack holds spaces (t5's 9/6); still 0/1 specialization."""
    line = (
        "9/5: 2 <= dict.__getitem__(___stack0, list(dict.keys(___stack0))[0]).size()[0]  # inner_dict = "
        "dict(self.items())  # transformers/utils/generic.py:527 in __getitem__"
    )
    assert acceptable_causes([line], None) == {"size_one"}
    assert acceptable_causes(["0/5: 2 <= kwargs['input_ids'].size()[0]  # output = f()"], None) == {"size_one"}
    assert "size_one" not in (acceptable_causes(["0/1: 16 <= x.size()[0]"], None) or set())


def test_own_cpu_counts_less_than_a_clock_tick() -> None:
    """A compile of a few ms of CPU reads more than 0 s (os.times() counted 10 ms ticks: lstm's 14 ms read 0.0)."""
    readings = [host.own_cpu()[0] for _ in range(5000)]
    steps = [later - earlier for earlier, later in zip(readings, readings[1:], strict=False) if later > earlier]
    # os.times() moves by whole 10 ms ticks or not at all; other threads' CPU can only make a step larger
    assert steps and min(steps) < 0.001
