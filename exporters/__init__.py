"""Exporters for nv-one-logger's ``TrainingTelemetryProvider``; they know nothing of training.

Installed as ``telemetry_jit.exporters``.
"""

from .file import FileExporter

__all__ = ["FileExporter"]
