"""Readers of torch's log records: the only place some facts of a compile are said (a graph break's user
line, DDPOptimizer's buckets, why a compile cache was bypassed, a frame dynamo gave up on). Each tap opens
its loggers while installed and reads every record first, leaving the user's console as it was; what a
record means is parsed in :mod:`telemetry_jit.compat.torch`, so a reworded message is mended there."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from telemetry_jit.compat import compile_cache
from telemetry_jit.compat import torch as torch_compat


class LogTap(logging.Filter):
    """Reads some of torch's log records while installed. Each logger is opened down to ``level``; a filter
    (not a handler) reads every record, then lets through only what the user's logging configuration would
    have shown (all of it where they enabled the logger, e.g. with ``TORCH_LOGS``)."""

    level = logging.DEBUG

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[Any] = []
        self._shown_from: dict[str, int] = {}
        self._saved: list[tuple[logging.Logger, int]] = []

    def loggers(self) -> list[logging.Logger]:
        raise NotImplementedError

    def read(self, record: logging.LogRecord) -> None:
        raise NotImplementedError

    def _read_and_pass(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # a message torch reworded must never fail the compile logging it
            self.read(record)
        return record.levelno >= self._shown_from.get(record.name, logging.WARNING)

    # what logging calls: torch logs from inside running compiled code too
    filter = torch_compat.never_traced(_read_and_pass)

    def install(self) -> None:
        for logger in self.loggers():
            self._saved.append((logger, logger.level))
            self._shown_from[logger.name] = logger.getEffectiveLevel()
            if not logger.isEnabledFor(self.level):
                logger.setLevel(self.level)
            logger.addFilter(self)

    def uninstall(self) -> None:
        for logger, level in self._saved:
            logger.removeFilter(self)
            logger.setLevel(level)
        self._saved.clear()
        self._shown_from.clear()
        self.entries.clear()


class GraphBreakLog(LogTap):
    """``(location, reason, traced stack)`` from dynamo's ``graph_breaks`` log artifact, one per logged
    break; the traced stack is where dynamo was tracing when it logged it (the compiled frame's line)."""

    def loggers(self) -> list[logging.Logger]:
        return torch_compat.graph_break_loggers()

    def read(self, record: logging.LogRecord) -> None:
        entry = torch_compat.parse_graph_break(record)
        if entry is not None:
            self.entries.append((*entry, torch_compat.traced_stack()))

    def take(self, reason: str) -> tuple[str, tuple[str, ...]]:
        """Pop the first logged break whose text contains ``reason``'s first line: its location and the
        traced stack (empty when none was logged)."""
        head = reason.strip().split("\n", 1)[0]
        for index, (location, text, traced) in enumerate(self.entries):
            if head in text:
                del self.entries[index]
                return location, traced
        return "", ()


class FrameSkipLog(LogTap):
    """dynamo's INFO line saying it gave up on a frame it traced (torch < 2.10)."""

    level = logging.INFO

    def loggers(self) -> list[logging.Logger]:
        return [logging.getLogger(torch_compat.FRAME_SKIP_LOGGER)]

    def read(self, record: logging.LogRecord) -> None:
        if torch_compat.is_frame_skip(record):
            self.entries.append(record.getMessage())


class DDPBucketLog(LogTap):
    """``(bucket cap, buckets)`` from DDPOptimizer's INFO line, one per graph it partitioned."""

    level = logging.INFO

    def loggers(self) -> list[logging.Logger]:
        return [logging.getLogger(torch_compat.DDP_LOGGER)]

    def read(self, record: logging.LogRecord) -> None:
        entry = torch_compat.parse_ddp_buckets(record)
        if entry is not None:
            self.entries.append(entry)


class CacheBypassLog(LogTap):
    """Why the FX graph or AOTAutograd cache was bypassed, from torch's INFO lines. Open down to DEBUG: there
    torch 2.13 and later compute the parts of AOTAutograd's cache keys (8-10 ms a graph). Its records also tell
    an AOTAutograd miss before the graph compiles (:func:`~telemetry_jit.compat.compile_cache.read_log`)."""

    def loggers(self) -> list[logging.Logger]:
        return [logging.getLogger(name) for name in torch_compat.CACHE_BYPASS_LOGGERS]

    def read(self, record: logging.LogRecord) -> None:
        compile_cache.read_log(record)
        reason = torch_compat.parse_cache_bypass(record)
        if reason is not None:
            self.entries.append(reason)
