"""Probe for thunder: a new cache miss in ``thunder.compile_stats`` after a call becomes a :class:`CompileRecord`
with thunder's own timestamps. :mod:`telemetry_jit.compilers` installs each :class:`ThunderSource` watched."""

from __future__ import annotations

import time
from collections import deque
from operator import attrgetter
from typing import Any

import torch

from telemetry_jit.compat import thunder as thunder_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.records import CompileRecord, GraphBreak


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


class ThunderFunction:
    """One thunder-compiled function: each new cache miss becomes a :class:`CompileRecord`."""

    def __init__(self, name: str, thunder_module: torch.nn.Module, location: str) -> None:
        self.name = name
        self.stats = thunder_compat.import_thunder().compile_stats(thunder_module)  # times in perf_counter_ns
        self._location = location
        self._misses = 0
        self._signature: dict[str, str] = {}  # of the last miss
        self._clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._pending: deque[CompileRecord] = deque(maxlen=10_000)  # until a recorder takes them

    def take_records(self) -> list[CompileRecord]:
        """The compiles recorded since the last call."""
        records = list(self._pending)
        self._pending.clear()
        return records

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After a call with these inputs: record the compile if thunder missed its cache."""
        stats = self.stats
        if stats.cache_misses == self._misses:
            return
        self._misses = stats.cache_misses
        before, after = self._signature, _signature(args, kwargs)
        reason = "; ".join(
            f"{name}: {before.get(name, 'absent')} -> {after.get(name, 'absent')}"
            for name in dict.fromkeys([*before, *after])
            if before and before.get(name) != after.get(name)
        )
        self._signature = after
        offset = self._clock_offset_ns
        start, traced = stats.last_trace_tracing_start, stats.last_trace_tracing_stop
        end = max(stats.last_trace_host_execution_stop or traced, traced)  # transforms and prologue run before it
        self._pending.append(
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


class ThunderSource:
    """A module's thunder compilation: the call installed in place of its own (``torch_compat.set_compiled_call``),
    with the functions thunder compiled and the ops it left to torch in dynamo's graphs (``thunder.dynamo``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @property
    def functions(self) -> list[ThunderFunction]:
        raise NotImplementedError

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        """The ops thunder left to torch in the graph the dynamo compile ``compile_id`` made."""
        return []


def sources_in(model: torch.nn.Module) -> list[ThunderSource]:
    """The thunder compilations installed on ``model``'s modules (by :class:`~telemetry_jit.JitTransform`)."""
    calls = (torch_compat.compiled_call(module) for module in model.modules())
    return [call for call in calls if isinstance(call, ThunderSource)]


class ThunderWatch:
    """A thunder backend's :class:`~telemetry_jit.probes.backends.Observer` of its ``kind`` of compilations."""

    def __init__(self, kind: type[ThunderSource] = ThunderSource) -> None:
        self._kind = kind
        self._sources: dict[int, ThunderSource] = {}  # by id
        self._before: dict[int, tuple[int, int]] = {}  # function id -> (hits, misses) when first seen
        self.watching = False  # any compilation found: until then the recorder does not poll it at each step

    def attach(self) -> None:
        pass

    def detach(self) -> None:
        pass

    def watch(self, model: torch.nn.Module) -> None:
        """Watch the thunder compilations installed on ``model`` (cheap to repeat)."""
        for source in sources_in(model):
            if not isinstance(source, self._kind) or id(source) in self._sources:
                continue
            self._sources[id(source)] = source
            self.watching = True
            for function in source.functions:
                function.take_records()  # compiled before this run (a module called by hand): not this run's
                self._before[id(function)] = (function.stats.cache_hits, function.stats.cache_misses)

    def poll(self) -> list[CompileRecord]:
        """The compiles recorded since the last call."""
        return [record for function in self._functions() for record in function.take_records()]

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return [split for source in self._sources.values() for split in source.take_splits(compile_id)]

    def cache_counts(self) -> dict[str, tuple[int, int]]:
        """``(cache hits, cache misses)`` during the run, per function that had any, by name."""
        counts = {}
        for function in sorted(self._functions(), key=attrgetter("name")):
            hits, misses = self._before.get(id(function), (0, 0))
            stats = function.stats
            if stats.cache_misses - misses or stats.cache_hits - hits:
                counts[function.name] = (stats.cache_hits - hits, stats.cache_misses - misses)
        return counts

    def _functions(self) -> list[ThunderFunction]:
        return [function for source in self._sources.values() for function in source.functions]
