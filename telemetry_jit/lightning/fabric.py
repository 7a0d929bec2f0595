"""Compile telemetry in Lightning Fabric, through Fabric's own callbacks (``Fabric(callbacks=...)``)."""

from __future__ import annotations

from typing import Any

from telemetry_jit.boundary import guarded
from telemetry_jit.loop import CompileTelemetry


class FabricCompileTelemetry(CompileTelemetry):
    """A Fabric callback recording every compilation between ``on_train_start`` and ``on_train_end``.

    Fabric calls a callback's methods when your loop says ``fabric.call(name, ...)``; these are the
    names it answers to. Given the ``Fabric`` object at ``on_train_start``, every record carries this
    process's rank, each rank writes its own file, each loop's summary has every rank's totals (every rank
    calls ``on_train_end``: it gathers them; rank zero warns when they lie far apart), and when Fabric has
    loggers the compile figures (``compile/time_s``, ...) go to them with ``fabric.log_dict`` at their step.
    Given the model too (``fabric.call("on_train_start", fabric, model)``), its thunder compilations are
    recorded.

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

    @guarded
    def on_train_start(self, fabric: Any = None, model: Any = None, *args: Any, **kwargs: Any) -> None:
        if fabric is not None:
            self.set_rank(fabric.global_rank, fabric.local_rank, fabric.world_size)
            self.gather = fabric.all_gather
        self.model = model if model is not None else self.model
        # compile figures go to Fabric's loggers too (fabric.log_dict), when it has some
        logs = [(fabric.log_dict, "Fabric.log_dict")] if fabric is not None and fabric.loggers else []
        self._driver.log_to(logs, fabric.loggers if fabric is not None else ())
        self.__enter__()

    @guarded
    def on_train_batch_start(self, step: int, *args: Any, **kwargs: Any) -> None:
        self.step(step)

    @guarded
    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.__exit__(None, None, None)

    @guarded
    def on_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        """Call it as ``fabric.call("on_exception", error)`` when the loop fails: what compiled is kept,
        the failed compile is marked with the error."""
        self.__exit__(type(exception), exception, exception.__traceback__)
