"""telemetry-jit: compile telemetry for Lightning training with torch.compile and Lightning Thunder."""

from telemetry_jit.configure import configure, flush, shutdown
from telemetry_jit.fabric import FabricCompileTelemetry
from telemetry_jit.jit import JitConfig, JitTransform, resolve_root, select_modules
from telemetry_jit.loop import CompileTelemetry
from telemetry_jit.reader import read_telemetry
from telemetry_jit.recording import CompileStats
from telemetry_jit.records import CompileRecord, GraphBreak
from telemetry_jit.schema import JitEventName, JitSpanName
from telemetry_jit.trainer import TelemetryCallback, hook_trainer_cls

__version__ = "0.1.0"

__all__ = [
    "CompileRecord",
    "CompileStats",
    "CompileTelemetry",
    "FabricCompileTelemetry",
    "GraphBreak",
    "JitConfig",
    "JitEventName",
    "JitSpanName",
    "JitTransform",
    "TelemetryCallback",
    "configure",
    "flush",
    "hook_trainer_cls",
    "read_telemetry",
    "resolve_root",
    "select_modules",
    "shutdown",
]
