"""Which process of a distributed job this is, for exporters to put on every record.

Read from the usual variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``/``GROUP_RANK``)
when first asked; whoever learns better (the trainer, once its strategy has set up the ranks) calls
``this_process.update``. Launchers such as Lightning's start the other ranks after the first process has
configured its exporters, so rank 0 may only learn that it is rank 0 of many at ``fit``.

The run id ties the ranks of one job together: taken from ``TELEMETRY_JIT_RUN_ID`` when set, else
made up once and put into the environment so that ranks launched from this process inherit it.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, replace

RUN_ID_VARIABLE = "TELEMETRY_JIT_RUN_ID"


@dataclass(frozen=True)
class ProcessIdentity:
    rank: int
    local_rank: int
    world_size: int
    node: str

    def as_attributes(self) -> dict[str, int | str]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size, "node": self.node}


def _from_environment() -> ProcessIdentity:
    def number(*names: str, default: int) -> int:
        for name in names:
            value = os.environ.get(name, "")
            if value.isdigit():
                return int(value)
        return default

    local_rank = number("LOCAL_RANK", default=0)
    return ProcessIdentity(
        rank=number("RANK", "GLOBAL_RANK", "SLURM_PROCID", default=local_rank),
        local_rank=local_rank,
        world_size=number("WORLD_SIZE", "SLURM_NTASKS", default=1),
        node=socket.gethostname(),
    )


class IdentityTracker:
    """What this process has learnt of its identity: from the environment when first asked, until
    whoever knows better (the trainer, once its strategy has set up the ranks) calls :meth:`update`.

    Exporters read :meth:`current` for every record; :attr:`version` changes with it, so they can
    re-encode only then.
    """

    def __init__(self) -> None:
        self._current: ProcessIdentity | None = None
        self.version = 0
        self._told = False  # update() was called: the trainer knows better than the environment

    def current(self) -> ProcessIdentity:
        if self._current is None:
            self._current = _from_environment()
        return self._current

    def update(self, rank: int, local_rank: int, world_size: int) -> None:
        new = replace(self.current(), rank=int(rank), local_rank=int(local_rank), world_size=int(world_size))
        self._told = True
        if new != self._current:
            self._current = new
            self.version += 1

    def refresh(self) -> None:
        """Read the identity from the environment again, unless :meth:`update` has set it."""
        if not self._told:
            self._current = None
            self.version += 1

    def reset(self) -> None:
        """Forget everything learnt (a new process, or a test)."""
        self._told = False
        self.refresh()


this_process = IdentityTracker()  # one per process, as the identity it tracks


def run_id() -> str:
    """This job's run id, shared with the ranks this process launches."""
    value = os.environ.get(RUN_ID_VARIABLE)
    if not value:
        value = os.environ[RUN_ID_VARIABLE] = uuid.uuid4().hex
    return value
