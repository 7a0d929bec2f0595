"""Warnings about compilations while training runs, for what a user must hear of at once."""

from __future__ import annotations

from dataclasses import dataclass

from telemetry_jit.breaks import gist, recompile_owner
from telemetry_jit.causes import CAUSES, normalize_reason
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import Notices
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord
from telemetry_jit.terminal import shown


class EagerFallbackAlert(CompileListener):
    """Warn once per frame that runs eagerly from now on, without compilation: it hit
    ``torch._dynamo.config.recompile_limit``, or compiling it failed and dynamo fell back (``suppress_errors``);
    torch says so only in one log line."""

    def __init__(self) -> None:
        self._notices = Notices()

    def recorded(self, record: CompileRecord) -> None:
        step = record.context.global_step if record.context is not None else 0
        where = shown(record.location) if record.location else "unknown location"  # as the summary writes it
        if record.fell_back_to_eager and not record.recompile_limit_hit:
            self._notices.warn(
                record.frame_id,
                f"telemetry-jit: compiling {record.frame or 'a frame'} ({where}) "
                f"failed at step {step} and it runs eagerly from now on, without compilation: "
                f"{gist(record.failure, 300) or 'torch gave no reason'}. `telemetry-jit check "
                "--no-eager-fallback` fails such a run.",
                origin=record.location,
            )
        if not record.recompile_limit_hit:
            return
        behind = record.cause.behind if record.cause is not None else ""
        if behind in CAUSES:
            stage = record.context.stage if record.context is not None else ""
            fix = CAUSES[behind].fix_for(stage, recompile_owner(record.frame, record.location))
            why = f"its recompiles were mostly: {CAUSES[behind].title}. Fix that: {fix}"
        else:
            why = f"its last recompile: {normalize_reason(record.recompile_reason) or 'unknown'}. Fix what changes"
        limit, value = torch_compat.recompile_limit(record.failure)
        self._notices.warn(
            record.frame_id,
            f"telemetry-jit: {record.frame or 'a frame'} ({where}) hit "
            f"torch._dynamo.config.{limit} ({value}) at step {step} and runs "
            f"eagerly from now on, without compilation; {why} ({CAUSES['recompile_limit'].doc}). Raising the limit "
            "only postpones it.",
            origin=record.location,
        )


@dataclass(frozen=True)
class RankTotals:
    """Every rank's compile count and compile time at the end of a loop, by rank."""

    counts: list[int]
    time_ms: list[float]

    def divergence(self, skew_warning_s: float) -> str | None:
        """What rank zero should say when ranks compiled unalike: a different number of compiles, or compile
        times further apart than ``skew_warning_s`` (``None`` when they did not)."""
        problems = []
        if len(set(self.counts)) > 1:
            problems.append(f"a different number of times ({self.counts}, by rank)")
        seconds = [ms / 1000 for ms in self.time_ms]
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        fastest = min(range(len(seconds)), key=seconds.__getitem__)
        skew = seconds[slowest] - seconds[fastest]
        if skew > skew_warning_s:
            problems.append(
                f"for {skew:.1f} s longer on rank {slowest} ({seconds[slowest]:.1f} s) than on rank {fastest} "
                f"({seconds[fastest]:.1f} s)"
            )
        if not problems:
            return None
        return (
            f"telemetry-jit: ranks compiled {' and '.join(problems)}. Ranks that compile differently wait for "
            "each other at the next collective, and can desynchronise and hang: see `telemetry-jit summary` over "
            "every rank's file (a compile-cache miss on one node, a shape only some ranks see)."
        )
