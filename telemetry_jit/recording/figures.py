"""Compile figures by training step, for the metric loggers people already watch (TensorBoard, CSV,
MLflow, Weights & Biases, ...), under one prefix."""

from __future__ import annotations

from telemetry_jit.recording.alerts import RankTotals
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import CompileRecord, Payoff

PREFIX = "compile/"


class CompileFigures(CompileListener):
    """The compile seconds of each step that compiled, ready to log at that step with the run's totals
    (the recorder's :class:`CompileStats`) as they are then.

    Example::

        figures = CompileFigures()
        recorder.listeners.append(figures)
        ...
        for step, metrics in figures.take(recorder.stats):
            logger.log_metrics(metrics, step=step)  # {"compile/time_s": 1.9, "compile/compilations": 2, ...}
    """

    def __init__(self) -> None:
        self._pending: dict[int, float] = {}  # step -> compile seconds in it, not yet taken

    def recorded(self, record: CompileRecord) -> None:
        step = record.context.global_step if record.context is not None else 0
        self._pending[step] = self._pending.get(step, 0.0) + record.duration_ms / 1000

    def take(self, stats: CompileStats) -> list[tuple[int, dict[str, float]]]:
        """The figures of each step that compiled since the last call, by step: that step's compile
        seconds and ``stats``' totals."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, {}
        totals = {
            f"{PREFIX}total_time_s": round(stats.total_time_ms / 1000, 6),
            f"{PREFIX}compilations": stats.count,
            f"{PREFIX}recompiles": stats.recompile_count,
            f"{PREFIX}graph_breaks": stats.graph_break_count,
            f"{PREFIX}cache_hits": stats.cache_hits,
            f"{PREFIX}cache_time_saved_s": round(stats.cache_time_saved_s, 6),
        }
        return [(step, {f"{PREFIX}time_s": seconds, **totals}) for step, seconds in sorted(pending.items())]


def rank_figures(by_rank: RankTotals) -> dict[str, float]:
    """Every rank's figures, logged by rank zero: ``compile/rank<R>/compilations`` and ``.../total_time_s``."""
    figures: dict[str, float] = {}
    for rank, (count, ms) in enumerate(zip(by_rank.counts, by_rank.time_ms, strict=True)):
        figures[f"{PREFIX}rank{rank}/compilations"] = count
        figures[f"{PREFIX}rank{rank}/total_time_s"] = round(ms / 1000, 6)
    return figures


def payoff_figures(payoff: Payoff) -> dict[str, float]:
    """The payoff as logger figures: ``compile/payoff_speedup``, ``compile/payoff_eager_step_ms``, ..."""
    return {
        f"{PREFIX}payoff_{name.removeprefix('payoff.')}": value
        for name, value in payoff.attributes().items()
        if isinstance(value, (int, float))
    }
