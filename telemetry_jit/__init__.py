"""telemetry-jit: compile telemetry for Lightning training with torch.compile and Lightning Thunder. Names are
imported when first used: reading files never imports torch, Lightning, nv-one-logger or OpenTelemetry."""

from __future__ import annotations

import importlib
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

if sys.version_info < (3, 10):  # noqa: UP036 - pip refuses to install it there; a copy on the path says why
    raise ImportError(
        f"telemetry-jit needs Python 3.10 or newer (tested on 3.10 to 3.13); this is Python {sys.version.split()[0]}."
    )

__version__ = metadata.version("telemetry-jit")

# where each name lives, imported when first used
_MODULES = {
    "analysis.reader": ("read_telemetry",),
    "analysis.text": ("format_summary",),
    "compilers": ("compile_in_place", "CompiledCodeRan", "dynamo_compile_id"),
    "lightning.compile_telemetry": ("CompileTelemetryCallback",),
    "lightning.fabric": ("FabricCompileTelemetry",),
    "lightning.jit_transform": ("JitConfig", "JitTransform", "resolve_root", "select_modules"),
    "lightning.payoff_callback": ("CompilePayoffCallback",),
    "lightning.time_events": ("TimeEventCallback",),
    "lightning.trainer": ("hook_trainer_cls",),
    "loop": ("CompileTelemetry",),
    "probes.backends": ("CompilerBackend", "register_backend"),
    "recording.console": ("CompileConsole",),
    "recording.payoff": ("PayoffSettings",),
    "recording.stats": ("CompileStats",),
    "records": ("CompileRecord", "GraphBreak", "Payoff"),
    "schema": ("JitEventName", "JitSpanName"),
    "session": ("configure", "flush", "Session", "shutdown"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = [
    "CompileConsole",
    "CompilePayoffCallback",
    "CompilerBackend",
    "CompileRecord",
    "CompileStats",
    "CompileTelemetry",
    "CompileTelemetryCallback",
    "CompiledCodeRan",
    "FabricCompileTelemetry",
    "GraphBreak",
    "JitConfig",
    "JitEventName",
    "JitSpanName",
    "JitTransform",
    "Payoff",
    "PayoffSettings",
    "Session",
    "TimeEventCallback",
    "compile_in_place",
    "configure",
    "dynamo_compile_id",
    "flush",
    "format_summary",
    "hook_trainer_cls",
    "read_telemetry",
    "register_backend",
    "resolve_root",
    "select_modules",
    "shutdown",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'telemetry_jit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"telemetry_jit.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])


if TYPE_CHECKING:
    from telemetry_jit.analysis.reader import read_telemetry
    from telemetry_jit.analysis.text import format_summary
    from telemetry_jit.compilers import CompiledCodeRan, compile_in_place, dynamo_compile_id
    from telemetry_jit.lightning.compile_telemetry import CompileTelemetryCallback
    from telemetry_jit.lightning.fabric import FabricCompileTelemetry
    from telemetry_jit.lightning.jit_transform import JitConfig, JitTransform, resolve_root, select_modules
    from telemetry_jit.lightning.payoff_callback import CompilePayoffCallback
    from telemetry_jit.lightning.time_events import TimeEventCallback
    from telemetry_jit.lightning.trainer import hook_trainer_cls
    from telemetry_jit.loop import CompileTelemetry
    from telemetry_jit.probes.backends import CompilerBackend, register_backend
    from telemetry_jit.recording.console import CompileConsole
    from telemetry_jit.recording.payoff import PayoffSettings
    from telemetry_jit.recording.stats import CompileStats
    from telemetry_jit.records import CompileRecord, GraphBreak, Payoff
    from telemetry_jit.schema import JitEventName, JitSpanName
    from telemetry_jit.session import Session, configure, flush, shutdown
