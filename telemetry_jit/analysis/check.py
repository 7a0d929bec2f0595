"""A run against its budgets (``telemetry-jit check``): the CI gate, which never passes what it did not see."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from telemetry_jit.analysis.diff import EXPECTED, RunDiff, cause_words
from telemetry_jit.analysis.fleet import fleets
from telemetry_jit.analysis.runs import TelemetryRun, missing_ranks
from telemetry_jit.analysis.summary import RunSummary, summarize
from telemetry_jit.analysis.text import fallback_line
from telemetry_jit.causes import CAUSES
from telemetry_jit.terminal import counted, possessive


class CannotTell(ValueError):
    """``check`` cannot measure what a budget asks: no budget, a missing baseline, records missing."""


class Unfinished(ValueError):
    """A run (or its baseline) did not finish: it failed, was interrupted or was killed."""


@dataclass
class Budget:
    """What ``telemetry-jit check`` enforces; ``None`` leaves a figure unchecked."""

    max_graph_breaks: int | None = None
    max_recompiles: int | None = None
    max_unexpected_recompiles: int | None = None  # the expected price (stage switches, ...) not counted
    max_compile_share: float | None = None  # 0 - 1 of the loop's wall time
    no_new_graph_breaks: bool = False  # against a baseline run
    no_new_recompile_causes: bool = False  # against a baseline run: a cause (and kind of stage) it did not have
    user_code_only: bool = False  # graph-break budgets count only breaks in the user's own code
    max_skew_s: float | None = None  # ranks: seconds waited for the slowest rank, over every shared compile
    ranks_compile_alike: bool = False  # ranks: one compile sequence for every rank
    no_eager_fallback: bool = False  # no frame may run eagerly after the recompile limit or a failed compile
    no_early_stop: bool = False  # the run must have run every loop to its length (no max_time, should_stop, ...)

    def __post_init__(self) -> None:
        """A budget below zero (or not a number) would be judged and mean nothing: refused, naming the option."""
        for option, value in (
            ("--max-graph-breaks", self.max_graph_breaks),
            ("--max-recompiles", self.max_recompiles),
            ("--max-unexpected-recompiles", self.max_unexpected_recompiles),
            ("--max-skew", self.max_skew_s),
        ):
            if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"{option} takes a number of 0 or more, got {value!r}.")
        share = self.max_compile_share
        if share is not None and not (isinstance(share, (int, float)) and 0 <= share <= 1):
            raise ValueError(f"--max-compile-share takes a percentage from 0 to 100 (e.g. 25%), got {share!r}.")


def check(
    runs: TelemetryRun | Sequence[TelemetryRun],
    budget: Budget,
    baseline: TelemetryRun | Sequence[TelemetryRun] | None = None,
    allow_incomplete: bool = False,
) -> list[str]:
    """Every way ``runs`` (one run, or its ranks) break ``budget``, each a sentence; empty when they keep it.

    Raises:
        CannotTell: no budget, a baseline budget without baseline, or records missing (unless allow_incomplete).
        Unfinished: a run (or the baseline) failed, was interrupted or killed (unless allow_incomplete).
    """
    runs = [runs] if isinstance(runs, TelemetryRun) else list(runs)
    baselines = [baseline] if isinstance(baseline, TelemetryRun) else list(baseline or [])
    given = (value for name, value in vars(budget).items() if name != "user_code_only")  # says how breaks count
    if all(value is None or value is False for value in given):
        raise CannotTell(
            "no budget given, so nothing would be checked: pass at least one of --max-graph-breaks, "
            "--max-recompiles, --max-unexpected-recompiles, --max-compile-share, --no-new-graph-breaks, "
            "--no-new-recompile-causes, --no-eager-fallback, --no-early-stop, --max-skew, --ranks-compile-alike."
        )
    if not baselines and (budget.no_new_graph_breaks or budget.no_new_recompile_causes):
        option = "--no-new-graph-breaks" if budget.no_new_graph_breaks else "--no-new-recompile-causes"
        raise CannotTell(f"{option} compares with a baseline run: pass --baseline FILE.")
    judged = {id(run): summarize(run) for run in [*runs, *baselines]}
    for name, checked in (("the run", runs), ("the baseline", baselines)):
        for run in checked:
            status = judged[id(run)].status
            if status.state == "empty":  # nothing to judge, whatever --allow-incomplete says
                raise Unfinished(f"{name} (rank {run.rank}) trained nothing: {status.detail}.")
            if status.finished or allow_incomplete:
                continue
            # records proven missing (named) make a run that did not finish; lines unread, a part moved away: unseen
            problem = Unfinished if status.state != "incomplete" or status.missing else CannotTell
            raise problem(
                f"{name} (rank {run.rank}) {status.state}: {status.detail}. Its figures cover part of a run; pass "
                "--allow-incomplete to judge them anyway."
            )
    one_rank = len({run.rank for run in runs}) <= 1
    if one_rank and (budget.max_skew_s is not None or budget.ranks_compile_alike):
        raise CannotTell("--max-skew and --ranks-compile-alike compare ranks: pass every rank's file (or a folder).")
    for name, checked in (("the run", runs), ("the baseline", baselines)):
        absent = missing_ranks(checked)
        if absent and not allow_incomplete:
            raise Unfinished(
                f"{name} is missing {'; '.join(absent)}. Its figures cover part of a job; pass --allow-incomplete "
                "to judge the ranks given anyway."
            )
    by_rank = {run.rank: judged[id(run)] for run in baselines}
    broken = []
    for run in runs:
        prefix = f"rank {run.rank}: " if len(runs) > 1 else ""
        reference = by_rank.get(run.rank, judged[id(baselines[0])] if baselines else None)
        broken += [prefix + reason for reason in _check_one(judged[id(run)], budget, reference)]
    if not one_rank:
        broken += _check_fleet(runs, budget)
    return broken


def _check_one(new: RunSummary, budget: Budget, baseline: RunSummary | None) -> list[str]:
    breaks_of = (lambda s: s.digest.user_break_keys) if budget.user_code_only else (lambda s: s.digest.break_keys)
    which = " in your code" if budget.user_code_only else ""
    broken = []
    breaks, d = sum(breaks_of(new).values()), new.digest
    if budget.max_graph_breaks is not None and breaks > budget.max_graph_breaks:
        broken.append(f"{counted(breaks, 'graph break')}{which}, more than the {budget.max_graph_breaks} allowed")
    if budget.max_recompiles is not None and d.recompiles > budget.max_recompiles:
        broken.append(f"{counted(d.recompiles, 'recompilation')}, more than the {budget.max_recompiles} allowed")
    allowed = budget.max_unexpected_recompiles
    if allowed is not None and d.unexpected_recompiles > allowed:
        causes = ", ".join(f"{c} {n}" for c, n in d.causes_by_name().most_common() if not c.endswith(EXPECTED))
        broken.append(
            f"{counted(d.unexpected_recompiles, 'recompilation')} beyond the expected price ({causes}), more than "
            f"the {allowed} allowed"
        )
    share = new.share
    if budget.max_compile_share is not None and share is None:
        raise CannotTell(
            "--max-compile-share: the run recorded no loop, so there is no wall time to share compiling against"
        )
    if budget.max_compile_share is not None and share is not None and share > budget.max_compile_share:
        broken.append(
            f"compiling took {100 * share:.1f}% of {possessive(new.loop_words)} wall time, more than the "
            f"{100 * budget.max_compile_share:g}% allowed"
        )
    if budget.no_eager_fallback:
        broken += [fallback_line(fallback, new.last_step) for fallback in new.fallbacks]
        broken += [found.words() for found in new.not_compiled]
        broken += new.not_run
    if budget.no_early_stop and new.status.stopped_early:
        broken.append(f"the run stopped early: {new.status.stopped_early}")
    if budget.no_new_recompile_causes and baseline is not None:
        # as diff says them: a recompile the baseline met too (the same frame, stage, step and batch) under
        # another cause's name is no new one
        for cause, count in RunDiff(baseline, new).new_only.causes.items():
            if not cause.endswith(EXPECTED):
                broken.append(
                    f"new recompile cause {cause_words(cause)} ({counted(count, 'recompile')}, not in the baseline): "
                    f"{CAUSES[cause.split(' ', 1)[0]].title}"
                )
    if budget.no_new_graph_breaks and baseline is not None:
        for (location, reason), count in sorted(breaks_of(new).items()):
            if (location, reason) not in breaks_of(baseline):
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
