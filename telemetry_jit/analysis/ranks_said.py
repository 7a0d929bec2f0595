"""What the rank watcher said live in a run (its ``ranks_out_of_step`` events), read back as answers: the
stalls, the graphs only some ranks compiled, the silent ranks, the ranks a failure left behind."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from telemetry_jit.analysis.runs import TelemetryRun, number
from telemetry_jit.schema import JitEventName, RanksAttr


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
