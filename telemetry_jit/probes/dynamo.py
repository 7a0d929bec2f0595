"""Probe for ``torch._dynamo``: its compile callbacks, compilation metrics, graph-break counters and log records
(through :mod:`telemetry_jit.compat.torch`) become :class:`CompileRecord` objects. The callbacks bracket every
compile (the graph-break counter grows only inside them); ``CompilationMetrics`` come *after* the end callback."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from telemetry_jit.boundary import call_site
from telemetry_jit.breaks import is_restart_note
from telemetry_jit.causes import normalize_reason, own_entries, telling_reason
from telemetry_jit.compat import compile_cache, compile_timers
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.notices import warn_once
from telemetry_jit.probes.log_taps import (
    GraphBreakLog,
    LogTap,
    cache_bypass_log,
    ddp_bucket_log,
    frame_skip_log,
    shape_decision_log,
    specializations,
)
from telemetry_jit.records import CacheLookup, CompileContext, CompileRecord, CompileResources, GraphBreak
from telemetry_jit.terminal import shown

TORCH = call_site("torch.dynamo_probe", "reading what torch._dynamo compiled (its metrics, counters and callbacks)")


class WindowMeter(Protocol):
    """Measures what a compile costs the host between its start and end callbacks (recording.resources)."""

    def begin(self) -> Any: ...

    def end(self, window: Any) -> CompileResources | None: ...


@dataclass
class _Window:
    """What the callbacks saw of one compile: its record so far, and the readings taken at its start."""

    record: CompileRecord  # frame and location left empty where the frame was not named as the user knows it
    breaks_before: dict[str, int]
    measuring: Any = None  # the meter's readings at the start
    timers: dict[str, int] = field(default_factory=dict)  # torch's timers at the start (compile_timers)
    phases_s: dict[str, float] = field(default_factory=dict)  # what they timed within it: said with its metrics


class DynamoProbe:
    """Observes torch._dynamo compiles from :meth:`attach` to :meth:`detach`: calls ``context``, ``on_compile_start``
    (what compiles, in words) as one begins, ``on_compile_end`` (what ``meter`` measured) as it ends; never raises."""

    def __init__(
        self,
        context: Callable[[], CompileContext] | None = None,
        on_compile_start: Callable[[str], None] | None = None,
        on_compile_end: Callable[[CompileResources | None], None] | None = None,
        meter: WindowMeter | None = None,
    ) -> None:
        self._context = context
        self._meter = meter
        # made once: torch's callback list is checked for them every step, by identity
        self._start_callback = torch_compat.never_traced(self._on_start)
        self._end_callback = torch_compat.never_traced(self._on_end)
        self._on_compile_start = on_compile_start
        self._on_compile_end = on_compile_end
        self._attached = False
        self._open: _Window | None = None
        # lists: under DDP every subgraph compiles its own lazy backward under one compile id
        self._finished: dict[tuple[str, bool], list[_Window]] = {}
        self._last_metric: Any = None
        # torch's live containers, peeked at every step (taken again at each look that calls torch)
        self._metrics: Sequence[Any] = ()
        self._start_callbacks: Sequence[Any] = ()
        # torch keeps its last 64 CompilationMetrics: they are taken at every compile's start, records made at poll
        self._collected: list[Any] = []
        self._frames: dict[str, tuple[str, str]] = {}
        self._backends: dict[str, str] = {}
        self._break_log = GraphBreakLog()
        self._ddp_log = ddp_bucket_log()
        self._skip_log = frame_skip_log()
        self._bypass_log = cache_bypass_log()
        self._shape_log = shape_decision_log()
        self._logs: list[LogTap] = [self._break_log, self._ddp_log, self._skip_log, self._bypass_log, self._shape_log]
        self._callers: dict[str, str] = {}  # compile id -> whose call it compiled: tells each entry's reason apart
        self._lookups: list[CacheLookup] = []
        self._settings_said: set[str] = set()  # settings tables written out since attaching
        # built with the trainer or loop, before the script loads any mega-cache artifacts (and again at attach)
        TORCH.call(compile_cache.watch_loaded_artifacts)
        # graph breaks torch counted while no callback was registered (after torch._dynamo.reset()
        # cleared them): counters since the last poll less what windows claimed
        self._breaks_at_poll: dict[str, int] = {}
        self._claimed: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    def attach(self) -> None:
        if self._attached:
            return
        for note in torch_compat.version_notes():
            warn_once(note, note)
        metrics = self._metrics = torch_compat.compilation_metrics()
        self._last_metric = metrics[-1] if metrics else None
        self._collected = []
        self._breaks_at_poll, self._claimed = dict(torch_compat.graph_break_counts()), {}
        for log in self._logs:
            log.install()
        self._settings_said.clear()  # each attachment (a fit, a loop) writes the settings it compiled with
        TORCH.call(compile_cache.watch_loaded_artifacts)
        TORCH.call(compile_cache.watch, self._on_cache_lookup)
        torch_compat.add_compile_callbacks(self._start_callback, self._end_callback)
        self._start_callbacks = torch_compat.compile_start_callbacks()
        self._attached = True

    def detach(self) -> None:
        """Stop observing: the log taps come off (the loggers as they were), then torch's callbacks."""
        if not self._attached:
            return
        self._attached = False
        for log in self._logs:
            log.uninstall()
        TORCH.call(compile_cache.unwatch, self._on_cache_lookup)
        TORCH.call(torch_compat.remove_compile_callbacks, self._start_callback, self._end_callback)

    def ensure_registered(self) -> None:
        """Register again if ``torch._dynamo.reset()`` cleared the callbacks."""
        self._start_callbacks = torch_compat.compile_start_callbacks()
        if self._attached and self._start_callback not in self._start_callbacks:
            torch_compat.add_compile_callbacks(self._start_callback, self._end_callback)

    def has_news(self) -> bool:
        """Whether torch recorded a compile since the last :meth:`poll`, or ``torch._dynamo.reset()`` cleared the
        callbacks. Called every step: it calls no torch function (torch changes these containers in place)."""
        metrics = self._metrics
        if self._collected or (metrics and metrics[-1] is not self._last_metric):
            return True
        return self._attached and self._start_callback not in self._start_callbacks

    # -- torch callbacks -----------------------------------------------------------------------
    def _on_start(self, args: Any) -> None:
        try:
            trigger = torch_compat.callback_trigger(args)
            if trigger is None:
                return
            self._collect()
            frame_id = torch_compat.compile_frame_id(args.compile_id)
            record = CompileRecord("dynamo", args.compile_id, trigger, 0, 0, backend=self._backends.get(frame_id, ""))
            if trigger == "dynamo":
                record.backend, where, record.options, record.callers, reasons = torch_compat.current_compile()
                record.caller, record.needs_backward = torch_compat.compile_caller()
                if record.caller and len(self._callers) < _MAX_CALLERS:
                    self._callers[args.compile_id] = record.caller
                if torch_compat.compile_attempt(args.compile_id) > 0:
                    record.recompile_reasons = reasons
                    # torch's metrics name the most recent entry's reason; an entry made for this caller says more
                    record.recompile_reason = telling_reason(own_entries(reasons, self._callers, record.caller))
                self._backends[frame_id] = record.backend
                if where is not None:  # one frame compiled for several modules names each compile's own
                    record.frame, record.location = self._frames[frame_id] = where
            for log in self._logs:
                log.entries.clear()
            self._lookups.clear()
            record.context = self._context() if self._context is not None else None
            if self._on_compile_start is not None:
                self._on_compile_start(self._describe(args.compile_id, trigger, record.recompile_reasons))
            record.start_ns = time.time_ns()
            self._open = _Window(
                record,
                breaks_before=dict(torch_compat.graph_break_counts()),
                measuring=self._meter.begin() if self._meter is not None else None,
                timers=compile_timers.snapshot(),
            )
        except Exception as error:  # noqa: BLE001 - a telemetry bug must not fail the compile
            _warn(error)

    def _describe(self, compile_id: str, trigger: str, reasons: tuple[str, ...]) -> str:
        name, location = self._frames.get(torch_compat.compile_frame_id(compile_id), ("a frame", ""))
        what = f"{name} ({shown(location)})" if location else name  # as the summary and the warnings write it
        if trigger == "lazy_backward":
            return f"the backward graph of {what} [{compile_id}]"
        if torch_compat.compile_attempt(compile_id) == 0:
            return f"{what} [{compile_id}]"
        own = own_entries(reasons, self._callers, self._callers.get(compile_id, ""))
        reason = normalize_reason(telling_reason(own) or torch_compat.recompile_reason_in_progress()) or "unknown"
        return f"{what} [{compile_id}, recompile: {reason}]"

    def _on_end(self, args: Any) -> None:
        try:
            if torch_compat.callback_trigger(args) is None:
                return
            if self._open is not None and self._meter is not None:
                self._open.record.resources = self._meter.end(self._open.measuring)
            if self._on_compile_end is not None:
                self._on_compile_end(self._open.record.resources if self._open is not None else None)
            window, self._open = self._open, None
            if window is None or window.record.compile_id != args.compile_id:
                return
            record = window.record
            record.end_ns = time.time_ns()
            window.phases_s = compile_timers.since(window.timers)
            record.graph_breaks = self._graph_breaks_since(window.breaks_before, record.callers)
            record.ddp_buckets = [buckets for _, buckets in self._ddp_log.entries]
            record.ddp_bucket_cap_bytes = max((cap for cap, _ in self._ddp_log.entries), default=0)
            self._ddp_log.entries.clear()
            record.cache_bypasses, self._bypass_log.entries = self._bypass_log.entries, []
            record.cache_lookups, self._lookups = self._lookups, []
            record.specializations = specializations(self._shape_log.entries)
            self._shape_log.entries.clear()
            self._finished.setdefault((record.compile_id, record.trigger == "dynamo"), []).append(window)
        except Exception as error:  # noqa: BLE001
            _warn(error)

    def _on_cache_lookup(self, lookup: compile_cache.Lookup) -> None:
        try:
            digest = lookup.settings_digest
            first = digest not in self._settings_said
            self._settings_said.add(digest)
            self._lookups.append(
                CacheLookup(
                    layer=lookup.layer,
                    state=lookup.state,
                    key=lookup.key,
                    parts=tuple((name, *part) for name, part in lookup.parts.items()),
                    settings=digest,
                    settings_parts=tuple((name, *part) for name, part in lookup.settings.items()) if first else (),
                    bypass_reason=lookup.bypass_reason,
                    saved_s=lookup.saved_s,
                    loaded=lookup.loaded,
                )
            )
        except Exception as error:  # noqa: BLE001
            _warn(error)

    def _graph_breaks_since(self, before: dict[str, int], callers: tuple[str, ...]) -> list[GraphBreak]:
        breaks = []
        for reason, count in torch_compat.graph_break_counts().items():
            for _ in range(count - before.get(reason, 0)):
                location, traced = self._break_log.take(reason)
                breaks.append(GraphBreak(reason, location, stack=_stack(callers, traced, location)))
                self._claimed[reason] = self._claimed.get(reason, 0) + 1
        # What is left was logged as a graph break but counted elsewhere by torch (e.g. "unimplemented"),
        # except dynamo giving up on an outer frame, which the inner frame's compile reports again.
        if not self._skip_log.entries:
            breaks.extend(
                GraphBreak(reason, location, counted_by_torch=False, stack=_stack(callers, traced, location))
                for location, reason, traced in self._break_log.entries
                if torch_compat.GRACEFUL_SKIP not in reason and not is_restart_note(reason)
            )
        self._break_log.entries.clear()
        self._skip_log.entries.clear()
        return breaks

    # -- reading results ---------------------------------------------------------------------
    def _collect(self) -> None:
        """Take the CompilationMetrics torch appended since the last look."""
        metrics = self._metrics = torch_compat.compilation_metrics()
        if not metrics or metrics[-1] is self._last_metric:
            return
        entries = list(metrics)
        start = next((i + 1 for i in range(len(entries) - 1, -1, -1) if entries[i] is self._last_metric), 0)
        self._collected.extend(entries[start:])
        self._last_metric = entries[-1]

    def poll(self, final: bool = False) -> list[CompileRecord]:
        """The compiles that finished since the last call (cheap when nothing happened); with ``final=True``,
        those whose metrics never appeared too, from what the callbacks alone saw."""
        self._collect()
        if not self._collected and not (final and self._finished):
            return []
        records = []
        windowless = []
        for metric in self._collected:
            if getattr(metric, "is_runtime", False):
                continue
            window = self._take_window(metric.compile_id, metric.is_forward is not False)
            records.append(self._record(metric, window))
            if window is None and records[-1].trigger == "dynamo":
                windowless.append(records[-1])
        self._collected = []
        self._attribute_unclaimed_breaks(windowless)
        if final:
            records.extend(self._named(window.record) for windows in self._finished.values() for window in windows)
            self._finished.clear()
        return records

    def _attribute_unclaimed_breaks(self, windowless: list[CompileRecord]) -> None:
        """Give the graph breaks torch counted outside every window to the frame compiles that had no
        window (compiled after ``torch._dynamo.reset()`` cleared the callbacks, before they were back)."""
        if self._open is not None:
            return  # a compile is tracing: its breaks are its own, counted when it ends
        now = torch_compat.graph_break_counts()
        unclaimed = {
            reason: count - self._breaks_at_poll.get(reason, 0) - self._claimed.get(reason, 0)
            for reason, count in now.items()
        }
        if windowless:
            windowless[0].graph_breaks.extend(
                GraphBreak(reason, self._break_log.take(reason)[0])
                for reason, count in unclaimed.items()
                for _ in range(count)
            )
        self._breaks_at_poll, self._claimed = dict(now), {}

    def _take_window(self, compile_id: Any, forward: bool) -> _Window | None:
        windows = self._finished.pop((str(compile_id), forward), [])
        if len(windows) > 1:
            self._finished[(str(compile_id), forward)] = windows[1:]
        return windows[0] if windows else None

    def _record(self, metric: Any, window: _Window | None) -> CompileRecord:
        """A compile from torch's CompilationMetrics, with what the callbacks saw of it (if anything)."""
        compile_id = str(metric.compile_id)
        frame_id = torch_compat.compile_frame_id(compile_id)
        if metric.co_name:  # a compile the callbacks did not see names its frame as its metrics say
            self._frames.setdefault(
                frame_id, torch_compat.frame_where(metric.co_name, metric.co_filename, metric.co_firstlineno)
            )
        if window is None:
            record = CompileRecord("dynamo", compile_id, "dynamo", 0, 0, backend=self._backends.get(frame_id, ""))
        else:
            record = window.record
            record.compile_id = compile_id
            record.phase_times_s = window.phases_s
        if metric.is_forward is False:
            record.trigger = "lazy_backward"
        if not record.recompile_reasons:
            record.recompile_reason = metric.recompile_reason or ""
        self._named(record)
        record.start_ns = metric.start_time_us * 1000 if metric.start_time_us else record.start_ns
        record.end_ns = metric.end_time_us * 1000 if metric.end_time_us else record.end_ns
        record.phase_times_s = {**torch_compat.phase_times(metric), **record.phase_times_s}
        record.failure, record.fell_back_to_eager, record.recompile_limit_hit = torch_compat.failure(metric)
        record.cache = torch_compat.cache_outcome(metric)
        record.extra = torch_compat.counts(metric)
        record.input_shapes = tuple(torch_compat.input_shapes(metric))
        record.own_duration_ns = torch_compat.duration_ns(metric)
        return record

    def _named(self, record: CompileRecord) -> CompileRecord:
        """``record`` with what is known of its frame when it is taken."""
        if not record.frame and not record.location:
            record.frame, record.location = self._frames.get(torch_compat.compile_frame_id(record.compile_id), ("", ""))
        record.is_recompile = torch_compat.compile_attempt(record.compile_id) > 0
        record.unavailable = tuple(sorted(torch_compat.UNAVAILABLE))
        return record


_MAX_CALLERS = 100_000  # compile ids whose caller is kept (a few bytes each)


def _stack(callers: tuple[str, ...], traced: tuple[str, ...], location: str) -> tuple[str, ...]:
    """The frames that led to a graph break, each once: the compiled frame's callers, the traced line, the break."""
    return tuple(frame for frame, _ in itertools.groupby(f for f in (*callers, *traced, location) if f))


def _warn(error: Exception) -> None:
    warn_once(
        "dynamo probe failed",
        f"telemetry-jit: dynamo probe failed ({error!r}); compile telemetry may be incomplete.",
    )


__all__ = ["DynamoProbe"]
