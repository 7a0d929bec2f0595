"""Warnings said once, by the rank that should say them: a fact about the job by rank zero, one about a process
by every rank, rank-prefixed. Lightning's ``WarningCache`` does not serve: it keys by the text (ours hold counts)
and raises under ``python -W error``, which must never take training down."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Hashable
from types import FrameType

from telemetry_jit.redaction import scrub
from telemetry_jit.terminal import clean


def global_rank() -> int:
    """This process's rank as Lightning knows it, else as the launcher's variables say, else 0. Never raises."""
    if "lightning_utilities" in sys.modules:  # where Lightning runs, it knows the rank (readers never import it)
        from lightning_utilities.core.rank_zero import rank_zero_only

        rank = getattr(rank_zero_only, "rank", None)
        if rank is not None:
            return int(rank)
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isascii() and value.isdigit():
            return int(value)
    return 0


class Notices:
    """Says each key's warning once; ``every_rank=False`` (the default) on rank zero only."""

    def __init__(self) -> None:
        self._said: set[Hashable] = set()

    def warn(
        self,
        key: Hashable,
        message: str,
        *,
        every_rank: bool = False,
        category: type[Warning] = RuntimeWarning,
        origin: str = "",
        stacklevel: int = 2,
    ) -> bool:
        """Warn unless ``key`` was said already; True when said now. ``origin`` (``"file:line"``): the line Python
        shows as its source, e.g. the user's code it is about."""
        if key in self._said:
            return False
        self._said.add(key)
        rank = global_rank()
        if not every_rank and rank != 0:
            return False
        world_size = os.environ.get("WORLD_SIZE", "")
        if every_rank and world_size.isdigit() and int(world_size) > 1:
            from lightning_utilities.core.rank_zero import rank_prefixed_message

            message = rank_prefixed_message(message, rank)
        _warn(message, category, origin, stacklevel + 1)
        return True

    def forget(self) -> None:
        """Say every warning again (a new run in the same process)."""
        self._said.clear()


def user_line() -> str:
    """``file:line`` of the innermost caller outside telemetry-jit: the user's line a warning is about."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""


_PACKAGE = os.path.dirname(os.path.abspath(__file__))
NOWHERE = "telemetry-jit:0"  # an origin for warnings about telemetry itself: no source line is shown under them


def say(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn without pointing at a line of code (the warning is about a file or a collector, not code)."""
    _warn(message, category, NOWHERE, 2)


def _warn(message: str, category: type[Warning], origin: str, stacklevel: int) -> None:
    message = scrub(clean(message))  # names and reasons in it come from code and data; a collector's, a secret
    path, _, line = origin.rpartition(":")
    try:
        if path and line.isdigit():
            warnings.warn_explicit(message, category, path, int(line), module=path)
        else:
            warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Exception:  # noqa: BLE001 - warnings made errors (python -W error) must not take training down
        print(f"{category.__name__}: {message}", file=sys.stderr)


process_notices = Notices()  # what is true of the whole process: its torch, its nv-one-logger, its thunder
warn_once = process_notices.warn
