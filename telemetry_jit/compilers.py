"""The built-in compiler plug-ins (torch.compile, ``thunder.jit``, thunder through dynamo), declared as entry
points in pyproject.toml like any other, and the helpers a plug-in compiles with: :func:`compile_in_place`
(returns the check :class:`CompiledCodeRan`) and :func:`dynamo_compile_id`.

Thunder compiles in two ways, as ``JitConfig.thunder_backend`` picks. ``"jit"``: ``thunder.jit`` of the module. The
compiled module stays where it is in the model: the hook ``nn.Module.compile`` uses (see
:func:`telemetry_jit.compat.torch.set_compiled_call`) runs the ``ThunderModule``. Replacing the
child with the ``ThunderModule`` would change ``state_dict`` keys (``layer1.weight`` becomes
``layer1..weight``), so checkpoints would no longer load into the plain model. ``"dynamo"``
(NeMo's): ``module.compile(backend=thunder.dynamo.ThunderCompiler())``; dynamo captures graphs,
thunder splits each into pieces it runs and ops it leaves to torch.
"""

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
        return self._splits.pop(compile_id, [])

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
            self._splits[dynamo_compile_id()] = [
                GraphBreak(reason, location, counted_by_torch=False, compiler="thunder")
                for reason, location in made.splits
            ]
        return split


class ThunderDynamoCompiled(ThunderSource):
    """The call installed on a module compiled with :class:`ThunderDynamoBackend`: dynamo's own
    compiled call, and the backend, so that recorders find the pieces from the model."""

    def __init__(self, compiled_call: Callable[..., Any], backend: ThunderDynamoBackend) -> None:
        self.compiled_call = compiled_call
        self.backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled_call(*args, **kwargs)

    @property
    def functions(self) -> list[ThunderFunction]:
        return self.backend.functions

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return self.backend.take_splits(compile_id)


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


def compile_with_thunder_dynamo(module: torch.nn.Module, name: str, profile: bool = False) -> ThunderDynamoCompiled:
    """``module.compile(backend=thunder.dynamo.ThunderCompiler())``, as NeMo does, with telemetry."""
    backend = ThunderDynamoBackend(name, _forward_location(module), _nvtx_ranges(profile))
    torch_compat.compile_in_place(module, backend=backend)
    call = torch_compat.compiled_call(module)
    assert call is not None  # module.compile() installed it
    compiled = ThunderDynamoCompiled(call, backend)
    torch_compat.set_compiled_call(module, compiled)
    return compiled


class FirstCall:
    """The call installed on a module compiled in place, until its first call: it notes that the module was
    called and how many frames dynamo compiled during that call, then steps aside (later calls go straight to
    the compiled code, with nothing of telemetry in between)."""

    def __init__(self, module: torch.nn.Module, call: Callable[..., Any]) -> None:
        self.module = module
        self.call = call
        self.called = False
        self.compiled_frames = 0
        self.failed_frames = 0  # compiles that raised, which dynamo suppressed and ran the frame eagerly

    @classmethod
    def install(cls, module: torch.nn.Module) -> FirstCall | None:
        call = torch_compat.compiled_call(module)
        if call is None:
            return None
        watch = cls(module, call)
        torch_compat.set_compiled_call(module, watch)
        return watch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        torch_compat.set_compiled_call(self.module, self.call)  # steps aside first: a nested call goes straight
        compiled, attempted = torch_compat.frames_compiled(), torch_compat.frames_attempted()
        try:
            return self.call(*args, **kwargs)
        finally:
            self.called = True
            self.compiled_frames = torch_compat.frames_compiled() - compiled
            self.failed_frames = torch_compat.frames_attempted() - attempted - self.compiled_frames


def compiled_code_ran(module: torch.nn.Module, watch: FirstCall | None = None) -> bool:
    """Whether the compiled code installed on ``module`` has run: thunder's cache was consulted; or it was
    called and dynamo compiled a frame then, or holds compiled code for the frame it compiles."""
    call = torch_compat.compiled_call(module)
    if isinstance(call, ThunderCompiled):
        stats = call.function.stats
        return stats.cache_hits + stats.cache_misses > 0
    if watch is not None and not watch.called:
        return False
    if watch is not None and watch.compiled_frames:
        return True
    return torch_compat.has_compiled_code_for(module)


class CompiledCodeRan:
    """Whether a module's compiled code has run (:func:`compiled_code_ran`); ``called``: whether anything called
    the module at all, where its first call is watched."""

    def __init__(self, module: torch.nn.Module, watch: FirstCall | None = None) -> None:
        self.module, self.watch = module, watch

    def __call__(self) -> bool:
        return compiled_code_ran(self.module, self.watch)

    @property
    def called(self) -> bool:
        return self.watch is not None and self.watch.called

    @property
    def failed(self) -> bool:
        """Whether dynamo set out to compile the module's first call and the compile raised."""
        return self.watch is not None and self.watch.failed_frames > 0


def compile_in_place(module: torch.nn.Module, **compile_kwargs: Any) -> CompiledCodeRan:
    """``module.compile(**compile_kwargs)`` (``state_dict`` unchanged) such that dynamo compiles it on every
    supported torch (torch < 2.15 skips the ``forward`` of torch's own layers, an ``nn.Sequential`` among them,
    and compiles nothing), and the check a plug-in's ``compile`` returns: has the compiled code run?"""
    torch_compat.compile_in_place(module, **compile_kwargs)
    return CompiledCodeRan(module, FirstCall.install(module))


def dynamo_compile_id() -> str:
    """The id of dynamo's compile in progress (``"0/1"``; ``""`` outside one): inside a ``torch.compile`` backend,
    the key under which an observer's ``take_splits`` hands back the pieces it split that compile's graph into."""
    return torch_compat.current_compile_id()


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
        compile_with_thunder_dynamo(module, label, profile=config.profile_thunder)
        return CompiledCodeRan(module)

    def observer(self) -> ThunderWatch:
        return ThunderWatch(ThunderDynamoCompiled)
