"""A compile's time by torch's own timers (compat.compile_timers), read from torch's real timer table."""

from __future__ import annotations

import pytest
from torch._dynamo import utils as dynamo_utils

from telemetry_jit.compat import compile_timers


def _timed(entries: dict[str, list[float]]) -> dict[str, float]:
    """``since`` over ``entries`` appended to torch's table, which is left as it was."""
    table = dynamo_utils.compilation_time_metrics
    kept = {name: list(table[name]) for name in entries if name in table}
    before = compile_timers.snapshot()
    try:
        for name, seconds in entries.items():
            table.setdefault(name, []).extend(seconds)
        return compile_timers.since(before)
    finally:
        for name in entries:
            if name in kept:
                table[name][:] = kept[name]
            else:
                del table[name]


@pytest.mark.any_torch
def test_a_cold_compiles_kernel_loads_are_not_taken_from_hashing_torchs_files() -> None:
    """A cold compile loads its kernels outside any cache load: hashing torch's files keeps its seconds."""
    phases = _timed({"inductor_codecache_torch_key": [0.5], "PyCodeCache.load_by_key_path": [0.3]})
    assert phases["cache_load"] == pytest.approx(0.5) and phases["kernel_load"] == pytest.approx(0.3)


@pytest.mark.any_torch
def test_a_warm_starts_kernel_loads_are_taken_from_the_cache_load_that_holds_them() -> None:
    phases = _timed(
        {
            "AOTAutogradCache.inductor_load": [0.4],
            "inductor_codecache_torch_key": [0.5],
            "PyCodeCache.load_by_key_path": [0.3],
            "bytecode_tracing": [0.2],
        }
    )
    assert phases == pytest.approx({"cache_load": 0.6, "kernel_load": 0.3, "dynamo_tracing": 0.2})
