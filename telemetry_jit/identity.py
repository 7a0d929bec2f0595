"""Which process of a distributed job this is (from the launcher's variables until the trainer knows better:
Lightning starts the other ranks after rank 0 configured), and which job (:func:`run_id`)."""

from __future__ import annotations

import os
import re
import socket
import sys
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

RUN_ID_VARIABLE = "TELEMETRY_JIT_RUN_ID"

# (variable, launcher): job ids every rank of a job sees alike, most specific first
LAUNCHER_JOB_IDS = (
    ("TORCHELASTIC_RUN_ID", "torchrun"),  # "none" when torchrun was given no --rdzv-id on several nodes
    ("SLURM_JOB_ID", "slurm"),
    ("LSB_JOBID", "lsf"),
    ("PMIX_NAMESPACE", "mpi"),
    ("OMPI_MCA_ess_base_jobid", "mpi"),
)
_RANK_VARIABLES = ("RANK", "GLOBAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class IdentityError(ValueError):
    """A launcher variable that says which rank this is holds something that is not a rank."""


@dataclass(frozen=True)
class ProcessIdentity:
    rank: int
    local_rank: int
    world_size: int
    node: str  # the fields, in this order, are the attributes that say which process wrote a record


def _number(names: tuple[str, ...], default: int, minimum: int = 0) -> int:
    """The first of ``names`` that is set, as a number; one that is not a number is an error (a rank guessed
    wrong would put one rank's records in another's file)."""
    for name in names:
        value = os.environ.get(name)
        if value is None:
            continue
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or int(text) < minimum:
            raise IdentityError(
                f"telemetry-jit: the environment variable {name}={value!r} is not a valid "
                f"{'world size' if minimum else 'rank'} (a whole number >= {minimum}). Unset it, or set it as your "
                "launcher does (torchrun, SLURM and Lightning set it for each process)."
            )
        return int(text)
    return default


# the pid of the process this one was forked from after configuring telemetry (off here; session.py sets it in a
# forked child, and clears it once the child configures telemetry of its own), else None
forked_from: int | None = None


def from_environment() -> ProcessIdentity:
    """This process's identity as its launcher's variables give it (rank 0 of 1 without any)."""
    local_rank = _number(_LOCAL_RANK_VARIABLES, default=0)
    rank = _number(_RANK_VARIABLES, default=local_rank)
    world_size = _number(_WORLD_SIZE_VARIABLES, default=1, minimum=1)
    given = next((name for name in _WORLD_SIZE_VARIABLES if name in os.environ), None)
    if given is not None and rank >= world_size:
        source = next((name for name in _RANK_VARIABLES if name in os.environ), "LOCAL_RANK")
        raise IdentityError(
            f"telemetry-jit: {source}={rank} is not a rank of a job of {given}={world_size} (ranks are 0 to "
            f"{world_size - 1}). Unset them, or set them as your launcher does (torchrun, SLURM and Lightning set "
            "them for each process)."
        )
    return ProcessIdentity(rank=rank, local_rank=local_rank, world_size=world_size, node=socket.gethostname())


class IdentityTracker:
    """What one configuration knows of its process's identity: the environment's until :meth:`update`;
    :attr:`version` changes with it, so exporters re-encode only then."""

    def __init__(self) -> None:
        self._current: ProcessIdentity | None = None
        self.version = 0

    def current(self) -> ProcessIdentity:
        if self._current is None:
            self._current = from_environment()
        return self._current

    def update(self, rank: int, local_rank: int, world_size: int) -> None:
        new = replace(self.current(), rank=int(rank), local_rank=int(local_rank), world_size=int(world_size))
        if new != self._current:
            self._current = new
            self.version += 1


def _launcher_job_id() -> str | None:
    """``<launcher>-<job id>`` from the first launcher variable that names this job, else ``None``."""
    for variable, launcher in LAUNCHER_JOB_IDS:
        value = os.environ.get(variable, "").strip()
        if value and value.lower() != "none":
            step = os.environ.get("SLURM_STEP_ID", "").strip() if launcher == "slurm" else ""
            return f"{launcher}-{value}.{step}" if step else f"{launcher}-{value}"
    return None


def _torchrun_address() -> str | None:
    """``torchrun-<MASTER_ADDR>:<MASTER_PORT>`` under torchrun without ``--rdzv-id``: the address every rank of the
    job meets at, which every plain torchrun on one host shares too (the last resort, where no store is reached)."""
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return f"torchrun-{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return None


# the run id this process put into the environment (no launcher or user gave one) and the value it found there
_put: tuple[str, str | None] | None = None


def run_id(share: Callable[[str], str | None] | None = None) -> str:
    """This job's run id, alike in every rank: ``TELEMETRY_JIT_RUN_ID``, else the launcher's job id
    (``slurm-<job>.<step>``, ``torchrun-<--rdzv-id>``, ...), else a new one: under torchrun without ``--rdzv-id``,
    ``share(proposal)`` hands every rank the one the first rank made (through the job's store). It is put into
    the environment for the ranks this process launches, until :func:`end_run`."""
    global _put
    value = os.environ.get(RUN_ID_VARIABLE, "").strip()
    if value:
        return value
    value = _launcher_job_id() or ""
    if not value and "TORCHELASTIC_RUN_ID" in os.environ:
        shared = share(f"torchrun-{uuid.uuid4().hex}") if share is not None else None
        value = shared or _torchrun_address() or ""
    value = value or uuid.uuid4().hex
    _put = (value, os.environ.get(RUN_ID_VARIABLE))
    os.environ[RUN_ID_VARIABLE] = value
    return value


def end_run() -> None:
    """The run ended: the environment is as the run found it (a run id this process put there is taken out, so
    that the next run, and any process started after this one, makes its own)."""
    global _put
    put, _put = _put, None
    if put is None or os.environ.get(RUN_ID_VARIABLE) != put[0]:
        return  # never put there, or changed since by someone else: theirs
    if put[1] is None:
        del os.environ[RUN_ID_VARIABLE]
    else:
        os.environ[RUN_ID_VARIABLE] = put[1]


def reimporting_main() -> bool:
    """Whether the user's script is being imported again as ``__mp_main__`` in a process ``multiprocessing``
    spawned (a DataLoader worker): that is not the run."""
    # multiprocessing runs the script under this name while it prepares a spawned process, before it
    # knows its parent (parent_process() is still None then)
    return any(
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__"
        for frame, _ in traceback.walk_stack(sys._getframe(1))
    )


def short_run_id(run_id: str) -> str:
    """A run id as tables show it: a uuid by its first 8 characters (``torchrun-ec9d81bf``), others up to 40."""
    launcher, dash, job = run_id.partition("-")
    if dash and launcher in {name for _, name in LAUNCHER_JOB_IDS} and _UUID.fullmatch(job):
        return f"{launcher}-{job[:8]}"
    return run_id[:8] if _UUID.fullmatch(run_id) else run_id[:40]


_UUID = re.compile(r"[0-9a-fA-F]{8}-?(?:[0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")
