"""Compilers as plug-ins: what ``JitTransform`` compiles with, and what the recorder observes of it.

A backend compiles a module in place and may bring an observer that turns what its compiler did into
:class:`~telemetry_jit.records.CompileRecord` objects; the recorder polls every registered backend's
observer beside its own probes (torch._dynamo's and thunder's, which watch whatever compiled, the user's
own ``torch.compile`` included). torch, ``thunder.jit`` and NeMo's thunder-through-dynamo path are
registered by :mod:`telemetry_jit.lightning.compilers`; another compiler is one class and one call.

Example::

    class MyBackend:
        name, title = "mine", "my.compile"

        def check(self) -> None: ...  # raise here when it cannot work: before the first step

        def compile(self, module, label, config):
            module.forward = my.compile(module.forward)
            return lambda: my.ran(module)  # has the compiled code run?

        def observer(self):
            return MyObserver()  # attach(), poll() -> [CompileRecord, ...], detach(); or None

    telemetry_jit.register_backend(MyBackend())
    JitConfig(backend="mine", module_selector="encoder")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from telemetry_jit.records import CompileRecord


@runtime_checkable
class Observer(Protocol):
    """Turns what a compiler did into records; polled by the recorder at each step (keep :meth:`poll` cheap
    when nothing happened)."""

    def attach(self) -> None: ...

    def poll(self) -> list[CompileRecord]: ...

    def detach(self) -> None: ...


@runtime_checkable
class CompilerBackend(Protocol):
    """A compiler ``JitTransform`` can compile with (``JitConfig(backend=name)``).

    Attributes:
        name: what ``JitConfig(backend=...)`` names it by.
        title: what the startup line says compiles (``telemetry-jit: <title>(<module>)``).
    """

    name: str
    title: str

    def check(self, config: Any) -> None:
        """Raise when this backend cannot work here (a missing install) or with ``config`` (its ``JitConfig``):
        called at ``setup``, before the sanity check and the first step."""

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        """Compile ``module`` in place (``config``: its ``JitConfig``); return a callable saying whether its
        compiled code has run yet (asked after the first epoch, to warn about a module nothing called)."""
        ...

    def observer(self) -> Observer | None:
        """What observes this compiler's compiles, or ``None`` (the built-in probes see them)."""
        ...


_BACKENDS: dict[str, CompilerBackend] = {}


def register_backend(backend: CompilerBackend) -> None:
    """Make ``backend`` available as ``JitConfig(backend=backend.name)`` (a second one of a name replaces it).

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
    """Forget the backend registered as ``name`` (nothing happens where there is none)."""
    _BACKENDS.pop(name, None)


def compiler_backend(name: str) -> CompilerBackend:
    """The backend registered as ``name``.

    Raises:
        LookupError: none is, naming those that are.
    """
    found = _BACKENDS.get(name)
    if found is None:
        raise LookupError(
            f"no compiler backend {name!r}: registered are {sorted(_BACKENDS)}. Register yours with "
            "telemetry_jit.register_backend(...) before the trainer's setup."
        )
    return found


def backends() -> list[CompilerBackend]:
    return list(_BACKENDS.values())
