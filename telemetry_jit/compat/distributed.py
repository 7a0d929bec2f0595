"""The job's own ``torch.distributed`` store (the c10d store its default process group rendezvoused on),
reached through ``distributed_c10d._get_default_store``: no public API hands it out."""

from __future__ import annotations

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
