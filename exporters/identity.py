"""Which process of a distributed job this is, for exporters to put on every record.

Read from the usual variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``NODE_RANK``/``GROUP_RANK``)
when first asked; whoever learns better (the trainer, once its strategy has set up the ranks) calls
:func:`update`. Launchers such as Lightning's start the other ranks after the first process has
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


_current: ProcessIdentity | None = None
_version = 0
_told = False  # update() was called: the trainer knows better than the environment


def current() -> ProcessIdentity:
    global _current
    if _current is None:
        _current = _from_environment()
    return _current


def version() -> int:
    """Changes whenever :func:`update` changes the identity (cheap to compare per record)."""
    return _version


def update(rank: int, local_rank: int, world_size: int) -> None:
    global _current, _version, _told
    new = replace(current(), rank=int(rank), local_rank=int(local_rank), world_size=int(world_size))
    _told = True
    if new != _current:
        _current = new
        _version += 1


def refresh() -> None:
    """Read the identity from the environment again, unless :func:`update` has set it."""
    global _current, _version
    if not _told:
        _current = None
        _version += 1


def reset() -> None:
    """Forget everything learnt (a new process, or a test)."""
    global _told
    _told = False
    refresh()


def run_id() -> str:
    """This job's run id, shared with the ranks this process launches."""
    value = os.environ.get(RUN_ID_VARIABLE)
    if not value:
        value = os.environ[RUN_ID_VARIABLE] = uuid.uuid4().hex
    return value
