"""Compile figures by training step, for the metric loggers people already watch (TensorBoard, CSV,
MLflow, Weights & Biases, ...), under one prefix."""

from __future__ import annotations

from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord, Payoff

PREFIX = "compile/"


class CompileFigures(CompileListener):
    """Running totals, and the compile seconds of each step that compiled, ready to log at that step.

    Example::

        figures = CompileFigures()
        recorder.listeners.append(figures)
        ...
        for step, metrics in figures.take():
            logger.log_metrics(metrics, step=step)  # {"compile/time_s": 1.9, "compile/compilations": 2, ...}
    """

    def __init__(self) -> None:
        self.compilations = 0
        self.recompiles = 0
        self.graph_breaks = 0
        self.cache_hits = 0
        self.cache_time_saved_s = 0.0
        self.total_time_s = 0.0
        self._pending: dict[int, float] = {}  # step -> compile seconds in it, not yet taken

    def recorded(self, record: CompileRecord) -> None:
        seconds = record.duration_ms / 1000
        self.compilations += 1
        self.recompiles += record.is_frame_recompile
        self.graph_breaks += len(record.graph_breaks)
        self.cache_hits += record.cache_hits
        self.cache_time_saved_s += record.cache.get("time_saved_s", 0.0)
        self.total_time_s += seconds
        step = record.context.global_step if record.context is not None else 0
        self._pending[step] = self._pending.get(step, 0.0) + seconds

    def take(self) -> list[tuple[int, dict[str, float]]]:
        """The figures of each step that compiled since the last call, by step: that step's compile
        seconds and the totals as they are now."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, {}
        return [(step, {f"{PREFIX}time_s": seconds, **self.totals()}) for step, seconds in sorted(pending.items())]

    def totals(self) -> dict[str, float]:
        return {
            f"{PREFIX}total_time_s": round(self.total_time_s, 6),
            f"{PREFIX}compilations": self.compilations,
            f"{PREFIX}recompiles": self.recompiles,
            f"{PREFIX}graph_breaks": self.graph_breaks,
            f"{PREFIX}cache_hits": self.cache_hits,
            f"{PREFIX}cache_time_saved_s": round(self.cache_time_saved_s, 6),
        }


def payoff_figures(payoff: Payoff) -> dict[str, float]:
    """The payoff as logger figures: ``compile/payoff_speedup``, ``compile/payoff_eager_step_ms``, ..."""
    return {
        f"{PREFIX}payoff_{name.removeprefix('payoff.')}": value
        for name, value in payoff.attributes().items()
        if isinstance(value, (int, float))
    }
