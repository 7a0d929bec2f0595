"""Two runs side by side (``telemetry-jit diff``): graph breaks compared by identity (place and torch's reason),
not count; recompiles by cause and kind of stage and, per frame, by torch's reason without its compile id."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.cold_start import ColdStart, explain, option_changed, without_line
from telemetry_jit.analysis.digest import EXPECTED, ONE_KIND, Fallback, FrameRow
from telemetry_jit.analysis.runs import TelemetryRun
from telemetry_jit.analysis.summary import RunSummary, summarize
from telemetry_jit.records import NotCompiled

BreakKey = tuple[str, str]  # (file:line as tables show it, the first line of torch's reason)


def _frame_json(row: FrameRow) -> dict[str, Any]:
    return {
        "compiles": row.compiles,
        "recompiles": row.recompiles,
        "compile_s": round(row.compile_ms / 1000, 3),
        "recompile_reasons": dict(row.reasons),
    }


def _figures_json(s: RunSummary) -> dict[str, Any]:
    """One side of a comparison, for tools."""
    d = s.digest
    return {
        "status": s.status.as_json(),
        "frame_compiles": d.frame_compiles,
        "backward_graphs": d.backward_graphs,
        "recompiles": d.recompiles,
        "compile_s": round(d.compile_ms / 1000, 3),
        "wall_s": round(s.wall_ms / 1000, 3),
        "compile_share_of_loop": round(s.share, 4) if s.share is not None else None,
        "graph_breaks": d.break_count,
        "cache_lookups": d.warm_start.lookups,
        "cache_hits": d.warm_start.hits,
        "cache_hit_rate": d.warm_start.hit_rate,
        "unexpected_recompiles": d.unexpected_recompiles,
        "compiled_before_run": s.compiled_before.as_json() if s.compiled_before is not None else None,
        "recompile_causes": dict(d.causes_by_name()),
    }


def cause_words(cause: str) -> str:
    """A cause as diff and check key it, with the kind of stage beside it where the key leaves it out:
    ``last_batch`` (training's) is said ``last_batch in train``, beside ``last_batch in eval``."""
    name = cause.removesuffix(EXPECTED)
    if " in " in name or name in ONE_KIND:
        return cause
    return f"{name} in train{EXPECTED if cause.endswith(EXPECTED) else ''}"


@dataclass(frozen=True)
class OnlyIn:
    """What one run has and the other lacks."""

    graph_breaks: dict[BreakKey, int]  # by place and reason, with how often it met each
    fallbacks: list[Fallback]  # frames that run eagerly, by name and file: a fix moves its lines
    not_compiled: list[NotCompiled]  # modules compiled to no effect, by name and class
    causes: dict[str, int]  # recompile causes, less the recompiles the other run met under another cause


def _only_in(run: RunSummary, other: RunSummary, renamed: Counter[str]) -> OnlyIn:
    """What ``run`` has that ``other`` lacks (``renamed``: ``run``'s recompiles ``other`` met under another cause)."""
    elsewhere = {without_line(fallback.frame) for fallback in other.fallbacks}
    causes, other_causes = run.digest.causes_by_name(), other.digest.causes_by_name()
    return OnlyIn(
        {key: n for key, n in sorted(run.digest.break_keys.items()) if key not in other.digest.break_keys},
        [fallback for fallback in run.fallbacks if without_line(fallback.frame) not in elsewhere],
        [found for found in run.not_compiled if found not in other.not_compiled],
        {
            cause: n - renamed[cause]
            for cause, n in sorted(causes.items())
            if cause not in other_causes and n > renamed[cause]
        },
    )


@dataclass
class RunDiff:
    base: RunSummary
    new: RunSummary
    # (base cause, new cause) -> recompiles: a base-only cause whose recompiles (same frame, stage, step and batch)
    # the new run still meets under another name (a size mismatch become a dynamic-size guard): not fixed
    renamed_causes: dict[tuple[str, str], int] = field(init=False)
    new_only: OnlyIn = field(init=False)
    base_only: OnlyIn = field(init=False)

    def __post_init__(self) -> None:
        self.renamed_causes = {}
        new_causes = self.new.digest.causes_by_name()
        # one new recompile stands for one base recompile: a batch where the base run recompiled under two causes
        # (a last batch, then the recompile limit) and the new run once is one renamed recompile, not two
        unmatched = {other: set(met) for other, met in self.new.digest.occasions_by_name().items()}
        base = self.base.digest.occasions_by_name()
        # the refused attempt at the recompile limit compiled nothing: the recompiles that did are matched first
        for cause in sorted(base, key=lambda name: (name.startswith("recompile_limit"), name)):
            if cause in new_causes:
                continue
            left = set(base[cause])
            for other, met in sorted(unmatched.items()):
                # a recompile left only as the expected price (the first switch to evaluation's grad mode, which the
                # base run's recompile at that batch paid as well) is no recompile that remains to be fixed
                shared = left & met
                if other != cause and not other.endswith(EXPECTED) and shared:
                    self.renamed_causes[(cause, other)] = len(shared)
                    met -= shared
                    left -= shared
        renamed_base, renamed_new = Counter[str](), Counter[str]()
        for (cause, other), count in self.renamed_causes.items():
            renamed_base[cause] += count
            renamed_new[other] += count
        self.new_only = _only_in(self.new, self.base, renamed_new)
        self.base_only = _only_in(self.base, self.new, renamed_base)

    @property
    def changed_causes(self) -> dict[str, tuple[int, int]]:
        """Causes both runs have, in different numbers: ``cause -> (base, new)``."""
        base, new = self.base.digest.causes_by_name(), self.new.digest.causes_by_name()
        return {
            cause: (base[cause], new[cause]) for cause in sorted(base.keys() & new.keys()) if base[cause] != new[cause]
        }

    @property
    def cache_effect(self) -> bool:
        """The runs differ only in the graphs the compile caches served: not a code change."""
        base, new = self.base.digest, self.new.digest
        return (
            base.backward_graphs != new.backward_graphs
            and base.warm_start.hits != new.warm_start.hits
            and base.frame_compiles == new.frame_compiles
            and base.causes_by_name() == new.causes_by_name()
            and base.break_keys.keys() == new.break_keys.keys()
        )

    @property
    def caches_differ(self) -> bool:
        """The caches' hit rates are a quarter or more apart and the code changed too."""
        base, new = self.base.digest.warm_start.hit_rate, self.new.digest.warm_start.hit_rate
        return base is not None and new is not None and abs(base - new) >= 0.25 and not self.cache_effect

    @property
    def cold_start(self) -> ColdStart:
        """Why the new run missed graphs the base run had (nothing, for a run compared with itself)."""
        base, new = self.base.digest.cache_ledger, self.new.digest.cache_ledger
        if (self.base.run.run_id, self.base.run.rank) == (self.new.run.run_id, self.new.run.rank):
            return ColdStart([], bool(base.lookups), bool(new.lookups))
        cold = explain(base, new)
        changed = self.changed_options
        if changed:
            option_changed(cold.groups, changed)
        return cold

    @property
    def changed_options(self) -> list[str]:
        """The torch.compile options (dynamic, mode, fullgraph) the runs compiled with that differ: ``dynamic:
        false -> true``."""
        base, new = self.base.digest.compile_options, self.new.digest.compile_options
        return [
            f"{name.removeprefix('compile.')}: {', '.join(sorted(base.get(name, ()))) or '?'} -> "
            f"{', '.join(sorted(new.get(name, ()))) or '?'}"
            for name in sorted(base.keys() | new.keys())
            if base.get(name, set()) != new.get(name, set())
        ]

    def frames(self) -> list[tuple[str, FrameRow, FrameRow]]:
        """``(frame, base row, new row)`` for every frame either run compiled, those past the rows kept as one."""
        base, new = ({row.label: row for row in s.digest.frame_rows()} for s in (self.base, self.new))
        return [
            (frame, base.get(frame, FrameRow("", "")), new.get(frame, FrameRow("", "")))
            for frame in sorted(base.keys() | new.keys())
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "base": _figures_json(self.base),
            "new": _figures_json(self.new),
            "new_graph_breaks": _breaks_json(self.new_only.graph_breaks),
            "fixed_graph_breaks": _breaks_json(self.base_only.graph_breaks),
            "new_eager_fallbacks": [fallback.as_json() for fallback in self.new_only.fallbacks],
            "fixed_eager_fallbacks": [fallback.as_json() for fallback in self.base_only.fallbacks],
            "new_not_compiled": [found.module for found in self.new_only.not_compiled],
            "fixed_not_compiled": [found.module for found in self.base_only.not_compiled],
            "new_recompile_causes": self.new_only.causes,
            "fixed_recompile_causes": self.base_only.causes,
            "renamed_recompile_causes": [
                {"base": cause, "new": other, "count": count} for (cause, other), count in self.renamed_causes.items()
            ],
            "changed_recompile_causes": {cause: {"base": b, "new": n} for cause, (b, n) in self.changed_causes.items()},
            "frames": [
                {
                    "frame": frame,
                    "base": _frame_json(b),
                    "new": _frame_json(n),
                    "new_recompile_reasons": sorted(n.reasons.keys() - b.reasons.keys()),
                    "gone_recompile_reasons": sorted(b.reasons.keys() - n.reasons.keys()),
                }
                for frame, b, n in self.frames()
            ],
            "changed_compile_options": self.changed_options,
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
    return RunDiff(summarize(base), summarize(new))
