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

from telemetry_jit.records import Payoff


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

    Example::

        meter = PayoffMeter(PayoffSettings(), compilations=lambda: stats.count)
        meter.step_started(global_step)   # eager from here when the schedule says so
        train_one_step()
        meter.step_ended()
        meter.result                      # a Payoff once measured
    """

    settings: PayoffSettings
    compilations: Callable[[], int]
    on_cuda: bool = False
    result: Payoff | None = None
    _quiet_since: int | None = None  # the step since which nothing compiled
    _seen: int = -1
    _blocks: list[_Block] = field(default_factory=list)
    _started_at_step: int = 0
    _running: tuple[_Block, contextlib.AbstractContextManager[object] | None, float] | None = None

    def step_started(self, global_step: int) -> None:
        """A training step begins: timed, and eager, when the schedule says so."""
        self.abandon()  # a step that never ended (it raised) is not timed
        block = self._block_for(global_step)
        if block is None:
            return
        stance = torch.compiler.set_stance("force_eager") if block.eager else None
        if stance is not None:
            stance.__enter__()
        self._synchronize()
        self._running = (block, stance, time.perf_counter())

    def step_ended(self) -> None:
        """The step ends: its time goes to its block, and eager running stops."""
        if self._running is None:
            return
        block, stance, started = self._running
        self._running = None
        self._synchronize()
        block.seconds.append(time.perf_counter() - started)
        if stance is not None:
            stance.__exit__(None, None, None)
        if self.on_cuda:
            block.peak_mb = max(block.peak_mb or 0.0, torch.cuda.max_memory_allocated() / 2**20)
        if len(block.seconds) == self.settings.block_steps and len(self._blocks) == 2 * self.settings.blocks:
            self._finish()

    def abandon(self) -> None:
        """Stop running eagerly now, untimed (the step raised)."""
        if self._running is not None and self._running[1] is not None:
            self._running[1].__exit__(None, None, None)
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
