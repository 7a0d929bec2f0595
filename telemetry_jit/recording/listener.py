"""What the recorder tells whoever follows compilations (totals, metrics, the console, alerts, loggers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from telemetry_jit.records import CompileRecord, CompileResources

if TYPE_CHECKING:
    from telemetry_jit.recording.first_steps import FirstStep


class CompileListener:
    """Told of compilations while a run is recorded; every method does nothing unless overridden.
    ``compile_started``, ``compile_measured`` and ``compile_finished`` run inside torch's compile callbacks:
    keep them cheap, never raise."""

    def compile_started(self, description: str) -> None:
        """``description`` names the code (and a recompile's reason) in words."""

    def compile_measured(self, resources: CompileResources) -> None:
        """What the compilation ending cost the host (just before ``compile_finished``)."""

    def compile_finished(self) -> None:
        """The compilation that began last ended."""

    def recorded(self, record: CompileRecord) -> None:
        """Once per compilation: ``record.context`` says where training was, ``record.cause`` why it recompiled."""

    def first_step(self, step: FirstStep) -> None:
        """Once per stage, when its first step has been measured."""
