"""Compilers as plug-ins: what ``JitTransform`` compiles with, and what the recorder observes of it.

Every compiler is one: torch.compile and thunder (:mod:`telemetry_jit.compilers`) as any other. A
backend compiles a module in place and may bring an observer that turns what its compiler did into
:class:`~telemetry_jit.records.CompileRecord` objects; the recorder polls every backend's observer beside
torch._dynamo's probe (which sees whatever dynamo compiles, a backend's graphs and the user's own
``torch.compile`` included). Backends are found through the entry point group ``telemetry_jit.compilers``
(an installed package's, the built-ins') or registered by hand with :func:`register_backend`.
"""

from __future__ import annotations

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
    """Turns what a compiler did into records; polled by the recorder at each step (keep :meth:`poll` cheap
    when nothing happened). It may also have, and the recorder then calls:

    - ``watch(model)``: the model trained, at each loop's start (find the modules compiled on it);
    - ``take_splits(compile_id) -> list[GraphBreak]``: the pieces it split the graph of dynamo's compile
      ``compile_id`` into (see :func:`~telemetry_jit.compilers.dynamo_compile_id`), added to that
      compile's record as graph breaks;
    - ``cache_counts() -> dict[str, tuple[int, int]]``: cache hits and misses during the run, per function,
      for the run's ``compile_summary``;
    - ``watching``: ``False`` while it has nothing to poll (none of its compilations found yet): the recorder
      then skips it at steps, and polls it as each loop ends.
    """

    def attach(self) -> None: ...

    def poll(self) -> list[CompileRecord]: ...

    def detach(self) -> None: ...


@runtime_checkable
class CompilerBackend(Protocol):
    """A compiler ``JitTransform`` can compile with (``JitConfig(backend=name)``).

    Attributes:
        name: what ``JitConfig(backend=...)`` names it by; its records' ``compile.backend``.
        title: what the startup line says compiles (``telemetry-jit: <title>(<module>)``).
        optimizes (optional, default True): False for a compiler that runs graphs as captured, so that a
            slower compiled step is said to be its doing.
    """

    name: str
    title: str

    def check(self, config: Any) -> None:
        """Raise when this backend cannot work here (a missing install) or with ``config`` (its ``JitConfig``):
        called at ``setup``, before the sanity check and the first step."""

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        """Compile ``module`` in place (``config``: its ``JitConfig``); return a callable saying whether its
        compiled code has run yet (asked after the first epoch, to warn about a module nothing called;
        :func:`~telemetry_jit.compilers.compile_in_place` returns one)."""
        ...

    def observer(self) -> Observer | None:
        """What observes this compiler's compiles (one per run), or ``None`` (the dynamo probe sees them)."""
        ...


_BACKENDS: dict[str, CompilerBackend] = {}  # registered by hand
_FOUND: dict[tuple[str, ...], dict[str, CompilerBackend]] = {}  # by sys.path: the entry points found on it
_LOADED: dict[str, CompilerBackend] = {}  # by entry point value


def register_backend(backend: CompilerBackend) -> None:
    """Make ``backend`` available as ``JitConfig(backend=backend.name)`` (it replaces one of its name).

    Raises:
        TypeError: ``backend`` lacks what :class:`CompilerBackend` asks for.
    """
    if not isinstance(backend, CompilerBackend) or not isinstance(getattr(backend, "name", None), str):
        raise TypeError(
            "register_backend takes a CompilerBackend (name, title, check(config), compile(), observer()), "
            f"got {backend!r}."
        )
    _BACKENDS[backend.name] = backend


def unregister_backend(name: str) -> None:
    """Forget the backend registered by hand as ``name`` (nothing happens where there is none)."""
    _BACKENDS.pop(name, None)


def compiler_backend(name: str) -> CompilerBackend:
    """The backend called ``name``.

    Raises:
        LookupError: none is, naming those that are.
    """
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
    key = tuple(sys.path)
    if key not in _FOUND:
        _FOUND.clear()
        _FOUND[key] = _discover()
    return list({**_FOUND[key], **_BACKENDS}.values())


def _discover() -> dict[str, CompilerBackend]:
    entries = {entry.name: entry for entry in metadata.entry_points(group=ENTRY_POINTS)}
    if "torch" not in entries:  # installed before the built-ins were entry points (an old editable install)
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
