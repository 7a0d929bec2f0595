"""The job's own ``torch.distributed`` store (the c10d store its default process group rendezvoused on, or
torchrun's agent store before the group is up), reached through ``distributed_c10d._get_default_store``: no public
API hands it out."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Protocol


class Store(Protocol):
    """What telemetry uses of a c10d ``Store``."""

    def set(self, key: str, value: bytes) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...


def job_store(timeout_s: float) -> tuple[Store, int, int] | str:
    """``(store, rank, world_size)``: this process's own connection to the job's store, timing out after
    ``timeout_s`` (the job's connection untouched); or, in words, why there is none."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return "no process group"
    world_size = dist.get_world_size()
    if world_size < 2:
        return "one rank"
    from torch.distributed import distributed_c10d

    try:
        store = distributed_c10d._get_default_store().clone()  # type: ignore[attr-defined]  # stubs lag
        store.set_timeout(timedelta(seconds=timeout_s))
    except (RuntimeError, AttributeError, NotImplementedError) as error:
        return f"the job's store cannot be shared ({type(error).__name__}: {error})"
    return store, dist.get_rank(), world_size


RUN_ID_KEY = "telemetry_jit/run_id"


def shared_by_the_job(proposal: str, timeout_s: float = 30.0) -> str | None:
    """The value every process of this job agrees on: the first to ask stores its ``proposal`` in the job's own
    store, under one key, and every later one reads it back (no process waits for another). The store is the
    default process group's where one is up, else torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``: the
    one ``init_process_group`` will join at ``MASTER_ADDR:MASTER_PORT``); ``None`` where there is neither or it
    cannot be reached."""
    import torch.distributed as dist

    if not dist.is_available():
        return None
    try:
        if dist.is_initialized():
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()
        elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and _agent_address() is not None:
            host, port = _agent_address() or ("", 0)
            # a client only: no world size, so the agent's count of the workers that joined is left as it is
            store = dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False)
        else:
            return None
        return bytes(store.compare_set(RUN_ID_KEY, "", proposal)).decode()
    except (RuntimeError, ValueError, OSError, AttributeError, NotImplementedError, UnicodeDecodeError):
        return None  # a store that cannot be reached or shared: the caller's fallback


def _agent_address() -> tuple[str, int] | None:
    host, port = os.environ.get("MASTER_ADDR", "").strip(), os.environ.get("MASTER_PORT", "").strip()
    return (host, int(port)) if host and port.isdigit() else None
