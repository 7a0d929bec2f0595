"""``compat.host``: the process's own clocks."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from telemetry_jit.compat import host

pytestmark = pytest.mark.any_torch


def test_own_cpu_counts_less_than_a_clock_tick() -> None:
    """A compile of a few ms of CPU reads more than 0 s (os.times() counted 10 ms ticks: lstm's 14 ms read 0.0)."""
    readings = [host.own_cpu()[0] for _ in range(5000)]
    steps = [later - earlier for earlier, later in zip(readings, readings[1:], strict=False) if later > earlier]
    # os.times() moves by whole 10 ms ticks or not at all; other threads' CPU can only make a step larger
    assert steps and min(steps) < 0.001


linux = pytest.mark.skipif(not host.ON_LINUX, reason="read from /proc")


@linux
def test_own_memory_is_anonymous_resident_memory_which_a_compiles_allocation_grows() -> None:
    held, resident, peak = host.own_memory()
    assert 0 < held < resident and peak > 0  # less the libraries mapped (VmHWM may lag a moment behind)
    grown = bytearray(64 << 20)
    for index in range(0, len(grown), 4096):
        grown[index] = 1
    assert host.own_held() - held == pytest.approx(64 << 20, rel=0.1)


@linux
def test_a_forked_child_has_this_processes_image_and_an_execd_one_its_own() -> None:
    """How the compile meter tells a forked worker (sharing this process's pages) from a compiler it started."""
    forked = os.fork()
    if forked == 0:
        time.sleep(30)
        os._exit(0)
    execd = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        own = host.image(os.getpid())
        assert own is not None and any(own)
        assert host.image(forked) == own
        assert host.image(execd.pid) not in (own, None)
        assert (found := host.child(forked)) is not None and found.image == own and found.held_bytes > 0
    finally:
        os.kill(forked, 9)
        os.waitpid(forked, 0)
        execd.kill()
        execd.wait()
    assert host.image(forked) is None  # gone


@linux
def test_the_kernels_peak_for_a_reaped_child_starts_from_the_process_it_was_forked_from() -> None:
    """Why the meter counts a reaped compiler's peak only above this process's own: ``true`` holds a few hundred
    KB, yet ``RUSAGE_CHILDREN`` says it reached this whole process's resident memory (kept at its exec)."""
    subprocess.run(["true"], check=True)
    _, resident, _ = host.own_memory()
    assert host.own_cpu()[2] >= 0.9 * resident
