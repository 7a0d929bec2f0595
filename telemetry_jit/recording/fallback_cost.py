"""What a frame that falls back to eager (its recompile limit hit, or its compile failed under
``suppress_errors``) costs: the median training batch after the fallback against the median before it, while the
frame ran compiled, with a 95% interval of the difference (distribution-free: batch times are skewed by the
odd stall, and a few batches say little). A batch is timed from its start to the next training batch's (what the
user waits for); batches that compiled, that another stage (validation) follows, or that a payoff measurement ran
eagerly are not timed."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord, FallbackCost

TIMED_STAGE = "train"
MAX_SAMPLES = 64  # batches kept on each side of a fallback: the newest before it, the first after it
LEAST_SAMPLES = 3  # a median of fewer batches says too little
MAX_FALLBACKS = 20
Z_95 = 1.959964  # the standard normal's 97.5th percentile: a two-sided 95% interval


@dataclass
class _Span:
    """The batches between one fallback and the next (the first: from the loop's start)."""

    frame: str = ""
    location: str = ""
    step: int = -1  # -1: the loop's start, no fallback
    first_batch: int = 0  # the meter's count of training batches when it opened
    # its timed batches, ns: the newest (the compiled side of the next fallback) and the first (its own eager side)
    last_timed: deque[int] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    first_timed: list[int] = field(default_factory=list)


class FallbackCostMeter(CompileListener):
    """Times training batches and says, per fallback, what running the frame eagerly costs."""

    def __init__(self) -> None:
        self._spans: list[_Span] = [_Span()]
        self._frames: set[str] = set()
        # what every training batch updates, held here: a step touches this object and one deque
        self._timed = self._spans[0].last_timed  # the newest span's
        self._eager_side: list[int] | None = None  # the newest fallback's first timed batches, until it has enough
        self._started_ns: int | None = None  # when the training batch running now started (None: it is not timed)
        self._started_step = -1  # its global step
        self._eager_step = -1  # the step a payoff measurement runs eagerly
        self._batches = 0  # training batches so far

    def recorded(self, record: CompileRecord) -> None:
        self._started_ns = None  # the batch running now compiled: not timed
        fell_back = record.fell_back_to_eager or record.recompile_limit_hit
        if not fell_back or record.frame_id in self._frames or len(self._spans) > MAX_FALLBACKS:
            return
        self._frames.add(record.frame_id)
        context = record.context
        step = context.global_step if context is not None else 0
        # a fallback in a training batch runs eagerly from that batch on; one elsewhere (fit's validation, a
        # Trainer.validate() after fit, between loops) from the next training batch: the last one ran compiled
        in_training = context is None or context.stage == TIMED_STAGE
        span = _Span(record.frame, record.location, step, first_batch=self._batches - in_training)
        self._spans.append(span)
        self._timed, self._eager_side = span.last_timed, span.first_timed

    def running_eagerly(self, global_step: int) -> None:
        """A payoff measurement runs ``global_step`` eagerly on purpose: not a batch of either side."""
        self._eager_step = global_step
        if global_step == self._started_step:
            self._started_ns = None

    def batch_started(self, stage: str, global_step: int, now_ns: int) -> None:
        """A batch of ``stage`` begins: the training batch before it ends."""
        if stage != TIMED_STAGE:  # the training batch before it ran into this stage's start: not timed
            self._started_ns = None
            return
        # every training step goes through here: no calls, one allocation (the sample), only this object's state
        if (started := self._started_ns) is not None:
            self._timed.append(now_ns - started)
            if (eager := self._eager_side) is not None:
                eager.append(now_ns - started)
                if len(eager) == MAX_SAMPLES:
                    self._eager_side = None
        self._started_ns = now_ns if global_step != self._eager_step else None
        self._started_step = global_step
        self._batches += 1

    def loop_ended(self) -> None:
        self._started_ns = None

    def costs(self) -> list[FallbackCost]:
        """Each fallback's cost so far: the batches after it against the compiled batches before it."""
        spans = self._spans  # the first: before any fallback
        # a frame that fell back runs eagerly to the loop's end, past any later fallback of another frame
        return [
            _cost(before.last_timed, span, batches_since=self._batches - span.first_batch)
            for before, span in zip(spans[:-1], spans[1:], strict=True)
        ]


def _cost(compiled: deque[int], span: _Span, batches_since: int) -> FallbackCost:
    eager = span.first_timed
    base = FallbackCost(span.frame, span.location, span.step, batches_since=batches_since)
    if len(compiled) < LEAST_SAMPLES:
        why = f"{len(compiled)} training batch(es) ran with it compiled, and nothing compiling, before it fell back"
    elif len(eager) < LEAST_SAMPLES:
        why = f"{len(eager)} training batch(es) ran after it, with nothing compiling"
    else:
        interval = shift_interval(eager, compiled)
        return replace(
            base,
            compiled_batch_ms=statistics.median(compiled) / 1e6,
            eager_batch_ms=statistics.median(eager) / 1e6,
            compiled_batches=len(compiled),
            eager_batches=len(eager),
            extra_low_ms=interval[0] / 1e6 if interval is not None else None,
            extra_high_ms=interval[1] / 1e6 if interval is not None else None,
        )
    return replace(base, not_measured=f"{why}; a measurement needs {LEAST_SAMPLES}")


def shift_interval(after: Sequence[int], before: Sequence[int]) -> tuple[float, float] | None:
    """A 95% interval of how much longer a batch ``after`` takes than one ``before`` (the Hodges-Lehmann shift's,
    from the Mann-Whitney test: the ``k``-th smallest and largest of every pairwise difference); ``None`` where
    there are too few batches for one (3 and 3: every ordering is likelier than 5%)."""
    n, m = len(after), len(before)
    k = round(n * m / 2 - Z_95 * math.sqrt(n * m * (n + m + 1) / 12))
    if k < 1:
        return None
    differences = sorted(a - b for a in after for b in before)  # 64 x 64 at most, once per fallback at a loop's end
    return float(differences[k - 1]), float(differences[-k])
