"""Readers of torch's log records, the only place some facts of a compile are said (a graph break's user line,
DDPOptimizer's buckets, a cache bypass, a frame dynamo gave up on); :mod:`telemetry_jit.compat.torch` parses them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from telemetry_jit.compat import compile_cache
from telemetry_jit.compat import torch as torch_compat


class LogTap(logging.Filter):
    """Keeps what ``parse`` makes of each record of ``loggers`` (opened down to ``level``) while installed; a filter
    (not a handler) reads every record, then lets through only what the user's logging would have shown."""

    def __init__(
        self, loggers: Sequence[logging.Logger], parse: Callable[[logging.LogRecord], Any], level: int = logging.INFO
    ) -> None:
        super().__init__()
        self._loggers, self._parse, self._level = loggers, parse, level
        self.entries: list[Any] = []
        self._shown_from: dict[str, int] = {}
        self._saved: list[tuple[logging.Logger, int]] = []

    def _read_and_pass(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # a message torch reworded must never fail the compile logging it
            entry = self._parse(record)
            if entry is not None:
                self.entries.append(entry)
        return record.levelno >= self._shown_from.get(record.name, logging.WARNING)

    # what logging calls: torch logs from inside running compiled code too
    filter = torch_compat.never_traced(_read_and_pass)

    def install(self) -> None:
        for logger in self._loggers:
            self._saved.append((logger, logger.level))
            self._shown_from[logger.name] = logger.getEffectiveLevel()
            if not logger.isEnabledFor(self._level):
                logger.setLevel(self._level)
            logger.addFilter(self)

    def uninstall(self) -> None:
        for logger, level in self._saved:
            logger.removeFilter(self)
            logger.setLevel(level)
        self._saved.clear()
        self._shown_from.clear()
        self.entries.clear()


def _graph_break(record: logging.LogRecord) -> tuple[str, str, tuple[str, ...]] | None:
    entry = torch_compat.parse_graph_break(record)
    return None if entry is None else (*entry, torch_compat.traced_stack())


class GraphBreakLog(LogTap):
    """``(location, reason, traced stack)`` per break in dynamo's ``graph_breaks`` artifact; the traced stack is
    where dynamo was tracing as it logged it."""

    def __init__(self, loggers: Sequence[logging.Logger] = ()) -> None:
        super().__init__(loggers or torch_compat.graph_break_loggers(), _graph_break, logging.DEBUG)

    def take(self, reason: str) -> tuple[str, tuple[str, ...]]:
        """Pop the first logged break holding ``reason``'s first line: its location and traced stack (or empty)."""
        head = reason.strip().split("\n", 1)[0]
        for index, (location, text, traced) in enumerate(self.entries):
            if head in text:
                del self.entries[index]
                return location, traced
        return "", ()


def ddp_bucket_log() -> LogTap:
    """``(bucket cap, buckets)`` from DDPOptimizer's INFO line, one per graph it partitioned."""
    return LogTap([logging.getLogger(torch_compat.DDP_LOGGER)], torch_compat.parse_ddp_buckets)


def frame_skip_log() -> LogTap:
    """dynamo's INFO line saying it gave up on a frame it traced (torch < 2.10)."""
    return LogTap(
        [logging.getLogger(torch_compat.FRAME_SKIP_LOGGER)], lambda record: torch_compat.is_frame_skip(record) or None
    )


def _shape_decision(record: logging.LogRecord) -> tuple[str, str, str, str] | None:
    entry = torch_compat.parse_shape_decision(record)
    if entry is None or entry[0] != "fixed":
        return entry
    traced = torch_compat.traced_stack()  # the line dynamo was tracing as torch fixed the size, where it was
    return (*entry[:3], f"{entry[3]}, at {traced[-1]}" if traced else entry[3])


def shape_decision_log() -> LogTap:
    """The ShapeEnv's INFO lines (``TORCH_LOGS=dynamic``): each symbol's source, and each symbol torch fixed to one
    value (its specialization). Open to INFO, torch also writes where each shape guard came from: measured in
    docs/benchmarks.md."""
    return LogTap([logging.getLogger(torch_compat.SHAPE_LOGGER)], _shape_decision)


def specializations(entries: Sequence[tuple[str, str, str, str]]) -> tuple[str, ...]:
    """``"L['x'].size()[2] = 24 (range_refined_to_singleton, at unet.py:15)"`` for each size :func:`shape_decision_log`
    saw torch fix, named by the source of its symbol (the symbol itself where its creation was not seen)."""
    sources: dict[str, str] = {}
    fixed = []
    for kind, symbol, value, why in entries:
        if kind == "symbol":
            sources[symbol] = value
        else:
            fixed.append(f"{sources.get(symbol, symbol)} = {value} ({why})")
    return tuple(dict.fromkeys(fixed))


def _cache_bypass(record: logging.LogRecord) -> str | None:
    compile_cache.read_log(record)
    return torch_compat.parse_cache_bypass(record)


def cache_bypass_log() -> LogTap:
    """Why the FX graph or AOTAutograd cache was bypassed (torch's INFO lines); open down to DEBUG, where torch
    >= 2.13 computes AOTAutograd's key parts (8-10 ms a graph) and logs a miss before compiling (``read_log``)."""
    loggers = [logging.getLogger(name) for name in torch_compat.CACHE_BYPASS_LOGGERS]
    return LogTap(loggers, _cache_bypass, logging.DEBUG)
