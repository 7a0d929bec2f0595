"""Two runs side by side (``telemetry-jit diff``) and a run against its budgets (``telemetry-jit check``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.diagnose import frame_label, is_recompile
from telemetry_jit.analysis.fleet import fleets
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.analysis.status import RunStatus, run_status
from telemetry_jit.analysis.summary import first_line, summarize
from telemetry_jit.diagnosis import owner_of, short
from telemetry_jit.records import Payoff
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
    causes: Counter[str] = field(default_factory=Counter)  # recompiles by cause; "<cause> (expected)" apart
    user_graph_breaks: Counter[BreakKey] = field(default_factory=Counter)  # breaks in the user's own code
    dynamo_compiles: int = 0  # frames dynamo compiled: what the code asks for, whatever the caches hold
    payoff: Payoff | None = None
    status: RunStatus = RunStatus("finished", "")

    @property
    def unexpected_recompiles(self) -> int:
        """Recompiles less the expected one-time price (a frame's first stage switch, callers of shared code)."""
        return sum(count for cause, count in self.causes.items() if not cause.endswith(EXPECTED))

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
            "status": self.status.as_json(),
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "compile_s": round(self.compile_ms / 1000, 3),
            "wall_s": round(self.wall_ms / 1000, 3),
            "compile_share": round(self.compile_share, 4),
            "graph_breaks": sum(self.graph_breaks.values()),
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_hit_rate": self.cache_hit_rate,
            "unexpected_recompiles": self.unexpected_recompiles,
            "recompile_causes": dict(self.causes),
        }


EXPECTED = " (expected)"  # how the expected price of a cause is keyed apart: "stage_switch (expected)"


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
    causes: Counter[str] = Counter()
    for row in summary.diagnosis.causes:
        causes[row.cause] += row.unexpected
        causes[row.cause + EXPECTED] += row.expected
    breaks = [(event, _break_key(event.attributes)) for event in summary.breaks]
    return RunFigures(
        compiles=len(summary.compiles),
        recompiles=len(summary.recompiles),
        compile_ms=summary.compile_ms,
        wall_ms=summary.wall_ms,
        graph_breaks=Counter(key for _, key in breaks),
        cache_hits=summary.warm_start.hits,
        cache_misses=summary.warm_start.misses,
        frames=frames,
        causes=+causes,
        user_graph_breaks=Counter(
            key for event, key in breaks if owner_of(str(event.attributes.get(GraphBreakAttr.LOCATION) or "")) == "user"
        ),
        dynamo_compiles=sum(s.attributes.get(CompileAttr.TRIGGER) == "dynamo" for s in summary.compiles),
        payoff=summary.payoff,
        status=run_status(run),
    )


def _break_key(attributes: dict[str, Any]) -> BreakKey:
    return (
        short(str(attributes.get(GraphBreakAttr.LOCATION) or "unknown location")),
        first_line(attributes.get(GraphBreakAttr.REASON) or ""),
    )


@dataclass
class RunDiff:
    base: RunFigures
    new: RunFigures

    def statuses(self) -> list[tuple[str, RunStatus]]:
        return [("base", self.base.status), ("new", self.new.status)]

    @property
    def new_graph_breaks(self) -> Counter[BreakKey]:
        """Breaks the new run has more of than the base, by location and reason."""
        return self.new.graph_breaks - self.base.graph_breaks

    @property
    def fixed_graph_breaks(self) -> Counter[BreakKey]:
        return self.base.graph_breaks - self.new.graph_breaks

    @property
    def new_causes(self) -> Counter[str]:
        """Recompiles by cause that the new run has more of than the base."""
        return self.new.causes - self.base.causes

    @property
    def fixed_causes(self) -> Counter[str]:
        return self.base.causes - self.new.causes

    @property
    def cache_effect(self) -> bool:
        """The runs compiled the same frames for the same reasons, and differ only in the graphs the
        compile caches served (a warm cache loads backward graphs a cold run compiles): not a code change."""
        base, new = self.base, self.new
        return (
            base.compiles != new.compiles
            and base.cache_hits != new.cache_hits
            and base.dynamo_compiles == new.dynamo_compiles
            and base.causes == new.causes
            and base.graph_breaks == new.graph_breaks
        )

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
            "new_recompile_causes": dict(self.new_causes),
            "fixed_recompile_causes": dict(self.fixed_causes),
            "frames": [{"frame": frame, "base": b.as_json(), "new": n.as_json()} for frame, b, n in self.frames()],
            "cache_effect_only": self.cache_effect,
            "payoff": {
                "base": self.base.payoff.attributes() if self.base.payoff is not None else None,
                "new": self.new.payoff.attributes() if self.new.payoff is not None else None,
            },
        }


def _breaks_json(counter: Counter[BreakKey]) -> list[dict[str, Any]]:
    return [{"location": loc, "reason": reason, "count": n} for (loc, reason), n in sorted(counter.items())]


def diff(base: TelemetryRun, new: TelemetryRun) -> RunDiff:
    return RunDiff(figures(base), figures(new))


class CannotTell(ValueError):
    """``check`` cannot measure what a budget asks: no budget, a missing baseline."""


class Unfinished(ValueError):
    """A run (or its baseline) did not finish: it failed, was interrupted or killed, or records are missing."""


@dataclass
class Budget:
    """What ``telemetry-jit check`` enforces; ``None`` leaves a figure unchecked."""

    max_graph_breaks: int | None = None
    max_recompiles: int | None = None
    max_unexpected_recompiles: int | None = None  # the expected price of switching stages not counted
    max_compile_share: float | None = None  # 0 - 1
    no_new_graph_breaks: bool = False  # against a baseline run
    user_code_only: bool = False  # graph-break budgets count only breaks in the user's own code
    max_skew_s: float | None = None  # ranks: seconds waited for the slowest rank, over every shared compile
    ranks_compile_alike: bool = False  # ranks: one compile sequence for every rank

    @property
    def empty(self) -> bool:
        figures = (
            self.max_graph_breaks,
            self.max_recompiles,
            self.max_unexpected_recompiles,
            self.max_compile_share,
            self.max_skew_s,
        )
        return all(f is None for f in figures) and not (self.no_new_graph_breaks or self.ranks_compile_alike)


def check(
    runs: TelemetryRun | Sequence[TelemetryRun],
    budget: Budget,
    baseline: TelemetryRun | Sequence[TelemetryRun] | None = None,
    allow_incomplete: bool = False,
) -> list[str]:
    """Every way ``runs`` (one run, or the ranks of one) break ``budget``, each a readable sentence;
    empty when they keep it. Budgets of one run apply to every rank; ``--max-skew`` and
    ``--ranks-compile-alike`` to the ranks together.

    Raises:
        CannotTell: there is no budget, or a baseline budget has no baseline: a gate must not pass what it
            cannot measure.
        Unfinished: a run (or the baseline) did not finish, unless ``allow_incomplete``: its figures are
            those of part of a run.
    """
    runs = [runs] if isinstance(runs, TelemetryRun) else list(runs)
    baselines = [baseline] if isinstance(baseline, TelemetryRun) else list(baseline or [])
    if budget.empty:
        raise CannotTell(
            "no budget given, so nothing would be checked: pass at least one of --max-graph-breaks, "
            "--max-recompiles, --max-unexpected-recompiles, --max-compile-share, --no-new-graph-breaks, "
            "--max-skew, --ranks-compile-alike."
        )
    if budget.no_new_graph_breaks and not baselines:
        raise CannotTell("--no-new-graph-breaks compares with a baseline run: pass --baseline FILE.")
    for name, checked in (("the run", runs), ("the baseline", baselines)):
        for run in checked:
            status = run_status(run)
            if status.finished or allow_incomplete:
                continue
            problem = Unfinished if status.state != "incomplete" else CannotTell  # records are missing: unseen
            raise problem(
                f"{name} (rank {run.rank}) {status.state}: {status.detail}. Its figures cover part of a run; pass "
                "--allow-incomplete to judge them anyway."
            )
    by_rank = {run.rank: run for run in baselines}
    broken = []
    for run in runs:
        prefix = f"rank {run.rank}: " if len(runs) > 1 else ""
        reference = by_rank.get(run.rank, baselines[0] if baselines else None)
        broken += [prefix + reason for reason in _check_one(run, budget, reference)]
    if len({run.rank for run in runs}) > 1:
        broken += _check_fleet(runs, budget)
    elif budget.max_skew_s is not None or budget.ranks_compile_alike:
        raise CannotTell("--max-skew and --ranks-compile-alike compare ranks: pass every rank's file (or a folder).")
    return broken


def _check_one(run: TelemetryRun, budget: Budget, baseline: TelemetryRun | None) -> list[str]:
    new = figures(run)
    breaks_of = (lambda f: f.user_graph_breaks) if budget.user_code_only else (lambda f: f.graph_breaks)
    which = " in your code" if budget.user_code_only else ""
    broken = []
    breaks = sum(breaks_of(new).values())
    if budget.max_graph_breaks is not None and breaks > budget.max_graph_breaks:
        broken.append(f"{breaks} graph breaks{which}, more than the {budget.max_graph_breaks} allowed")
    if budget.max_recompiles is not None and new.recompiles > budget.max_recompiles:
        broken.append(f"{new.recompiles} recompilations, more than the {budget.max_recompiles} allowed")
    allowed = budget.max_unexpected_recompiles
    if allowed is not None and new.unexpected_recompiles > allowed:
        causes = ", ".join(f"{cause} {n}" for cause, n in new.causes.items() if not cause.endswith(EXPECTED))
        broken.append(
            f"{new.unexpected_recompiles} recompilations beyond the expected stage switches ({causes}), more than "
            f"the {allowed} allowed"
        )
    if budget.max_compile_share is not None and new.compile_share > budget.max_compile_share:
        broken.append(
            f"compiling took {100 * new.compile_share:.1f}% of the run, more than the "
            f"{100 * budget.max_compile_share:g}% allowed"
        )
    if budget.no_new_graph_breaks and baseline is not None:
        for (location, reason), count in sorted((breaks_of(new) - breaks_of(figures(baseline))).items()):
            broken.append(f"new graph break{which} at {location} ({count}x, not in the baseline): {reason}")
    return broken


def _check_fleet(runs: list[TelemetryRun], budget: Budget) -> list[str]:
    broken = []
    for found in fleets(runs):
        if budget.max_skew_s is not None and found.total_skew_ms / 1000 > budget.max_skew_s:
            worst = found.skews[0]
            broken.append(
                f"ranks waited {found.total_skew_ms / 1000:.2f} s for the slowest at shared compiles, more than the "
                f"{budget.max_skew_s:g} s allowed (the longest: {worst.wait_ms / 1000:.2f} s at {worst.compile_id} "
                f"{worst.frame}, rank {worst.last_rank} last)"
            )
        if budget.ranks_compile_alike and len(found.sequences) > 1:
            odd = found.sequences[1]
            listed = ", ".join(map(str, odd.ranks[:8]))
            broken.append(
                f"ranks compiled differently: {len(found.sequences)} groups; ranks {listed} ({odd.what}) unlike the "
                f"{len(found.sequences[0].ranks)} others: {odd.difference}"
            )
    return broken
