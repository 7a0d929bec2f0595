"""Is compiling worth it? Compiled and eager steps of the same model timed in the same run: once nothing has
compiled for ``settle_steps`` steps, blocks of steps run compiled and eagerly (``set_stance("force_eager")``) in
the order compiled, eager, eager, compiled, ... so that a drift in the machine's speed cancels out; each mode's
step time is the median of its steps, each block's first left out. A compilation starts the measurement over."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.records import Payoff

_STANCE = call_site("torch.set_stance", "torch.compiler.set_stance (running a payoff block eagerly)")


@dataclass(frozen=True)
class PayoffSettings:
    """How the payoff is measured."""

    settle_steps: int = 10  # training steps without a compilation before measuring starts
    block_steps: int = 5  # steps in one block; its first, paying for the switch of mode, is not counted
    blocks: int = 4  # blocks of each mode (compiled, eager): blocks * block_steps steps run eagerly

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
    ``compilations()``: the compilations so far (a change voids a measurement); ``on_cuda``: time with
    synchronisation and record each mode's peak memory."""

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

    def why_not(self) -> str:
        """Why there is no result, in words, with what would give one."""
        settings = self.settings
        if self.compilations() == 0:
            return "nothing compiled in this loop, so there is nothing to compare"
        quiet = max(self._last_step - self._quiet_since + 1, 0) if self._quiet_since is not None else 0
        needed = settings.settle_steps + 2 * settings.blocks * settings.block_steps
        return (
            f"the loop ended {quiet} step(s) after its last compilation, and a measurement needs "
            f"{needed} steps without one ({settings.settle_steps} to settle, then {2 * settings.blocks} "
            f"blocks of {settings.block_steps}): train {needed - quiet} more steps, or ask for fewer "
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
        if self.on_cuda:
            torch.cuda.synchronize()
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
        if self.on_cuda:
            torch.cuda.synchronize()
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
            return max((b.peak_mb for b in self._blocks if b.eager is eager and b.peak_mb is not None), default=None)

        self.result = Payoff(
            eager_step_ms=per_step_ms(True),
            compiled_step_ms=per_step_ms(False),
            measured_at_step=self._started_at_step,
            blocks=self.settings.blocks,
            block_steps=self.settings.block_steps,
            eager_peak_mb=peak(True),
            compiled_peak_mb=peak(False),
        )


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
