"""Exporters for nv-one-logger's ``TrainingTelemetryProvider``; they know nothing of training.

Installed as ``telemetry_jit.exporters``.
"""

from .file import FileExporter
from .isolated import IsolatedExporter
from .otlp import OTLPExporter

__all__ = ["FileExporter", "IsolatedExporter", "OTLPExporter"]
