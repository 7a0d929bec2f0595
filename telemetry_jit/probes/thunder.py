"""Compiling submodules with thunder and reading ``thunder.compile_stats`` into
:class:`CompileRecord` objects.

Two ways to compile, as ``JitConfig.thunder_backend`` picks. ``"jit"``: ``thunder.jit`` of the
module. The compiled module stays where it is in the model: the hook ``nn.Module.compile`` uses
(see :func:`telemetry_jit.compat.torch.set_compiled_call`) runs the ``ThunderModule``. Replacing
the child with the ``ThunderModule`` would change ``state_dict`` keys (``layer1.weight`` becomes
``layer1..weight``), so checkpoints would no longer load into the plain model. ``"dynamo"``
(NeMo's): ``module.compile(backend=thunder.dynamo.ThunderCompiler())``; dynamo captures graphs,
thunder splits each into pieces it runs and ops it leaves to torch.

After each call of a thunder-compiled function telemetry-jit compares thunder's cache-miss count
with the last one it saw; a new miss becomes a record with thunder's own timestamps: from the start
of tracing to the end of the host window in which transforms ran and the cache entry was built.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from typing import Any

import torch

from telemetry_jit.compat import thunder as thunder_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.recording.records import CompileRecord, GraphBreak

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


class ThunderFunction:
    """One thunder-compiled function: each new cache miss becomes a :class:`CompileRecord`."""

    def __init__(self, name: str, thunder_module: torch.nn.Module, location: str) -> None:
        self.name = name
        self.stats = thunder_compat.CompileStats(thunder_module)
        self._location = location
        self._misses = 0
        self._signatures: list[dict[str, str]] = []
        self._clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._pending: deque[CompileRecord] = deque(maxlen=10_000)  # until a recorder takes them

    def take_records(self) -> list[CompileRecord]:
        """The compiles recorded since the last call."""
        records = list(self._pending)
        self._pending.clear()
        return records

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """After a call with these inputs: record the compile if thunder missed its cache."""
        if self.stats.cache_misses != self._misses:
            self._record(args, kwargs)

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stats = self.stats
        self._misses = stats.cache_misses
        signature = _signature(args, kwargs)
        reason = _difference(self._signatures[-1], signature) if self._signatures else ""
        self._signatures = [*self._signatures[-7:], signature]
        offset = self._clock_offset_ns
        start, traced, end = stats.last_compile_window()
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


class ThunderCompiled:
    """The call installed on a module compiled with ``thunder.jit``."""

    def __init__(self, module: torch.nn.Module, name: str, thunder_module: torch.nn.Module) -> None:
        self.module = module
        self.thunder_module = thunder_module
        self.function = ThunderFunction(name, thunder_module, _forward_location(module))

    @property
    def functions(self) -> list[ThunderFunction]:
        return [self.function]

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return []  # thunder.jit does not split graphs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.call_thunder(*args, **kwargs)
        finally:
            self.function.check(args, kwargs)

    def call_thunder(self, *args: Any, **kwargs: Any) -> Any:
        """Run the ThunderModule, without telemetry."""
        module = self.module
        # thunder traces module.__call__; while it runs, the module must look uncompiled to it
        torch_compat.set_compiled_call(module, None)
        try:
            return self.thunder_module(*args, **kwargs)
        finally:
            torch_compat.set_compiled_call(module, self)


class ThunderDynamoBackend:
    """``thunder.dynamo.ThunderCompiler`` as a ``torch.compile`` backend (NeMo's thunder path).

    dynamo's compiles are recorded like any backend's; in addition each piece thunder compiles is a
    :class:`ThunderFunction` (its first call traces it), and each op thunder leaves to torch becomes
    a graph break of the dynamo compile that made the graph.
    """

    def __init__(self, name: str, location: str, nvtx_ranges: bool = False) -> None:
        self.__name__ = "thunder"  # torch.compile names a backend by it: compile.backend on dynamo's spans
        self.name = name
        self.location = location
        self.compiler = thunder_compat.dynamo_compiler(nvtx_ranges)
        self.functions: list[ThunderFunction] = []  # one per piece, in the order thunder made them
        self._splits: dict[str, list[GraphBreak]] = {}  # dynamo compile id -> thunder's splits of its graph

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        """The ops thunder left to torch in the graph dynamo compile ``compile_id`` made."""
        return self._splits.pop(compile_id, [])

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        split, made = thunder_compat.split_graph(self.compiler, graph, example_inputs)
        for piece, thunder_module in made.thunder_modules:
            function = ThunderFunction(f"{self.name}/graph{made.index}.{piece}", thunder_module, self.location)
            self.functions.append(function)
            thunder_module.register_forward_hook(
                lambda _, args, kwargs, __, function=function: function.check(args, kwargs), with_kwargs=True
            )
        if made.splits:
            self._splits[torch_compat.current_compile_id()] = [
                GraphBreak(reason, location, counted_by_torch=False, compiler="thunder")
                for reason, location in made.splits
            ]
        return split


def _forward_location(module: torch.nn.Module) -> str:
    source = getattr(type(module).forward, "__code__", None)
    return f"{source.co_filename}:{source.co_firstlineno}" if source else ""


def _warn_profile_on_cpu(profile: bool) -> bool:
    """Whether to add thunder's NVTX ranges; says once that they do nothing without CUDA."""
    global _warned_profile
    nvtx_ranges = profile and torch.cuda.is_available()
    if profile and not nvtx_ranges and not _warned_profile:
        _warned_profile = True
        warnings.warn(
            "JitConfig(profile_thunder=True) does nothing on CPU: thunder's NVTX profile ranges need CUDA.",
            RuntimeWarning,
            stacklevel=3,
        )
    return nvtx_ranges


def compile_with_thunder(module: torch.nn.Module, name: str, profile: bool = False) -> ThunderCompiled:
    """``thunder.jit`` ``module`` in place (``state_dict`` unchanged) and return its handle."""
    compiled = ThunderCompiled(module, name, thunder_compat.jit(module, _warn_profile_on_cpu(profile)))
    torch_compat.set_compiled_call(module, compiled)
    return compiled


class ThunderDynamoCompiled:
    """The call installed on a module compiled with :class:`ThunderDynamoBackend`: dynamo's own
    compiled call, and the backend, so that recorders find the pieces from the model."""

    def __init__(self, compiled_call: Any, backend: ThunderDynamoBackend) -> None:
        self.compiled_call = compiled_call
        self.backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled_call(*args, **kwargs)

    @property
    def functions(self) -> list[ThunderFunction]:
        return self.backend.functions

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return self.backend.take_splits(compile_id)


def compile_with_thunder_dynamo(module: torch.nn.Module, name: str, profile: bool = False) -> ThunderDynamoCompiled:
    """``module.compile(backend=thunder.dynamo.ThunderCompiler())``, as NeMo does, with telemetry."""
    backend = ThunderDynamoBackend(name, _forward_location(module), _warn_profile_on_cpu(profile))
    module.compile(backend=backend)
    compiled = ThunderDynamoCompiled(torch_compat.compiled_call(module), backend)
    torch_compat.set_compiled_call(module, compiled)
    return compiled


ThunderSource = ThunderCompiled | ThunderDynamoCompiled  # a module's thunder compilation: its pieces and splits


def sources_in(model: torch.nn.Module) -> list[ThunderSource]:
    """The thunder compilations installed on ``model``'s modules (by :class:`~telemetry_jit.JitTransform`)."""
    calls = (torch_compat.compiled_call(module) for module in model.modules())
    return [call for call in calls if isinstance(call, (ThunderCompiled, ThunderDynamoCompiled))]
