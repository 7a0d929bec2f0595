"""Is compiling worth it? Compiled and eager steps of the same model timed in the same run.

Once compiling has settled (no compilation for ``settle_steps`` training steps), blocks of steps run
as compiled and blocks run eagerly (``torch.compiler.set_stance("force_eager")``: the original
Python code, no compiling), in the order compiled, eager, eager, compiled, ... so that a drift in the
machine's speed cancels out; each mode's step time is the median of its steps, the first of each
block left out. A compilation during
the measurement voids it, and it starts again once compiling has settled anew.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.recording.recorder import CompileRecorder
from telemetry_jit.records import Payoff, why_slower
from telemetry_jit.schema import JitEventName

_STANCE = call_site("torch.set_stance", "torch.compiler.set_stance (running a payoff block eagerly)")


@dataclass(frozen=True)
class PayoffSettings:
    """How the payoff is measured.

    Args:
        settle_steps: training steps without a compilation before measuring starts.
        block_steps: steps in one block; its first step, paying for the switch of mode, is not counted.
        blocks: blocks of each mode (compiled, eager); ``blocks * block_steps`` steps run eagerly.
    """

    settle_steps: int = 10
    block_steps: int = 5
    blocks: int = 4

    def __post_init__(self) -> None:
        for name, least in (("settle_steps", 1), ("block_steps", 2), ("blocks", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"PayoffSettings({name}={value!r}): a whole number >= {least}.")


@dataclass
class _Block:
    eager: bool
    seconds: list[float] = field(default_factory=list)  # each step's
    peak_mb: float | None = None


@dataclass
class PayoffMeter:
    """Decides, step by step, whether a training step runs compiled or eagerly, and times both.

    ``compilations()`` tells how many compilations happened so far (any change voids a measurement in
    progress); ``on_cuda`` times with synchronisation and records each mode's peak memory.
    """

    settings: PayoffSettings
    compilations: Callable[[], int]
    on_cuda: bool = False
    result: Payoff | None = None
    _quiet_since: int | None = None  # the step since which nothing compiled
    _seen: int = -1
    _blocks: list[_Block] = field(default_factory=list)
    _started_at_step: int = 0
    _last_step: int = -1
    _running: tuple[_Block, contextlib.AbstractContextManager[object] | None, float] | None = None

    @property
    def steps_needed(self) -> int:
        """Steps without a compilation that a measurement takes: settling, then every block."""
        return self.settings.settle_steps + 2 * self.settings.blocks * self.settings.block_steps

    def why_not(self) -> str:
        """Why there is no result, in words, with what would give one."""
        settings = self.settings
        if self.compilations() == 0:
            return "nothing compiled in this loop, so there is nothing to compare"
        quiet = max(self._last_step - self._quiet_since + 1, 0) if self._quiet_since is not None else 0
        return (
            f"the loop ended {quiet} step(s) after its last compilation, and a measurement needs "
            f"{self.steps_needed} steps without one ({settings.settle_steps} to settle, then {2 * settings.blocks} "
            f"blocks of {settings.block_steps}): train {self.steps_needed - quiet} more steps, or ask for fewer "
            "with PayoffSettings(settle_steps=..., blocks=..., block_steps=...)"
        )

    def step_started(self, global_step: int) -> None:
        """A training step begins: timed, and eager, when the schedule says so."""
        self.abandon()  # a step that never ended (it raised) is not timed
        self._last_step = global_step
        block = self._block_for(global_step)
        if block is None:
            return
        stance = _STANCE.call(_force_eager) if block.eager else None
        if stance is FAILED:
            self._blocks = []  # it did not run eagerly: start over (the failure is said once)
            return
        self._synchronize()
        self._running = (block, stance, time.perf_counter())

    @property
    def running_eagerly(self) -> bool:
        """The step running now runs eagerly, for the measurement."""
        return self._running is not None and self._running[1] is not None

    def step_ended(self) -> None:
        """The step ends: its time goes to its block, and eager running stops."""
        if self._running is None:
            return
        block, stance, started = self._running
        self._running = None
        self._synchronize()
        block.seconds.append(time.perf_counter() - started)
        if stance is not None:
            _leave_eager(stance)
        if self.on_cuda:
            block.peak_mb = max(block.peak_mb or 0.0, torch.cuda.max_memory_allocated() / 2**20)
        if len(block.seconds) == self.settings.block_steps and len(self._blocks) == 2 * self.settings.blocks:
            self._finish()

    def abandon(self) -> None:
        """Stop running eagerly now, untimed (the step raised)."""
        if self._running is not None and self._running[1] is not None:
            _leave_eager(self._running[1])
        self._running = None

    def _block_for(self, global_step: int) -> _Block | None:
        if self.result is not None:
            return None
        count = self.compilations()
        if count != self._seen:  # something compiled: wait until compiling settles (again)
            self._seen, self._quiet_since, self._blocks = count, global_step, []
            return None
        if self._quiet_since is None or count == 0:
            return None
        if not self._blocks:
            if global_step - self._quiet_since < self.settings.settle_steps:
                return None
            self._started_at_step = global_step
        if not self._blocks or len(self._blocks[-1].seconds) == self.settings.block_steps:
            index = len(self._blocks)
            self._blocks.append(_Block(eager=index % 4 in (1, 2)))  # compiled, eager, eager, compiled, ...
            if self.on_cuda:
                torch.cuda.reset_peak_memory_stats()
        return self._blocks[-1]

    def _finish(self) -> None:
        def per_step_ms(eager: bool) -> float:
            # each block's first step pays for the switch (caches, allocator, the other mode's idle threads);
            # the median step: a step the machine stalled (another process) is not the mode's
            return statistics.median(t * 1000 for b in self._blocks if b.eager is eager for t in b.seconds[1:])

        def peak(eager: bool) -> float | None:
            peaks = [b.peak_mb for b in self._blocks if b.eager is eager and b.peak_mb is not None]
            return max(peaks) if peaks else None

        self.result = Payoff(
            eager_step_ms=per_step_ms(True),
            compiled_step_ms=per_step_ms(False),
            measured_at_step=self._started_at_step,
            blocks=self.settings.blocks,
            block_steps=self.settings.block_steps,
            eager_peak_mb=peak(True),
            compiled_peak_mb=peak(False),
        )

    def _synchronize(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()


def _force_eager() -> contextlib.AbstractContextManager[object]:
    """Compiled code runs as its original Python from now until :func:`_leave_eager`."""
    stance = torch.compiler.set_stance("force_eager")  # building it sets the stance already
    try:
        stance.__enter__()
    except BaseException:
        stance.__exit__(None, None, None)
        raise
    return stance


def _leave_eager(stance: contextlib.AbstractContextManager[object]) -> None:
    """Back to compiled code; if the stance will not leave, torch's default stance is set, so that the
    process never goes on eagerly because of a measurement."""
    if _STANCE.call(stance.__exit__, None, None, None) is FAILED:
        with contextlib.suppress(Exception):
            torch.compiler.set_stance("default")


class PayoffTracker:
    """The payoff of one training loop, driven by whatever loop runs it (Lightning's hooks, a plain loop's
    ``step()`` calls, Fabric's callbacks): one step is one optimizer step, however many batches it took.

    ``step_ended`` returns the payoff the first time it is measured (for a console line); ``finish`` ends the
    loop's account, measured or with why not, and records it as the ``compile_payoff`` event.
    """

    def __init__(self, settings: PayoffSettings, recorder: CompileRecorder, on_cuda: bool = False) -> None:
        self.settings = settings
        self._recorder = recorder
        self._meter = PayoffMeter(settings, compilations=lambda: recorder.stats.count, on_cuda=on_cuda)
        self._announced = False

    def step_started(self, global_step: int) -> None:
        self._meter.step_started(global_step)
        if self._meter.running_eagerly:
            self._recorder.running_eagerly(global_step)

    def step_ended(self) -> Payoff | None:
        self._meter.step_ended()
        if self._meter.result is None or self._announced:
            return None
        self._announced = True
        return self._costed(self._meter.result, steps=0)

    def abandon(self) -> None:
        """The step raised: stop running eagerly, untimed."""
        self._meter.abandon()

    def finish(self, steps: int) -> Payoff:
        """The loop ended after ``steps`` optimizer steps: its payoff (or why it has none), recorded."""
        self._meter.abandon()
        payoff = self._meter.result or Payoff(not_measured=self._meter.why_not())
        self._costed(payoff, steps)
        self._recorder.emit_event(None, JitEventName.COMPILE_PAYOFF, payoff.attributes())
        return payoff

    def line(self, payoff: Payoff) -> str:
        """The console's line: the answer and, when compiling loses, the likely reason."""
        stats = self._recorder.stats
        why = why_slower(stats.train_graph_breaks, stats.train_recompiles, stats.backends, stats.plain_backends)
        return f"telemetry-jit: compile payoff: {payoff.sentence(why)}"

    def _costed(self, payoff: Payoff, steps: int) -> Payoff:
        payoff.compile_s = self._recorder.stats.total_time_ms / 1000
        payoff.steps = steps
        return payoff
