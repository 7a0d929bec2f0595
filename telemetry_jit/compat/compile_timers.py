"""Where a compile's time went by torch's own timers: every ``dynamo_timed`` region (named alike in torch 2.8 - 2.15)
appends its seconds to ``torch._dynamo.utils.compilation_time_metrics``, so the entries a compile added are its own."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._dynamo import utils as _dynamo_utils

PHASES: dict[str, tuple[str, ...]] = {
    "dynamo_tracing": ("bytecode_tracing",),
    "guards": ("build_guards",),
    "cache_load": ("AOTAutogradCache.inductor_load", "inductor_codecache_torch_key"),
    "kernel_load": ("PyCodeCache.load_by_key_path",),
}
_CACHE_LOAD = "AOTAutogradCache.inductor_load"  # holds the kernel loads of a warm start: counted apart


def features() -> list[str]:
    """What this torch offers against a warm start's residual, by ``torch.compiler``'s functions."""
    offered = {
        "set_stance": ("set_stance",),
        "cache_artifacts": ("save_cache_artifacts", "load_cache_artifacts"),
        "aot_compile": ("load_compiled_function",),
    }
    return [name for name, functions in offered.items() if all(hasattr(torch.compiler, f) for f in functions)]


def snapshot() -> dict[str, int]:
    """How many entries each timer read holds now (cheap: a few dictionary look-ups)."""
    timers = _dynamo_utils.compilation_time_metrics
    return {name: len(timers.get(name) or ()) for names in PHASES.values() for name in names}


def since(before: dict[str, int]) -> dict[str, float]:
    """Seconds per phase the timers recorded since ``before``; a phase torch did not time is absent."""
    timers = _dynamo_utils.compilation_time_metrics
    tails = {name: (timers.get(name) or [])[before.get(name, 0) :] for names in PHASES.values() for name in names}
    seconds = {
        phase: sum(float(t) for name in names for t in tails[name])
        for phase, names in PHASES.items()
        if any(tails[name] for name in names)
    }
    if "cache_load" in seconds and "kernel_load" in seconds:  # only a cache load holds kernel loads (a cold
        # compile loads its kernels apart, and hashing torch's files holds none)
        seconds["cache_load"] -= min(seconds["kernel_load"], sum(float(t) for t in tails[_CACHE_LOAD]))
    return seconds


def phase_reader() -> Callable[[], str]:
    """Called on the compiling thread: a function any thread may call for the innermost of torch's timed regions
    that thread is in now (``bytecode_tracing``, ``backend_compile``, ``compile_fx_inner``, ...); '' where this
    torch keeps no such stack. torch keeps the stack per thread, so it is taken here, where the compile runs."""
    try:
        stack = _dynamo_utils.get_chromium_event_logger().get_stack()
    except Exception:  # noqa: BLE001 - a torch without the event logger: no phase, never a failed compile
        return lambda: ""
    if not isinstance(stack, list):
        return lambda: ""
    return lambda: next(iter(stack[-1:]), "")  # a slice: the compile may pop the stack between a check and a read
