"""What dynamo itself counted, for tests and benchmarks to compare telemetry against."""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo.utils as _dynamo_utils


def compiles_recorded_by_torch() -> list[Any]:
    """torch's CompilationMetrics for compiles (runtime entries such as autotuning excluded)."""
    return [m for m in _dynamo_utils.get_compilation_metrics() if not getattr(m, "is_runtime", False)]


def total_graph_breaks() -> int:
    """dynamo's own graph-break count."""
    return sum(_dynamo_utils.counters["graph_break"].values())


def reset_compile_state() -> None:
    """Forget every compile: dynamo's caches, its compilation metrics and its counters."""
    torch._dynamo.reset()
    _dynamo_utils.clear_compilation_metrics()
    _dynamo_utils.set_compilation_metrics_limit(100_000)
    _dynamo_utils.counters.clear()
