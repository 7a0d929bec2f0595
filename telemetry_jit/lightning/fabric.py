"""Compile telemetry in Lightning Fabric, through Fabric's own callbacks (``Fabric(callbacks=...)``)."""

from __future__ import annotations

from typing import Any

from lightning.fabric.wrappers import is_wrapped

from telemetry_jit.boundary import guarded
from telemetry_jit.loop import CompileTelemetry


class FabricCompileTelemetry(CompileTelemetry):
    """A Fabric callback recording every compilation between ``on_train_start`` and ``on_train_end`` (called
    by ``fabric.call(name, ...)``). Given the ``Fabric`` at ``on_train_start``, records carry its rank, the
    summary gathers every rank's totals, and compile figures go to Fabric's loggers; given the model too
    (``fabric.call("on_train_start", fabric, model)``), its thunder compilations are recorded."""

    @guarded
    def on_train_start(self, fabric: Any = None, model: Any = None, *args: Any, **kwargs: Any) -> None:
        if fabric is not None:
            self.set_rank(fabric.global_rank, fabric.local_rank, fabric.world_size)
            self.gather = fabric.all_gather
        # the module Fabric wraps: its modules named as the user's code and a Trainer's records name them
        if model is not None:
            self.model = model.module if is_wrapped(model) and hasattr(model, "module") else model
        logs = [(fabric.log_dict, "Fabric.log_dict")] if fabric is not None and fabric.loggers else []
        self._driver.log_to(logs, fabric.loggers if fabric is not None else ())
        self.__enter__()

    @guarded
    def on_train_batch_start(self, step: int, *args: Any, batch_index: int | None = None, **kwargs: Any) -> None:
        self.step(step, batch_index)

    @guarded
    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.__exit__(None, None, None)

    @guarded
    def on_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        """``fabric.call("on_exception", error)`` when the loop fails: the failed compile is marked with it."""
        self.__exit__(type(exception), exception, exception.__traceback__)
