"""Exporters for nv-one-logger's ``TrainingTelemetryProvider``; they know nothing of training.

Installed as ``telemetry_jit.exporters``.
"""

from .file import FileExporter
from .otlp import OTLPExporter

__all__ = ["FileExporter", "OTLPExporter"]
