"""Warnings about compilations while training runs, for what a user must hear of at once."""

from __future__ import annotations

from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import Notices
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.records import CompileRecord


class RecompileLimitAlert(CompileListener):
    """Warn once per frame that hit ``torch._dynamo.config.recompile_limit``: from then on it runs
    eagerly, without compilation, and torch says so only in one log line."""

    def __init__(self) -> None:
        self._notices = Notices()

    def recorded(self, record: CompileRecord) -> None:
        if not record.recompile_limit_hit:
            return
        self._notices.warn(
            record.frame_id,
            f"telemetry-jit: {record.frame or 'a frame'} ({record.location or 'unknown location'}) hit "
            f"torch._dynamo.config.recompile_limit ({torch_compat.recompile_limit()}) and now runs eagerly, without "
            f"compilation. Last recompile reason: {record.recompile_reason or 'unknown'}. Mark the changing dimension "
            "dynamic (torch._dynamo.mark_dynamic / dynamic=True) or raise the limit.",
            origin=record.location,
        )
