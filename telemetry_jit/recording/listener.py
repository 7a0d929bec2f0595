"""What the recorder tells whoever follows compilations: totals, metrics, the live console, alerts,
Lightning's loggers. One small interface the recorder loops over."""

from __future__ import annotations

from typing import TYPE_CHECKING

from telemetry_jit.records import CompileRecord, CompileResources

if TYPE_CHECKING:
    from telemetry_jit.recording.first_steps import FirstStep


class CompileListener:
    """Told of compilations while a run is recorded; every method does nothing unless overridden.

    ``compile_started`` and ``compile_finished`` run inside torch's compile callbacks (keep them
    cheap, never raise); ``recorded`` runs once per compilation when the recorder takes it, its
    ``record.context`` saying where training was when it started and ``record.cause`` why it
    recompiled; ``first_step`` once per stage, when its first step has been measured.
    """

    def compile_started(self, description: str) -> None:
        """A compilation began; ``description`` names the code (and a recompile's reason) in words."""

    def compile_measured(self, resources: CompileResources) -> None:
        """What the compilation that is ending cost the host (told just before ``compile_finished``)."""

    def compile_finished(self) -> None:
        """The compilation that began last ended."""

    def recorded(self, record: CompileRecord) -> None:
        """A finished compilation was recorded."""

    def first_step(self, step: FirstStep) -> None:
        """The first step of a stage ended: its wall time and the compiling in it."""
