"""Names of the spans, events and attributes telemetry-jit records (documented in docs/telemetry.md)."""

from enum import Enum
from typing import Final


class TrainingSpanName:
    """nv-one-logger's span names (``StandardTrainingJobSpanName``, ``StandardSpanName``) that
    telemetry-jit reads, ends or hangs spans under. Plain strings: nv-one-logger looks spans up by name."""

    APPLICATION: Final = "application"
    TRAINING_LOOP: Final = "training_loop"
    VALIDATION_LOOP: Final = "validation_loop"
    TESTING_LOOP: Final = "testing_loop"
    TRAINING_ITERATION: Final = "training_single_iteration"
    VALIDATION_ITERATION: Final = "validation_single_iteration"


class JitSpanName(str, Enum):
    """Spans added to nv-one-logger's standard training spans."""

    COMPILATION = "compilation"

    def __str__(self) -> str:
        return self.value


class JitEventName(str, Enum):
    GRAPH_BREAK = "graph_break"
    DDP_GRAPH_SPLIT = "ddp_graph_split"
    RECOMPILE_LIMIT_HIT = "recompile_limit_hit"
    COMPILE_SUMMARY = "compile_summary"

    def __str__(self) -> str:
        return self.value


# The loop spans a compilation span may hang under, innermost first (nv-one-logger names).
LOOP_SPAN_NAMES = (
    TrainingSpanName.VALIDATION_LOOP,
    TrainingSpanName.TESTING_LOOP,
    TrainingSpanName.TRAINING_LOOP,
    TrainingSpanName.APPLICATION,
)


# The JSON Lines file telemetry_jit.exporters.FileExporter writes; the reader refuses a newer version.
FILE_FORMAT = "telemetry-jit"
FILE_FORMAT_VERSION = 1
