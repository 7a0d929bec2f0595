"""Two runs side by side (``telemetry-jit diff``) and a run against its budgets (``telemetry-jit check``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.analysis.summary import first_line, frame_label, is_recompile, short_location, summarize
from telemetry_jit.schema import CompileAttr, GraphBreakAttr

BreakKey = tuple[str, str]  # (file:line as the summary shows it, first line of the reason)


@dataclass
class FrameFigures:
    """One compiled frame of one run."""

    compiles: int = 0
    recompiles: int = 0
    compile_ms: float = 0.0
    recompile_reasons: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "compile_s": round(self.compile_ms / 1000, 3),
            "recompile_reasons": dict(self.recompile_reasons),
        }


@dataclass
class RunFigures:
    """What a comparison of two runs looks at."""

    compiles: int
    recompiles: int
    compile_ms: float
    wall_ms: float
    graph_breaks: Counter[BreakKey]
    cache_hits: int
    cache_misses: int
    frames: dict[str, FrameFigures]  # "frame (file:line)" -> figures

    @property
    def compile_share(self) -> float:
        """Compile time over the loop's wall time, 0 - 1."""
        return self.compile_ms / self.wall_ms if self.wall_ms else 0.0

    @property
    def cache_hit_rate(self) -> float | None:
        looked_up = self.cache_hits + self.cache_misses
        return self.cache_hits / looked_up if looked_up else None

    def as_json(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "compile_s": round(self.compile_ms / 1000, 3),
            "wall_s": round(self.wall_ms / 1000, 3),
            "compile_share": round(self.compile_share, 4),
            "graph_breaks": sum(self.graph_breaks.values()),
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_hit_rate": self.cache_hit_rate,
        }


def figures(run: TelemetryRun) -> RunFigures:
    summary = summarize(run)
    # keyed by "frame (file:line)" with the last two path parts, as are graph breaks: a baseline recorded
    # in another checkout (a developer's machine, CI) has other absolute paths
    frames: dict[str, FrameFigures] = {}
    for span in summary.compiles:
        frame = frames.setdefault(frame_label(span), FrameFigures())
        frame.compiles += 1
        frame.compile_ms += span.duration_ms or 0.0
        if is_recompile(span):
            frame.recompiles += 1
            frame.recompile_reasons[first_line(span.attributes.get(CompileAttr.RECOMPILE_REASON) or "unknown")] += 1
    return RunFigures(
        compiles=len(summary.compiles),
        recompiles=len(summary.recompiles),
        compile_ms=summary.compile_ms,
        wall_ms=summary.wall_ms,
        graph_breaks=Counter(
            (
                short_location(str(event.attributes.get(GraphBreakAttr.LOCATION) or "unknown location")),
                first_line(event.attributes.get(GraphBreakAttr.REASON) or ""),
            )
            for event in summary.breaks
        ),
        cache_hits=summary.warm_start.hits,
        cache_misses=summary.warm_start.misses,
        frames=frames,
    )


@dataclass
class RunDiff:
    base: RunFigures
    new: RunFigures

    @property
    def new_graph_breaks(self) -> Counter[BreakKey]:
        """Breaks the new run has more of than the base, by location and reason."""
        return self.new.graph_breaks - self.base.graph_breaks

    @property
    def fixed_graph_breaks(self) -> Counter[BreakKey]:
        return self.base.graph_breaks - self.new.graph_breaks

    def frames(self) -> list[tuple[str, FrameFigures, FrameFigures]]:
        """``(frame, base figures, new figures)`` for every frame either run compiled."""
        return [
            (frame, self.base.frames.get(frame, FrameFigures()), self.new.frames.get(frame, FrameFigures()))
            for frame in sorted(self.base.frames.keys() | self.new.frames.keys())
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "base": self.base.as_json(),
            "new": self.new.as_json(),
            "new_graph_breaks": _breaks_json(self.new_graph_breaks),
            "fixed_graph_breaks": _breaks_json(self.fixed_graph_breaks),
            "frames": [{"frame": frame, "base": b.as_json(), "new": n.as_json()} for frame, b, n in self.frames()],
        }


def _breaks_json(counter: Counter[BreakKey]) -> list[dict[str, Any]]:
    return [{"location": loc, "reason": reason, "count": n} for (loc, reason), n in sorted(counter.items())]


def diff(base: TelemetryRun, new: TelemetryRun) -> RunDiff:
    return RunDiff(figures(base), figures(new))


@dataclass
class Budget:
    """What ``telemetry-jit check`` enforces; ``None`` leaves a figure unchecked."""

    max_graph_breaks: int | None = None
    max_recompiles: int | None = None
    max_compile_share: float | None = None  # 0 - 1
    no_new_graph_breaks: bool = False  # against a baseline run


def check(run: TelemetryRun, budget: Budget, baseline: TelemetryRun | None = None) -> list[str]:
    """Every way ``run`` breaks ``budget``, each a readable sentence; empty when it keeps it."""
    if budget.no_new_graph_breaks and baseline is None:
        raise ValueError("--no-new-graph-breaks compares with a baseline run: pass --baseline FILE.")
    new = figures(run)
    broken = []
    breaks = sum(new.graph_breaks.values())
    if budget.max_graph_breaks is not None and breaks > budget.max_graph_breaks:
        broken.append(f"{breaks} graph breaks, more than the {budget.max_graph_breaks} allowed")
    if budget.max_recompiles is not None and new.recompiles > budget.max_recompiles:
        broken.append(f"{new.recompiles} recompilations, more than the {budget.max_recompiles} allowed")
    if budget.max_compile_share is not None and new.compile_share > budget.max_compile_share:
        broken.append(
            f"compiling took {100 * new.compile_share:.1f}% of the run, more than the "
            f"{100 * budget.max_compile_share:g}% allowed"
        )
    if budget.no_new_graph_breaks and baseline is not None:
        for (location, reason), count in sorted((new.graph_breaks - figures(baseline).graph_breaks).items()):
            broken.append(f"new graph break at {location} ({count}x, not in the baseline): {reason}")
    return broken
