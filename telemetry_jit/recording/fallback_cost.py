"""What a frame that falls back to eager costs, from the training batches around the fallback.

A frame that hits torch's recompile limit, or whose compile fails under ``suppress_errors``, runs its
original Python from then on. Each training batch that compiled nothing is timed (from its start to the
next training batch's, what the user waits for) and kept with the fallback it came after: the median batch
before a fallback, while the frame ran compiled, against the median batch after it is that fallback's cost
per batch. Batches that compiled, batches followed by another stage (validation) and batches a payoff
measurement ran eagerly are not timed.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import pairwise

from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord, FallbackCost

TIMED_STAGE = "train"
MAX_SAMPLES = 64  # batches kept on each side of a fallback: the newest before it, the first after it
LEAST_SAMPLES = 3  # a median of fewer batches says too little
MAX_FALLBACKS = 20


@dataclass
class _Span:
    """The batches between one fallback and the next (the first: from the loop's start)."""

    frame: str = ""
    location: str = ""
    step: int = -1  # -1: the loop's start, no fallback
    # its timed batches, ms: the newest (the compiled side of the next fallback) and the first (its own eager side)
    last_timed: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    first_timed: list[float] = field(default_factory=list)
    batches: int = 0  # training batches since the fallback, timed or not


class FallbackCostMeter(CompileListener):
    """Times training batches and says, per fallback, what running the frame eagerly costs.

    Example::

        meter = FallbackCostMeter()
        meter.batch_started("train", global_step=0, now_ns=time.perf_counter_ns())
        meter.recorded(record)              # a compilation; one that fell back opens a new span of batches
        ...
        meter.costs()                       # one FallbackCost per frame that fell back
    """

    def __init__(self) -> None:
        self._spans: list[_Span] = [_Span()]
        self._frames: set[str] = set()
        self._started_ns: int | None = None  # when the training batch running now started (None: none is timed)
        self._started_step = -1  # its global step
        self._compiled = False  # something compiled since that batch started
        self._eager_steps: deque[int] = deque(maxlen=8)  # steps a payoff measurement runs eagerly

    def recorded(self, record: CompileRecord) -> None:
        self._compiled = True
        fell_back = record.fell_back_to_eager or record.recompile_limit_hit
        if not fell_back or record.frame_id in self._frames or len(self._spans) > MAX_FALLBACKS:
            return
        self._frames.add(record.frame_id)
        step = record.context.global_step if record.context is not None else 0
        self._spans.append(_Span(record.frame, record.location, step, batches=1))

    def running_eagerly(self, global_step: int) -> None:
        """A payoff measurement runs ``global_step`` eagerly on purpose: not a batch of either side."""
        self._eager_steps.append(global_step)

    def batch_started(self, stage: str, global_step: int, now_ns: int) -> None:
        """A batch of ``stage`` begins: the training batch before it ends."""
        if stage != TIMED_STAGE:  # the training batch before it ran into this stage's start: not timed
            self._started_ns, self._compiled = None, False
            return
        span = self._spans[-1]
        # every step goes through here: no calls, no allocations but the sample's
        if self._started_ns is not None and not self._compiled and self._started_step not in self._eager_steps:
            ms = (now_ns - self._started_ns) / 1e6
            span.last_timed.append(ms)
            if span.step >= 0 and len(span.first_timed) < MAX_SAMPLES:  # a fallback's eager side
                span.first_timed.append(ms)
        self._compiled = False
        self._started_ns, self._started_step = now_ns, global_step
        span.batches += 1

    def loop_ended(self) -> None:
        self._started_ns = None

    def costs(self) -> list[FallbackCost]:
        """Each fallback's cost so far: the batches after it against the compiled batches before it."""
        return [_cost(before.last_timed, span) for before, span in pairwise(self._spans)]


def _cost(compiled: deque[float], span: _Span) -> FallbackCost:
    eager = span.first_timed
    base = FallbackCost(span.frame, span.location, span.step, batches_since=span.batches)
    if len(compiled) < LEAST_SAMPLES:
        why = f"{len(compiled)} training batch(es) ran with it compiled, and nothing compiling, before it fell back"
    elif len(eager) < LEAST_SAMPLES:
        why = f"{len(eager)} training batch(es) ran after it, with nothing compiling"
    else:
        return replace(
            base,
            compiled_batch_ms=statistics.median(compiled),
            eager_batch_ms=statistics.median(eager),
            compiled_batches=len(compiled),
            eager_batches=len(eager),
        )
    return replace(base, not_measured=f"{why}; a measurement needs {LEAST_SAMPLES}")
