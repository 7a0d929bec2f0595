"""Compilers as plug-ins (README.md, "Compilers are plug-ins"), the built-in ones too: found through the entry point
group ``telemetry_jit.compilers`` or registered with :func:`register_backend`."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

import torch

from telemetry_jit.notices import warn_once
from telemetry_jit.records import CompileRecord

ENTRY_POINTS = "telemetry_jit.compilers"


@runtime_checkable
class Observer(Protocol):
    """Turns what a compiler did into records; polled at each step (keep :meth:`poll` cheap when nothing
    happened). It may also have ``watch(model)``, ``take_splits(compile_id)``, ``cache_counts()`` and
    ``watching``, as README.md says."""

    def attach(self) -> None: ...

    def poll(self) -> list[CompileRecord]: ...

    def detach(self) -> None: ...


@runtime_checkable
class CompilerBackend(Protocol):
    """A compiler ``JitTransform`` can compile with (``JitConfig(backend=name)``); it may say ``optimizes =
    False`` (it runs graphs as captured: a slower compiled step is its doing)."""

    name: str  # what JitConfig(backend=...) names it by; its records' compile.backend
    title: str  # what the startup line says compiles: telemetry-jit: <title>(<module>)

    def check(self, config: Any) -> None:
        """Raise when this backend cannot work here or with ``config`` (its ``JitConfig``): at ``setup``."""

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        """Compile ``module`` in place; return a callable saying whether its compiled code has run yet (asked
        after the first epoch; :func:`~telemetry_jit.compilers.compile_in_place` returns one)."""
        ...

    def observer(self) -> Observer | None:
        """What observes this compiler's compiles (one per run), or ``None`` (the dynamo probe sees them)."""
        ...


_BACKENDS: dict[str, CompilerBackend] = {}  # registered by hand
_LOADED: dict[str, CompilerBackend] = {}  # by entry point value


def register_backend(backend: CompilerBackend) -> None:
    """Make ``backend`` available as ``JitConfig(backend=backend.name)`` (it replaces one of its name); a
    ``TypeError`` when it lacks what :class:`CompilerBackend` asks for."""
    if not isinstance(backend, CompilerBackend) or not isinstance(getattr(backend, "name", None), str):
        raise TypeError(
            "register_backend takes a CompilerBackend (name, title, check(config), compile(), observer()), "
            f"got {backend!r}."
        )
    _BACKENDS[backend.name] = backend


def compiler_backend(name: str) -> CompilerBackend:
    """The backend called ``name``; a ``LookupError`` naming those there are when none is."""
    found = {backend.name: backend for backend in backends()}.get(name)
    if found is None:
        raise LookupError(
            f"no compiler backend {name!r}: registered are {sorted(b.name for b in backends())}. Install the "
            f"package whose {ENTRY_POINTS!r} entry point names it, or register yours with "
            "telemetry_jit.register_backend(...) before the trainer's setup."
        )
    return found


def backends() -> list[CompilerBackend]:
    """The backends installed packages declare (entry points) and those registered by hand, which win."""
    return list({**_discover(tuple(sys.path)), **_BACKENDS}.values())


@functools.lru_cache(maxsize=1)
def _discover(path: tuple[str, ...]) -> dict[str, CompilerBackend]:
    """The entry points found on ``path`` (``sys.path``): looked for again when it changes."""
    entries = {entry.name: entry for entry in metadata.entry_points(group=ENTRY_POINTS)}
    if "torch" not in entries:  # no metadata declares the built-ins: a source checkout, an old editable install
        entries.update((name, metadata.EntryPoint(name, value, ENTRY_POINTS)) for name, value in _BUILT_INS.items())
    found = {}
    for entry in entries.values():
        backend = _LOADED.get(entry.value) or _load(entry)
        if backend is not None:  # one instance per entry point, whatever sys.path does later
            found[backend.name] = _LOADED.setdefault(entry.value, backend)
    return found


def _load(entry: metadata.EntryPoint) -> CompilerBackend | None:
    try:
        loaded = entry.load()
        backend = loaded() if isinstance(loaded, type) else loaded
    except Exception as error:  # noqa: BLE001 - a broken plug-in costs its backend, not the run
        warn_once(("plug-in", entry.value), f"telemetry-jit: compiler plug-in {entry.value} failed to load: {error!r}")
        return None
    if isinstance(backend, CompilerBackend):
        return backend
    warn_once(("plug-in", entry.value), f"telemetry-jit: {entry.value} is no CompilerBackend; skipped.")
    return None


_BUILT_INS = {
    "torch": "telemetry_jit.compilers:TorchCompileBackend",
    "thunder": "telemetry_jit.compilers:ThunderJitBackend",
    "thunder-dynamo": "telemetry_jit.compilers:ThunderThroughDynamoBackend",
}
