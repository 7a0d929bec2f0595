"""Exporters for nv-one-logger's ``TrainingTelemetryProvider``; they know nothing of training.

Installed as ``telemetry_jit.exporters``. ``OTLPExporter`` is imported when first asked for: writing a
file never imports OpenTelemetry's SDK (nor meets its environment variables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .file import FileExporter
from .isolated import IsolatedExporter

if TYPE_CHECKING:
    from .otlp import OTLPExporter

__all__ = ["FileExporter", "IsolatedExporter", "OTLPExporter"]


def __getattr__(name: str) -> Any:
    if name == "OTLPExporter":
        from .otlp import OTLPExporter

        return OTLPExporter
    raise AttributeError(f"module 'telemetry_jit.exporters' has no attribute {name!r}")
