"""Two runs side by side (``telemetry-jit diff``): graph breaks compared by identity (place and torch's reason),
not count; recompiles by cause and kind of stage and, per frame, by torch's reason without its compile id."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from telemetry_jit.analysis.cold_start import ColdStart, explain, without_line
from telemetry_jit.analysis.digest import EXPECTED, ONE_KIND, Fallback, FrameRow
from telemetry_jit.analysis.runs import TelemetryRun
from telemetry_jit.analysis.status import RunStatus
from telemetry_jit.analysis.summary import RunSummary, summarize
from telemetry_jit.records import CompiledBefore, NotCompiled

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


def _frames(s: RunSummary) -> dict[str, FrameRow]:
    """The run's compiled frames by ``"frame (file:line)"``."""
    return {row.label: row for row in s.digest.frames.values()}


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


@dataclass
class RunDiff:
    base: RunSummary
    new: RunSummary

    def statuses(self) -> list[tuple[str, RunStatus]]:
        return [("base", self.base.status), ("new", self.new.status)]

    def compiled_before(self) -> list[tuple[str, CompiledBefore]]:
        """Each side that began in a process holding compiled code: its missing compiles prove nothing."""
        return [(side, f.compiled_before) for side, f in (("base", self.base), ("new", self.new)) if f.compiled_before]

    @property
    def new_graph_breaks(self) -> dict[BreakKey, int]:
        """Breaks only the new run has (by place and reason), with how often it met each."""
        return {
            key: count
            for key, count in sorted(self.new.digest.break_keys.items())
            if key not in self.base.digest.break_keys
        }

    @property
    def fixed_graph_breaks(self) -> dict[BreakKey, int]:
        """Breaks only the base run had."""
        return {
            key: count
            for key, count in sorted(self.base.digest.break_keys.items())
            if key not in self.new.digest.break_keys
        }

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
        new_causes = self.new.digest.causes_by_name()
        for cause, occasions in sorted(self.base.digest.occasions_by_name().items()):
            if cause in new_causes:
                continue
            for other, met in sorted(self.new.digest.occasions_by_name().items()):
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

    def _causes_only_in(self, run: RunSummary, other: RunSummary, side: int) -> dict[str, int]:
        """``run``'s causes that ``other`` lacks, less those renamed (``side``: ``run``'s place in the pairs)."""
        renamed = Counter[str]()
        for pair, count in self.renamed_causes.items():
            renamed[pair[side]] += count
        counts = ((cause, n - renamed[cause]) for cause, n in sorted(run.digest.causes_by_name().items()))
        return {cause: n for cause, n in counts if cause not in other.digest.causes_by_name() and n > 0}

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
            base.frame_compiles + base.backward_graphs != new.frame_compiles + new.backward_graphs
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
        return explain(base, new)

    def frames(self) -> list[tuple[str, FrameRow, FrameRow]]:
        """``(frame, base row, new row)`` for every frame either run compiled."""
        base, new = _frames(self.base), _frames(self.new)
        return [
            (frame, base.get(frame, FrameRow("", "")), new.get(frame, FrameRow("", "")))
            for frame in sorted(base.keys() | new.keys())
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "base": _figures_json(self.base),
            "new": _figures_json(self.new),
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
                    "base": _frame_json(b),
                    "new": _frame_json(n),
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
    return RunDiff(summarize(base), summarize(new))
