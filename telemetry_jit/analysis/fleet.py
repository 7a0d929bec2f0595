"""Many ranks of one run as one answer, whose length does not grow with the rank count: how compile time and
counts spread, which ranks compiled differently or missed the cache, and how long ranks waited for the slowest at
each shared compile (the skew that ends jobs at the collective watchdog); and what the rank watcher said live."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from telemetry_jit.analysis.cold_start import explain
from telemetry_jit.analysis.digest import RunDigest
from telemetry_jit.analysis.reader import digest_of
from telemetry_jit.analysis.runs import TelemetryRun, number
from telemetry_jit.schema import JitEventName, RanksAttr
from telemetry_jit.terminal import counted


@dataclass(frozen=True)
class Spread:
    """A figure over the ranks: its smallest, median and largest value, and which ranks hold the ends."""

    min: float
    min_rank: int
    median: float
    max: float
    max_rank: int

    def as_json(self) -> dict[str, Any]:
        return {name: round(value, 3) for name, value in asdict(self).items()}


def spread(values: dict[int, float]) -> Spread:
    low = min(values, key=lambda rank: (values[rank], rank))
    high = max(values, key=lambda rank: (values[rank], -rank))
    return Spread(values[low], low, statistics.median(values.values()), values[high], high)


@dataclass(frozen=True)
class OutOfStepSaid:
    """One ``ranks_out_of_step`` event: a stall, a graph only some ranks compiled, a silent or unended rank."""

    kind: str
    ranks: tuple[int, ...]
    rank_count: int
    step: int
    seconds: float
    waiting: int
    line: str
    said_by: int

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "ranks": list(self.ranks), "seconds": round(self.seconds, 3)}


def out_of_step_said(run: TelemetryRun) -> list[OutOfStepSaid]:
    """What the watcher on this run's rank said: a stall once (its last word), every other finding as said."""
    said: list[OutOfStepSaid] = []
    for event in run.events(JitEventName.RANKS_OUT_OF_STEP):
        a = event.attributes
        ranks = a.get(RanksAttr.RANKS)
        said.append(
            OutOfStepSaid(
                kind=str(a.get(RanksAttr.KIND, "")),
                ranks=tuple(int(r) for r in ranks) if isinstance(ranks, list) else (),
                rank_count=int(number(a.get(RanksAttr.RANK_COUNT))),
                step=int(number(a.get(RanksAttr.STEP))),
                seconds=float(a.get(RanksAttr.SECONDS) or 0.0),
                waiting=int(number(a.get(RanksAttr.WAITING))),
                line=str(a.get(RanksAttr.LINE, "")),
                said_by=run.rank,
            )
        )
    # the later word on one stall replaces the earlier
    stalls = {(item.ranks, item.step): item for item in said if item.kind in ("stall", "stall_ended")}
    others = [item for item in said if item.kind not in ("stall", "stall_ended", "heard_again")]
    return sorted(stalls.values(), key=lambda item: -item.seconds) + others


@dataclass(frozen=True)
class Skew:
    """How long the first rank to finish one compile (that every rank did) waited for the last."""

    compile_id: str
    frame: str
    wait_ms: float
    last_rank: int

    def as_json(self) -> dict[str, Any]:
        return {
            "compile": self.compile_id,
            "frame": self.frame,
            "wait_s": round(self.wait_ms / 1000, 3),
            "last_rank": self.last_rank,
        }


@dataclass
class Group:
    """Ranks that did the same: ``what`` in words, and how they differ from the largest group."""

    what: str
    ranks: list[int]
    difference: str = ""


@dataclass
class Fleet:
    run_id: str
    ranks: dict[int, RunDigest]  # each rank's, in rank order
    compile_s: Spread
    compilations: Spread
    sequences: list[Group]  # by identical compile sequences, the largest first
    caches: list[Group]  # by compile-cache outcome, the largest first
    skews: list[Skew]  # the compiles every rank did, the longest wait first
    waits_as_last: Counter[int] = field(default_factory=Counter)  # rank -> compiles at which it was last
    out_of_step: list[OutOfStepSaid] = field(default_factory=list)  # what the rank watcher said live

    @property
    def total_skew_ms(self) -> float:
        return sum(skew.wait_ms for skew in self.skews)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ranks": len(self.ranks),
            "compile_s": self.compile_s.as_json(),
            "compilations": self.compilations.as_json(),
            "compiled_alike": [asdict(group) for group in self.sequences],
            "compile_cache": [asdict(group) for group in self.caches],
            "skew_s": round(self.total_skew_ms / 1000, 3),
            "skews": [skew.as_json() for skew in self.skews[:20]],
            "last_at_compiles": {str(rank): times for rank, times in self.waits_as_last.most_common(20)},
            "out_of_step": [item.as_json() for item in self.out_of_step],
        }


def fleet(run_id: str, runs: list[TelemetryRun]) -> Fleet:
    """The fleet of one run from its ranks' runs, in rank order."""
    ranks = {run.rank: digest_of(run) for run in runs}
    skews, last = _skews(ranks)
    return Fleet(
        run_id=run_id,
        ranks=ranks,
        compile_s=spread({rank: digest.compile_ms / 1000 for rank, digest in ranks.items()}),
        compilations=spread({rank: float(digest.compilations) for rank, digest in ranks.items()}),
        sequences=_groups(ranks, lambda digest: tuple(digest.sequence), _sequence_words, _first_difference),
        caches=_groups(ranks, _cache_words, _cache_words, _cache_difference),
        skews=skews,
        waits_as_last=last,
        out_of_step=[item for run in runs for item in out_of_step_said(run)],
    )


def _groups(ranks: dict[int, RunDigest], key: Any, words: Any, difference: Any) -> list[Group]:
    """Ranks alike by ``key``, the largest group first; how each other group differs from it, in words."""
    grouped: dict[Any, list[int]] = defaultdict(list)
    for rank, digest in ranks.items():
        grouped[key(digest)].append(rank)
    groups = [Group(words(ranks[members[0]]), members) for members in grouped.values()]
    groups.sort(key=lambda group: (-len(group.ranks), group.ranks[0]))
    for group in groups[1:]:
        group.difference = difference(ranks, groups[0].ranks[0], group.ranks[0])
    return groups


def _sequence_words(d: RunDigest) -> str:
    by_torch = sum(group.counted_by_torch for group in d.breaks.values()) + d.breaks_not_grouped_by_torch
    breaks = counted(by_torch, "graph break")
    return f"{counted(d.compilations, 'compilation')}, {counted(d.recompiles, 'recompile')}, {breaks}"


def _cache_words(digest: RunDigest) -> str:
    """What the compile cache did on a rank: from its look-ups, else torch's counts (2.8: remote only)."""
    states = Counter(lookup.state for _, lookup in digest.cache_ledger.explained())  # one look-up per graph
    hits, misses = (states["hit"], states["miss"]) if states else (digest.warm_start.hits, digest.warm_start.misses)
    if not (hits or misses):
        return "no compile-cache lookups"
    if not misses:
        return "warm: every graph from the compile cache"
    return "cold: every graph compiled" if not hits else "partly warm"


def _first_difference(ranks: dict[int, RunDigest], reference: int, other: int) -> str:
    """Where ``other``'s compiles first differ from ``reference``'s, in words."""
    mine, theirs = ranks[reference].sequence, ranks[other].sequence
    for index, (ours, its) in enumerate(zip(mine, theirs, strict=False)):
        if ours != its:
            return f"compile {index + 1}: {_compile_words(its)} where the others had {_compile_words(ours)}"
    if len(theirs) > len(mine):
        return f"{len(theirs) - len(mine)} more compiles, from {_compile_words(theirs[len(mine)])}"
    return f"{len(mine) - len(theirs)} fewer compiles, from {_compile_words(mine[len(theirs)])}"


def _compile_words(item: tuple[str, str, str]) -> str:
    compile_id, frame, cause = item
    backward = compile_id.endswith("b")
    return f"{compile_id.rstrip('b')} {frame}" + (" (backward)" if backward else "") + (f" ({cause})" if cause else "")


def _cache_difference(ranks: dict[int, RunDigest], reference: int, other: int) -> str:
    """Why ``other`` missed the compile cache where ``reference`` (of the largest group) did not, in words."""
    cold = explain(ranks[reference].cache_ledger, ranks[other].cache_ledger)
    if not cold.groups:
        return ""
    top = cold.groups[0]
    more = f" (and {len(cold.groups) - 1} other reason(s))" if len(cold.groups) > 1 else ""
    return (
        f"{cold.graphs} graph(s) that rank {reference} had missed here, {cold.seconds:.1f} s: {top.reason}{more}; "
        f"fix: {top.fix}"
    )


def _skews(ranks: dict[int, RunDigest]) -> tuple[list[Skew], Counter[int]]:
    digests = list(ranks.values())
    shared = set.intersection(*(set(digest.ends) for digest in digests)) if ranks else set()
    skews: list[Skew] = []
    last: Counter[int] = Counter()
    for key in shared:
        ends = {rank: digest.ends[key][0] for rank, digest in ranks.items()}
        slowest = max(ends, key=lambda rank: (ends[rank], -rank))
        wait = (ends[slowest] - min(ends.values())) / 1e6
        skews.append(Skew(key[0], digests[0].ends[key][1], wait, slowest))
        if len(ranks) > 1 and wait > 0:
            last[slowest] += 1
    return sorted(skews, key=lambda skew: -skew.wait_ms), last


def fleets(runs: list[TelemetryRun]) -> list[Fleet]:
    """The runs grouped into fleets: the ranks of each run id (one run of each rank: its last)."""
    by_run: dict[str, dict[int, TelemetryRun]] = defaultdict(dict)
    for run in runs:
        by_run[run.run_id][run.rank] = run
    return [
        fleet(run_id, [members[rank] for rank in sorted(members)])
        for run_id, members in by_run.items()
        if len(members) > 1
    ]
