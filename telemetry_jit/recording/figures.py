"""Compile figures by training step, for the metric loggers people already watch (TensorBoard, CSV,
MLflow, Weights & Biases, ...), under one prefix."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.notices import Notices
from telemetry_jit.recording.alerts import RankTotals
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import CompileRecord, Payoff

PREFIX = "compile/"
LOG_METRICS = call_site("logger.log_metrics", "a metrics logger's log_metrics (Lightning's or Fabric's loggers)")


class GuardedLog:
    """One logger's ``log(metrics, step=...)``, guarded: a failure is caught, counted and said once, never
    raised into training. When a call fails, each of its keys is tried alone once; a key the logger refuses
    while it takes others (a name with ``/`` some tracking servers reject) is never sent to it again."""

    def __init__(self, log: Callable[..., Any], name: str) -> None:
        self._log = log
        self.name = name
        self.refused: set[str] = set()
        self._notices = Notices()

    def __call__(self, metrics: Mapping[str, float], step: int) -> None:
        wanted = {key: value for key, value in metrics.items() if key not in self.refused}
        if not wanted or LOG_METRICS.call(self._log, wanted, step=step) is not FAILED or len(wanted) == 1:
            return
        failed = [
            key for key, value in wanted.items() if LOG_METRICS.call(self._log, {key: value}, step=step) is FAILED
        ]
        if len(failed) < len(wanted):  # the logger works: these keys are what it refuses
            self.refused.update(failed)
            self._notices.warn(
                ("refused", tuple(failed)),
                f"telemetry-jit: the logger {self.name} refuses {', '.join(failed)}; telemetry-jit does not send "
                "those to it again (the other compile figures still go to it).",
                every_rank=True,
                origin="telemetry-jit:0",
            )


class CompileFigures(CompileListener):
    """The compile seconds of each step that compiled, to log at that step with the run's totals as they are
    then: one value per key per step, so a step is given out once it is over; validation's compiles count at
    the step Lightning logs validation's metrics at."""

    def __init__(self) -> None:
        self._pending: dict[int, float] = {}  # step -> compile seconds in it, not yet taken
        self._last: tuple[int, float] = (-1, 0.0)  # the last step taken and its seconds so far

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def recorded(self, record: CompileRecord) -> None:
        context = record.context
        step = 0 if context is None else context.global_step if context.log_step is None else context.log_step
        self._pending[step] = self._pending.get(step, 0.0) + record.duration_ms / 1000

    def take(self, stats: CompileStats, current_step: int | None = None) -> list[tuple[int, dict[str, float]]]:
        """The figures of each step that compiled and is over (before ``current_step``; ``None``: every step),
        by step: its compile seconds and ``stats``' totals."""
        over = [step for step in self._pending if current_step is None or step < current_step]
        if not over:
            return []
        pending = {step: self._pending.pop(step) for step in sorted(over)}
        last_step, last_seconds = self._last
        if last_step in pending:  # a step given out before compiled again (another loop at the same step):
            pending[last_step] += last_seconds  # the figure at a step is all of that step's compiling
        self._last = max(pending.items())
        totals: dict[str, float] = {
            f"{PREFIX}total_time_s": round(stats.total_time_ms / 1000, 6),
            f"{PREFIX}frame_compiles": stats.frame_compiles,
            f"{PREFIX}backward_graphs": stats.backward_graphs,
            f"{PREFIX}recompiles": stats.recompile_count,
            f"{PREFIX}graph_breaks": stats.graph_break_count,
        }
        if stats.thunder_compiles:
            totals[f"{PREFIX}thunder_compiles"] = stats.thunder_compiles
        if stats.cache_hits or stats.cache_misses:  # only where the backend has a cache (inductor's, AOTAutograd's)
            totals[f"{PREFIX}cache_hits"] = stats.cache_hits
            totals[f"{PREFIX}cache_time_saved_s"] = round(stats.cache_time_saved_s, 6)
        return [(step, {f"{PREFIX}time_s": seconds, **totals}) for step, seconds in pending.items()]


def per_rank_figures(by_rank: RankTotals) -> dict[str, float]:
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
