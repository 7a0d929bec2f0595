"""Which rank a process is, for every record; ranks started by spawning (``strategy="ddp_spawn"``)
are new processes and are configured again."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from telemetry_jit.session import Configuration, Session, configuration, resolve


class RankTelemetry(Callback):
    """Tell the session which rank this process is (known by ``setup``); in a spawned rank (the callbacks are
    pickled into it, this one carrying the configuration) start a session as ``configure`` did, ending it at
    teardown. It must come before the other telemetry callbacks, whose ``setup`` needs the session."""

    def __init__(self, session: Session | None = None) -> None:
        self.session = session  # the session given to hook_trainer_cls (None: the one running)
        self._configuration: Configuration | None = None
        self._owned: Session | None = None  # the session this callback started (in a spawned rank)

    def __getstate__(self) -> dict[str, Any]:
        return {"configuration": configuration()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._configuration = state["configuration"]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        session = resolve(self.session)
        if not session.recording and self._configuration is not None and not session.ended:
            # a spawned rank: its module-level configure (if any) was the script's re-import, which records nothing
            session = self._owned = self._configuration.apply(
                trainer.global_rank, trainer.local_rank, trainer.world_size
            )
            session.start_application()
        session.set_rank(trainer.global_rank, trainer.local_rank, trainer.world_size)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        owned, self._owned = self._owned, None
        if owned is not None:  # nobody else ends a spawned rank's session
            owned.shutdown()
