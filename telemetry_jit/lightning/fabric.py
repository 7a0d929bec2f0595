"""Compile telemetry in Lightning Fabric, through Fabric's own callbacks (``Fabric(callbacks=...)``)."""

from __future__ import annotations

from typing import Any

from telemetry_jit.boundary import guarded
from telemetry_jit.loop import CompileTelemetry
from telemetry_jit.recording.figures import CompileFigures, GuardedLog, payoff_figures


class FabricCompileTelemetry(CompileTelemetry):
    """A Fabric callback recording every compilation between ``on_train_start`` and ``on_train_end``.

    Fabric calls a callback's methods when your loop says ``fabric.call(name, ...)``; these are the
    names it answers to. Given the ``Fabric`` object at ``on_train_start``, every record carries this
    process's rank, each rank writes its own file, and when Fabric has loggers the compile figures
    (``compile/time_s``, ``compile/frame_compiles``, ...) go to them with ``fabric.log_dict`` at their step.

    Example::

        telemetry_jit.configure("my-fabric-run", file="runs/telemetry.jsonl")
        telemetry = telemetry_jit.FabricCompileTelemetry()
        fabric = Fabric(callbacks=[telemetry])
        fabric.launch()
        model, optimizer = fabric.setup(torch.compile(model), optimizer)
        fabric.call("on_train_start", fabric)
        for step, batch in enumerate(loader):
            fabric.call("on_train_batch_start", step)
            ...
        fabric.call("on_train_end")
    """

    _figures: CompileFigures | None = None
    _log: GuardedLog | None = None

    @guarded
    def on_train_start(self, fabric: Any = None, *args: Any, **kwargs: Any) -> None:
        self._figures = self._log = None
        if fabric is not None:
            self.set_rank(fabric.global_rank, fabric.local_rank, fabric.world_size)
            if fabric.loggers:  # compile figures go to Fabric's loggers too (fabric.log_dict)
                self._figures = CompileFigures()
                self._log = GuardedLog(fabric.log_dict, "Fabric.log_dict")
                self._recorder.listeners.append(self._figures)
        self.__enter__()

    @guarded
    def on_train_batch_start(self, step: int, *args: Any, **kwargs: Any) -> None:
        self.step(step)
        if self._figures is not None and self._figures.pending:
            self._log_figures(self.global_step)

    @guarded
    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.__exit__(None, None, None)
        if self._figures is not None and self._log is not None:
            self._log_figures()
            self._recorder.listeners.remove(self._figures)
            if self.last_payoff.measured:
                self._log(payoff_figures(self.last_payoff), step=self.global_step)

    def _log_figures(self, current_step: int | None = None) -> None:
        """Each step's figures once it is over (``None``: the loop ended): one value per key per step."""
        assert self._figures is not None and self._log is not None
        for step, metrics in self._figures.take(self._recorder.stats, current_step):
            self._log(metrics, step=step)

    @guarded
    def on_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        """Call it as ``fabric.call("on_exception", error)`` when the loop fails: what compiled is kept,
        the failed compile is marked with the error."""
        self.__exit__(type(exception), exception, exception.__traceback__)
        if self._figures is not None and self._log is not None:
            self._log_figures()  # the steps that compiled before the failure
