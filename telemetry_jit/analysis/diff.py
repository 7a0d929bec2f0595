"""Two runs side by side (``telemetry-jit diff``): graph breaks compared by identity (place and torch's reason),
not count; recompiles by cause and kind of stage and, per frame, by torch's reason without its compile id."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.cold_start import CacheLedger, ColdStart, explain, without_line
from telemetry_jit.analysis.digest import EXPECTED, ONE_KIND, Fallback, Occasion
from telemetry_jit.analysis.runs import TelemetryRun
from telemetry_jit.analysis.status import RunStatus
from telemetry_jit.analysis.summary import RunSummary, summarize
from telemetry_jit.records import CompiledBefore, NotCompiled, Payoff

BreakKey = tuple[str, str]  # (file:line as tables show it, the first line of torch's reason)


@dataclass
class FrameFigures:
    """One compiled frame of one run."""

    compiles: int = 0
    recompiles: int = 0
    compile_ms: float = 0.0
    reasons: Counter[str] = field(default_factory=Counter)  # torch's recompile reasons, without compile ids

    def as_json(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "compile_s": round(self.compile_ms / 1000, 3),
            "recompile_reasons": dict(self.reasons),
        }


@dataclass
class RunFigures:
    """What a comparison of two runs (and the CI gate) looks at."""

    status: RunStatus
    frame_compiles: int  # frames dynamo compiled: what the code asks for, whatever the caches hold
    backward_graphs: int
    recompiles: int
    compile_ms: float
    wall_ms: float
    share: float | None  # compiling inside the loop over its wall time, 0 - 1
    breaks: Counter[BreakKey]
    user_breaks: Counter[BreakKey]  # breaks in the user's own code
    cache_hits: int
    cache_misses: int
    frames: dict[str, FrameFigures]  # "frame (file:line)" -> figures
    causes: Counter[str]  # recompiles by cause and kind of stage; "<cause> (expected)" apart
    # (frame, step) of each cause's recompiles: the same recompile said under another cause in another run
    cause_occasions: dict[str, set[Occasion]] = field(default_factory=dict)
    payoff: Payoff | None = None
    fallbacks: list[Fallback] = field(default_factory=list)  # frames that run eagerly from a step on
    not_compiled: list[NotCompiled] = field(default_factory=list)  # modules Module.compile() compiled nothing of
    compiled_before: CompiledBefore | None = None  # what the process had compiled when the run began
    cache_ledger: CacheLedger = field(default_factory=CacheLedger)
    last_step: int | None = None  # the loop's last global step, where the run said it
    run: tuple[str, int] = ("", 0)  # run id and rank: which run these are the figures of

    @property
    def compilations(self) -> int:
        return self.frame_compiles + self.backward_graphs

    @property
    def unexpected_recompiles(self) -> int:
        """Recompiles less the expected one-time price (stage switches, shared code, the tuner, ...)."""
        return sum(count for cause, count in self.causes.items() if not cause.endswith(EXPECTED))

    @property
    def cache_hit_rate(self) -> float | None:
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else None

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status.as_json(),
            "frame_compiles": self.frame_compiles,
            "backward_graphs": self.backward_graphs,
            "recompiles": self.recompiles,
            "compile_s": round(self.compile_ms / 1000, 3),
            "wall_s": round(self.wall_ms / 1000, 3),
            "compile_share_of_loop": round(self.share, 4) if self.share is not None else None,
            "graph_breaks": sum(self.breaks.values()),
            "cache_lookups": self.cache_hits + self.cache_misses,
            "cache_hits": self.cache_hits,
            "cache_hit_rate": self.cache_hit_rate,
            "unexpected_recompiles": self.unexpected_recompiles,
            "compiled_before_run": self.compiled_before.as_json() if self.compiled_before is not None else None,
            "recompile_causes": dict(self.causes),
        }


def cause_words(cause: str) -> str:
    """A cause as diff and check key it, with the kind of stage beside it where the key leaves it out:
    ``last_batch`` (training's) is said ``last_batch in train``, beside ``last_batch in eval``."""
    name = cause.removesuffix(EXPECTED)
    if " in " in name or name in ONE_KIND:
        return cause
    return f"{name} in train{EXPECTED if cause.endswith(EXPECTED) else ''}"


def _only_in(fallbacks: list[Fallback], others: list[Fallback]) -> list[Fallback]:
    elsewhere = {without_line(other.frame) for other in others}
    return [fallback for fallback in fallbacks if without_line(fallback.frame) not in elsewhere]


def run_figures(summary: RunSummary) -> RunFigures:
    d = summary.digest
    frames = {
        row.label: FrameFigures(row.compiles, row.recompiles, row.compile_ms, Counter(row.reasons))
        for row in d.frames.values()
    }
    return RunFigures(
        status=summary.status,
        frame_compiles=d.frame_compiles,
        backward_graphs=d.backward_graphs,
        recompiles=d.recompiles,
        compile_ms=d.compile_ms,
        wall_ms=summary.wall_ms,
        share=summary.share,
        breaks=Counter(d.break_keys),
        user_breaks=Counter(d.user_break_keys),
        cache_hits=d.warm_start.hits,
        cache_misses=d.warm_start.misses,
        frames=frames,
        causes=d.causes_by_name(),
        cause_occasions=d.occasions_by_name(),
        payoff=summary.payoff,
        fallbacks=list(summary.fallbacks),
        not_compiled=list(summary.not_compiled),
        compiled_before=summary.compiled_before,
        cache_ledger=d.cache_ledger,
        last_step=summary.last_step,
        run=(summary.run.run_id, summary.run.rank),
    )


@dataclass
class RunDiff:
    base: RunFigures
    new: RunFigures

    def statuses(self) -> list[tuple[str, RunStatus]]:
        return [("base", self.base.status), ("new", self.new.status)]

    def compiled_before(self) -> list[tuple[str, CompiledBefore]]:
        """Each side that began in a process holding compiled code: its missing compiles prove nothing."""
        return [(side, f.compiled_before) for side, f in (("base", self.base), ("new", self.new)) if f.compiled_before]

    @property
    def new_graph_breaks(self) -> dict[BreakKey, int]:
        """Breaks only the new run has (by place and reason), with how often it met each."""
        return {key: count for key, count in sorted(self.new.breaks.items()) if key not in self.base.breaks}

    @property
    def fixed_graph_breaks(self) -> dict[BreakKey, int]:
        """Breaks only the base run had."""
        return {key: count for key, count in sorted(self.base.breaks.items()) if key not in self.new.breaks}

    @property
    def new_fallbacks(self) -> list[Fallback]:
        """Frames that run eagerly in the new run only (a frame by its name and file: a fix moves its lines)."""
        return _only_in(self.new.fallbacks, self.base.fallbacks)

    @property
    def fixed_fallbacks(self) -> list[Fallback]:
        """Frames that ran eagerly in the base run and no longer do."""
        return _only_in(self.base.fallbacks, self.new.fallbacks)

    @property
    def new_not_compiled(self) -> list[NotCompiled]:
        """Modules compiled to no effect in the new run only (by name and class)."""
        return [found for found in self.new.not_compiled if found not in self.base.not_compiled]

    @property
    def fixed_not_compiled(self) -> list[NotCompiled]:
        """Modules compiled to no effect in the base run that the new run compiles (or no longer asks to)."""
        return [found for found in self.base.not_compiled if found not in self.new.not_compiled]

    @property
    def renamed_causes(self) -> dict[tuple[str, str], int]:
        """``(base cause, new cause) -> recompiles``: a base-only cause whose recompiles (same frame, stage, step and
        batch) the new run still meets under another name (a size mismatch become a dynamic-size guard): not fixed."""
        renamed = {}
        for cause, occasions in sorted(self.base.cause_occasions.items()):
            if cause in self.new.causes:
                continue
            for other, met in sorted(self.new.cause_occasions.items()):
                # a recompile left only as the expected price (the first switch to evaluation's grad mode, which the
                # base run's recompile at that batch paid as well) is no recompile that remains to be fixed
                if other != cause and not other.endswith(EXPECTED) and occasions & met:
                    renamed[(cause, other)] = len(occasions & met)
        return renamed

    @property
    def new_causes(self) -> dict[str, int]:
        """Recompile causes only the new run has, less the recompiles the base run met under another cause."""
        return self._causes_only_in(self.new, self.base, side=1)

    @property
    def fixed_causes(self) -> dict[str, int]:
        """Recompile causes only the base run had, less the recompiles the new run still meets under another."""
        return self._causes_only_in(self.base, self.new, side=0)

    def _causes_only_in(self, run: RunFigures, other: RunFigures, side: int) -> dict[str, int]:
        """``run``'s causes that ``other`` lacks, less those renamed (``side``: ``run``'s place in the pairs)."""
        renamed = Counter[str]()
        for pair, count in self.renamed_causes.items():
            renamed[pair[side]] += count
        counts = ((cause, n - renamed[cause]) for cause, n in sorted(run.causes.items()))
        return {cause: n for cause, n in counts if cause not in other.causes and n > 0}

    @property
    def changed_causes(self) -> dict[str, tuple[int, int]]:
        """Causes both runs have, in different numbers: ``cause -> (base, new)``."""
        base, new = self.base.causes, self.new.causes
        return {
            cause: (base[cause], new[cause]) for cause in sorted(base.keys() & new.keys()) if base[cause] != new[cause]
        }

    @property
    def cache_effect(self) -> bool:
        """The runs differ only in the graphs the compile caches served: not a code change."""
        base, new = self.base, self.new
        return (
            base.compilations != new.compilations
            and base.cache_hits != new.cache_hits
            and base.frame_compiles == new.frame_compiles
            and base.causes == new.causes
            and base.breaks.keys() == new.breaks.keys()
        )

    @property
    def caches_differ(self) -> bool:
        """The caches' hit rates are a quarter or more apart and the code changed too."""
        base, new = self.base.cache_hit_rate, self.new.cache_hit_rate
        return base is not None and new is not None and abs(base - new) >= 0.25 and not self.cache_effect

    @property
    def cold_start(self) -> ColdStart:
        """Why the new run missed graphs the base run had (nothing, for a run compared with itself)."""
        if self.base.run == self.new.run:
            return ColdStart([], bool(self.base.cache_ledger.lookups), bool(self.new.cache_ledger.lookups))
        return explain(self.base.cache_ledger, self.new.cache_ledger)

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
            "new_eager_fallbacks": [fallback.as_json() for fallback in self.new_fallbacks],
            "fixed_eager_fallbacks": [fallback.as_json() for fallback in self.fixed_fallbacks],
            "new_not_compiled": [found.module for found in self.new_not_compiled],
            "fixed_not_compiled": [found.module for found in self.fixed_not_compiled],
            "new_recompile_causes": self.new_causes,
            "fixed_recompile_causes": self.fixed_causes,
            "renamed_recompile_causes": [
                {"base": cause, "new": other, "count": count} for (cause, other), count in self.renamed_causes.items()
            ],
            "changed_recompile_causes": {cause: {"base": b, "new": n} for cause, (b, n) in self.changed_causes.items()},
            "frames": [
                {
                    "frame": frame,
                    "base": b.as_json(),
                    "new": n.as_json(),
                    "new_recompile_reasons": sorted(n.reasons.keys() - b.reasons.keys()),
                    "gone_recompile_reasons": sorted(b.reasons.keys() - n.reasons.keys()),
                }
                for frame, b, n in self.frames()
            ],
            "cache_effect_only": self.cache_effect,
            "caches_differ": self.caches_differ,
            "cache_misses_explained": self.cold_start.as_json(),
            "payoff": {
                "base": self.base.payoff.attributes() if self.base.payoff is not None else None,
                "new": self.new.payoff.attributes() if self.new.payoff is not None else None,
            },
        }


def _breaks_json(breaks: dict[BreakKey, int]) -> list[dict[str, Any]]:
    return [{"location": loc, "reason": reason, "count": n} for (loc, reason), n in breaks.items()]


def diff(base: TelemetryRun, new: TelemetryRun) -> RunDiff:
    return RunDiff(run_figures(summarize(base)), run_figures(summarize(new)))
