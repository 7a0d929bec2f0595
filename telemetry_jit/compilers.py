"""The built-in compiler plug-ins (entry points in pyproject.toml) and the helpers a plug-in compiles with. A
``thunder.jit`` module runs through the hook ``nn.Module.compile`` uses, not as a replaced child: that would
change ``state_dict`` keys (``layer1.weight`` becomes ``layer1..weight``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from telemetry_jit.compat import thunder as thunder_compat
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import warn_once
from telemetry_jit.probes.thunder_stats import ThunderFunction, ThunderSource, ThunderWatch
from telemetry_jit.records import GraphBreak
from telemetry_jit.terminal import error_text


class ThunderCompiled(ThunderSource):
    """The call installed on a module compiled with ``thunder.jit``."""

    def __init__(self, module: torch.nn.Module, name: str, thunder_module: torch.nn.Module) -> None:
        self.module = module
        self.thunder_module = thunder_module
        self.function = ThunderFunction(name, thunder_module, _forward_location(module))

    @property
    def functions(self) -> list[ThunderFunction]:
        return [self.function]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.call_thunder(*args, **kwargs)
        finally:
            self.function.check(args, kwargs)

    def call_thunder(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        # thunder traces module.__call__; while it runs, the module must look uncompiled to it
        torch_compat.set_compiled_call(module, None)
        try:
            return self.thunder_module(*args, **kwargs)
        finally:
            torch_compat.set_compiled_call(module, self)


class ThunderDynamoBackend:
    """``thunder.dynamo.ThunderCompiler`` as a ``torch.compile`` backend (NeMo's path): each piece thunder compiles
    is a :class:`ThunderFunction`, each op it leaves to torch a graph break of the dynamo compile."""

    def __init__(self, name: str, location: str, nvtx_ranges: bool = False) -> None:
        self.__name__ = "thunder"  # torch.compile names a backend by it: compile.backend on dynamo's spans
        self.name = name
        self.location = location
        self.compiler = thunder_compat.dynamo_compiler(nvtx_ranges)
        self.functions: list[ThunderFunction] = []  # one per piece, in the order thunder made them
        self.splits: dict[str, list[GraphBreak]] = {}  # dynamo compile id -> thunder's splits of its graph

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with torch_compat.eager_graph_modules():
            split, made = thunder_compat.split_graph(self.compiler, graph, example_inputs)
        for piece, thunder_module in made.thunder_modules:
            function = ThunderFunction(f"{self.name}/graph{made.index}.{piece}", thunder_module, self.location)
            self.functions.append(function)
            thunder_module.register_forward_hook(
                lambda _, args, kwargs, __, function=function: function.check(args, kwargs), with_kwargs=True
            )
        if made.splits:
            self.splits[dynamo_compile_id()] = [
                GraphBreak(reason, location, counted_by_torch=False, compiler="thunder")
                for reason, location in made.splits
            ]
        return split


class ThunderDynamoCompiled(ThunderSource):
    """dynamo's compiled call on a module, with the backend, so that recorders find the pieces from the model."""

    def __init__(self, compiled_call: Callable[..., Any], backend: ThunderDynamoBackend) -> None:
        self.compiled_call = compiled_call
        self.backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled_call(*args, **kwargs)

    @property
    def functions(self) -> list[ThunderFunction]:
        return self.backend.functions

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return self.backend.splits.pop(compile_id, [])


def _forward_location(module: torch.nn.Module) -> str:
    source = getattr(type(module).forward, "__code__", None)
    return f"{source.co_filename}:{source.co_firstlineno}" if source else ""


def _nvtx_ranges(profile: bool) -> bool:
    """Whether to add thunder's NVTX ranges; says once that they do nothing without CUDA."""
    nvtx_ranges = profile and torch.cuda.is_available()
    if profile and not nvtx_ranges:
        warn_once(
            "profile_thunder on CPU",
            "JitConfig(profile_thunder=True) does nothing on CPU: thunder's NVTX profile ranges need CUDA.",
        )
    return nvtx_ranges


def compile_with_thunder(module: torch.nn.Module, name: str, profile: bool = False) -> ThunderCompiled:
    """``thunder.jit`` ``module`` in place (``state_dict`` unchanged) and return its handle."""
    compiled = ThunderCompiled(module, name, thunder_compat.jit(module, _nvtx_ranges(profile)))
    torch_compat.set_compiled_call(module, compiled)
    return compiled


class CompiledCodeRan:
    """Whether a module's compiled code has run: thunder's cache was consulted, or dynamo compiled a frame at its
    first call or holds compiled code for it. With ``watch``, it is installed on the module until the first call
    (noting the frames dynamo compiled in it, then stepping aside) and knows ``called`` and ``failed`` (dynamo set
    out to compile that call and the compile raised, so it ran eagerly)."""

    def __init__(self, module: torch.nn.Module, watch: bool = False) -> None:
        self.module = module
        self.called = self.failed = False
        self._compiled_frames = 0
        self._call = torch_compat.compiled_call(module) if watch else None
        if self._call is not None:
            torch_compat.set_compiled_call(module, self._first_call)

    def _first_call(self, *args: Any, **kwargs: Any) -> Any:
        assert self._call is not None  # installed only with one
        torch_compat.set_compiled_call(self.module, self._call)  # steps aside first: a nested call goes straight
        compiled, attempted = torch_compat.frames_compiled(), torch_compat.frames_attempted()
        try:
            return self._call(*args, **kwargs)
        finally:
            self.called = True
            self._compiled_frames = torch_compat.frames_compiled() - compiled
            self.failed = torch_compat.frames_attempted() - attempted > self._compiled_frames

    def __call__(self) -> bool:
        call = torch_compat.compiled_call(self.module)
        if isinstance(call, ThunderCompiled):
            stats = call.function.stats
            return stats.cache_hits + stats.cache_misses > 0
        if self._call is not None and not self.called:
            return False
        return self._compiled_frames > 0 or torch_compat.has_compiled_code_for(self.module)


def compile_in_place(module: torch.nn.Module, **compile_kwargs: Any) -> CompiledCodeRan:
    """``module.compile(**compile_kwargs)`` such that dynamo compiles it on every supported torch (before 2.15 it
    skips torch's own layers' ``forward``), and the check a plug-in's ``compile`` returns."""
    torch_compat.compile_in_place(module, **compile_kwargs)
    return CompiledCodeRan(module, watch=True)


# inside a torch.compile backend: the id of dynamo's compile in progress ("0/1"), the key of ``take_splits``
dynamo_compile_id = torch_compat.current_compile_id


# -- the built-in backends: JitConfig(use_torch=True) is "torch", use_thunder=True "thunder" or "thunder-dynamo" --
class TorchCompileBackend:
    """``module.compile(**config.torch_kwargs)``, in place; observed by the dynamo probe."""

    name, title = "torch", "torch.compile"

    def check(self, config: Any) -> None:
        """Arguments torch.compile rejects fail here, not after setup and the sanity check have run."""
        try:
            torch_compat.check_compile_arguments(**config.torch_kwargs)
        except Exception as error:
            raise ValueError(
                f"JitConfig(torch_kwargs={config.torch_kwargs!r}): torch.compile does not take them "
                f"({error_text(error)}). Fix or drop that argument (torch._dynamo.list_backends() lists "
                "the backends, torch._inductor.list_mode_options() the modes)."
            ) from error

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        return compile_in_place(module, **config.torch_kwargs)

    def observer(self) -> None:
        return None  # the dynamo probe sees its compiles


class ThunderJitBackend:
    """``thunder.jit`` of the module, in place (``state_dict`` unchanged); its observer reads thunder's cache."""

    name, title = "thunder", "thunder.jit"

    def check(self, config: Any) -> None:
        thunder_compat.import_thunder()  # a missing or broken install fails here, before the first step

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        compile_with_thunder(module, label, profile=config.profile_thunder)
        return CompiledCodeRan(module)

    def observer(self) -> ThunderWatch:
        return ThunderWatch(ThunderCompiled)


class ThunderThroughDynamoBackend:
    """NeMo's path: ``torch.compile`` with ``thunder.dynamo.ThunderCompiler``: dynamo's compiles seen by its probe,
    the pieces thunder compiles and the graphs it splits by this backend's observer."""

    name, title = "thunder-dynamo", "torch.compile with thunder.dynamo.ThunderCompiler"

    def check(self, config: Any) -> None:
        thunder_compat.dynamo_compiler()

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        """``module.compile(backend=thunder.dynamo.ThunderCompiler())``, as NeMo does, with telemetry."""
        backend = ThunderDynamoBackend(label, _forward_location(module), _nvtx_ranges(config.profile_thunder))
        torch_compat.compile_in_place(module, backend=backend)
        call = torch_compat.compiled_call(module)
        assert call is not None  # module.compile() installed it
        torch_compat.set_compiled_call(module, ThunderDynamoCompiled(call, backend))
        return CompiledCodeRan(module)

    def observer(self) -> ThunderWatch:
        return ThunderWatch(ThunderDynamoCompiled)
