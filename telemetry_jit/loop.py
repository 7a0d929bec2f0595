"""Compile telemetry for any training loop: a plain PyTorch loop, Lightning Fabric, or your own."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import torch
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

from telemetry_jit.boundary import guarded
from telemetry_jit.notices import warn_once
from telemetry_jit.recording.console import CompileConsole
from telemetry_jit.recording.driver import TelemetryDriver
from telemetry_jit.recording.payoff import PayoffSettings
from telemetry_jit.recording.recorder import Position
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import Payoff
from telemetry_jit.session import Session


class CompileTelemetry:
    """Record every compilation while a block runs, as a ``HookedTrainer`` does for ``fit``. Tell it the step
    with :meth:`step`. Compile spans hang under the nv-one-logger loop span running when they start, else the
    application span, started here (and ended on exit) if none is running.

    Args:
        provider: the session (or nv-one-logger's provider) to record through; default: the running session.
        stage: what the loop does, ``train.stage`` on the spans.
        live: announce slow compiles and warn about recompile storms on the console.
        payoff: measure what compiling buys (docs/payoff.md); a step runs from one :meth:`step` to the next.
        model: the model the loop trains: the thunder compilations in it are recorded too, and each of its
            modules that ``Module.compile()`` compiles nothing of is said (as a ``HookedTrainer`` does).
        gather: on several ranks, an all_gather every rank calls when the loop ends without an error (e.g.
            ``fabric.all_gather``): the summary has every rank's totals, rank zero warns on skew.
        batches: the batches in an epoch (``len(dataloader)``); with :meth:`step`'s ``batch_index``, a recompile at
            an epoch's last, shorter batch is told from a shape that keeps changing, as a Trainer's is.
    """

    def __init__(
        self,
        provider: Session | TrainingTelemetryProvider | None = None,
        *,
        stage: str = "train",
        live: bool = True,
        payoff: bool | PayoffSettings = False,
        model: torch.nn.Module | None = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
        batches: int | None = None,
    ) -> None:
        self.stage = stage
        self.global_step = 0
        self.batches = batches
        self._over = 0  # 1 once the loop ended: its summary counts the steps done, as Lightning's global_step does
        self._steps = 0  # step() calls so far: the steps the loop ran
        self._driver = TelemetryDriver(provider, [CompileConsole()] if live else [])
        self._rank, self._world_size = 0, 1
        self.model, self.gather = model, gather
        self._owns_application = False
        self.stats: CompileStats | None = None
        if not isinstance(payoff, (bool, PayoffSettings)):
            raise TypeError(f"CompileTelemetry(payoff=...) takes True, False or a PayoffSettings, got {payoff!r}.")
        self.payoff_settings = (payoff if isinstance(payoff, PayoffSettings) else PayoffSettings()) if payoff else None
        self.last_payoff = Payoff(not_measured="payoff was not asked for" if not payoff else "the loop has not run")

    @guarded
    def step(self, global_step: int, batch_index: int | None = None) -> None:
        """The loop is at ``global_step`` now, at the ``batch_index``-th batch of its epoch where given (cheap: call it
        every step)."""
        self.global_step = global_step
        self._steps += 1
        if self._steps == 1 and self.model is not None:  # compiled as it runs by now (a Trainer's: by its first batch)
            self._driver.model_ready(self.model)
        self._driver.batch_started(global_step, batch_index, stage=self.stage, log_step=global_step)
        self._driver.step_ended(say=self._rank == 0)
        self._driver.step_started(global_step)

    def _position(self) -> Position:
        return Position(self.global_step + self._over, self.stage, self.batches)

    def set_rank(self, rank: int, local_rank: int, world_size: int) -> None:
        """Which process of a distributed job this is, for every record."""
        self._rank, self._world_size = rank, world_size
        self._driver.session.set_rank(rank, local_rank, world_size)

    def __enter__(self) -> CompileTelemetry:
        self._start()
        return self

    @guarded
    def _start(self) -> None:
        session = self._driver.resolve()
        self._steps = 0
        if session.recording:
            self._owns_application = session.start_application()
        elif not (session.inert or session.ended):
            warn_once(
                "loop not configured",
                "telemetry-jit: the telemetry provider is not configured, so compilations are only counted. "
                "Call telemetry_jit.configure(app_name, file=...) first.",
            )
        self._over = 0
        self._driver.start(self._position, rank=self._rank, model=self.model)
        if self.payoff_settings is not None:
            self._driver.payoff_started(self.payoff_settings)

    @guarded
    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._driver.payoff_abandoned()  # the last step has no end to time
        if error is not None:
            self._driver.failed(error, f"{self.stage} step {self.global_step}")
        else:
            self._driver.stop()
        self._over = 1 if self._steps else 0
        gather = self.gather if error is None else None  # a failing rank must not wait in a collective for the rest
        self.stats = self._driver.loop_ended(
            None, loop=self.stage, step=self.global_step, world_size=self._world_size, gather=gather
        )
        speak = self._rank == 0
        payoff = self._driver.payoff_finished(
            self._steps, self.global_step, say_measured=speak, say_not=speak and error is None
        )
        self.last_payoff = payoff or self.last_payoff
        self._driver.ended(error, "the loop ran no step and compiled nothing (CompileTelemetry.step was never called)")
        if self._owns_application:  # it started the application: its end is the session's
            self._owns_application = False
            self._driver.session.shutdown()
