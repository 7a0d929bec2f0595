"""Compiling submodules with ``thunder.jit`` and reading ``thunder.compile_stats`` into
:class:`CompileRecord` objects.

The compiled module stays where it is in the model: the hook ``nn.Module.compile`` uses (see
:func:`telemetry_jit.compat.torch.set_compiled_call`) runs the ``ThunderModule``. Replacing the child with the
``ThunderModule`` would change ``state_dict`` keys (``layer1.weight`` becomes ``layer1..weight``),
so checkpoints would no longer load into the plain model.

After each call the wrapper compares thunder's cache-miss count with the last one it saw; a new
miss becomes a record with thunder's own timestamps: from the start of tracing to the end of the
host window in which transforms ran and the cache entry was built.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections import deque
from typing import Any

import torch

from telemetry_jit.compat import thunder as thunder_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.records import CompileRecord

# Records wait here until the trainer's recorder takes them (between steps).
_pending: deque[CompileRecord] = deque(maxlen=10_000)
_compiled: weakref.WeakSet[ThunderCompiled] = weakref.WeakSet()
_warned_profile = False


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
    """What thunder's cache keys on, as text: each input's shape, dtype and grad flag, and grad mode."""
    inputs = {**{f"input {index}": value for index, value in enumerate(args)}, **kwargs}
    signature = {
        name: f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')} requires_grad={value.requires_grad}"
        if isinstance(value, torch.Tensor)
        else type(value).__name__
        for name, value in inputs.items()
    }
    signature["grad mode"] = str(torch.is_grad_enabled())
    return signature


def _difference(before: dict[str, str], after: dict[str, str]) -> str:
    names = list(dict.fromkeys([*before, *after]))
    return "; ".join(
        f"{name}: {before.get(name, 'absent')} -> {after.get(name, 'absent')}"
        for name in names
        if before.get(name) != after.get(name)
    )


class ThunderCompiled:
    """The call installed on a module compiled with thunder; records each cache miss."""

    def __init__(self, module: torch.nn.Module, name: str, thunder_module: torch.nn.Module) -> None:
        self.name = name
        self.module = module
        self.thunder_module = thunder_module
        self.stats = thunder_compat.CompileStats(thunder_module)
        self._misses = 0
        self._signatures: list[dict[str, str]] = []
        self._clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        source = getattr(type(module).forward, "__code__", None)
        self._location = f"{source.co_filename}:{source.co_firstlineno}" if source else ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.call_thunder(*args, **kwargs)
        finally:
            if self.stats.cache_misses != self._misses:
                self._record(args, kwargs)

    def call_thunder(self, *args: Any, **kwargs: Any) -> Any:
        """Run the ThunderModule, without telemetry."""
        module = self.module
        # thunder traces module.__call__; while it runs, the module must look uncompiled to it
        torch_compat.set_compiled_call(module, None)
        try:
            return self.thunder_module(*args, **kwargs)
        finally:
            torch_compat.set_compiled_call(module, self)

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stats = self.stats
        self._misses = stats.cache_misses
        signature = _signature(args, kwargs)
        reason = _difference(self._signatures[-1], signature) if self._signatures else ""
        self._signatures = [*self._signatures[-7:], signature]
        offset = self._clock_offset_ns
        start, traced, end = stats.last_compile_window()
        _pending.append(
            CompileRecord(
                source="thunder",
                compile_id=f"{self.name}/{self._misses - 1}",
                trigger="thunder",
                start_ns=start + offset,
                end_ns=end + offset,
                backend="thunder",
                frame=self.name,
                location=self._location,
                is_recompile=self._misses > 1,
                recompile_reason=reason or ("cache miss" if self._misses > 1 else ""),
                phase_times_s={"tracing": (traced - start) / 1e9, "transforms": (end - traced) / 1e9},
                extra={"thunder_cache_hits": stats.cache_hits, "thunder_cache_misses": stats.cache_misses},
            )
        )


def compile_with_thunder(module: torch.nn.Module, name: str, profile: bool = False) -> ThunderCompiled:
    """``thunder.jit`` ``module`` in place (``state_dict`` unchanged) and return its handle."""
    global _warned_profile
    nvtx_ranges = profile and torch.cuda.is_available()
    if profile and not nvtx_ranges and not _warned_profile:
        _warned_profile = True
        warnings.warn(
            "JitConfig(profile_thunder=True) does nothing on CPU: thunder's NVTX profile ranges need CUDA.",
            RuntimeWarning,
            stacklevel=2,
        )
    compiled = ThunderCompiled(module, name, thunder_compat.jit(module, nvtx_ranges))
    torch_compat.set_compiled_call(module, compiled)
    _compiled.add(compiled)
    return compiled


def take_records() -> list[CompileRecord]:
    """The thunder compiles recorded since the last call (cheap when there are none)."""
    if not _pending:
        return []
    records = list(_pending)
    _pending.clear()
    return records


def compiled_modules() -> list[ThunderCompiled]:
    return sorted(_compiled, key=lambda compiled: compiled.name)
