"""Which rank a process is, for every record; ranks started by spawning (``strategy="ddp_spawn"``)
are new processes and are configured again."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from nv_one_logger.training_telemetry.api import callbacks as one_logger
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from typing_extensions import override

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat.nv_one_logger import telemetry_enabled
from telemetry_jit.configuration import Configuration, configuration, set_rank


class RankTelemetry(Callback):
    """Tell the exporters which rank this process is (the strategy knows by ``setup``), and in a
    spawned rank configure telemetry as :func:`telemetry_jit.configure` did in the launching
    process, ending that rank's application span at teardown.

    The trainer's callbacks are pickled into each spawned process; this one carries the
    configuration along. It must come before the other telemetry callbacks, whose ``setup`` needs a
    configured provider and records that name their rank.
    """

    def __init__(self) -> None:
        self._configuration: Configuration | None = None
        self._owns_application = False

    def __getstate__(self) -> dict[str, Any]:
        return {"configuration": configuration()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._configuration = state["configuration"]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if telemetry_enabled() or self._configuration is None:
            set_rank(TrainingTelemetryProvider.instance(), trainer.global_rank, trainer.local_rank, trainer.world_size)
            return
        self._configuration.apply(trainer.global_rank, trainer.local_rank, trainer.world_size)
        one_logger.on_app_start()
        self._owns_application = True

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self._owns_application:
            return
        self._owns_application = False  # nobody else ends a spawned rank's application
        if telemetry_enabled() and nv_one_logger_compat.application_running(TrainingTelemetryProvider.instance()):
            one_logger.on_app_end()
