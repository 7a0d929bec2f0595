"""Chrome Trace Event / Perfetto JSON from telemetry files, in absolute time: one process per run and rank,
compile spans nested under the loops that were running, other tools' traces of the same run merged in."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from typing import Any

from telemetry_jit.analysis.runs import TelemetryRun, number, run_status
from telemetry_jit.identity import short_run_id
from telemetry_jit.owned_files import OwnKind
from telemetry_jit.schema import JitSpanName


def _args(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value not in ("", None, [])}


TIME_ORIGIN = (
    "the Unix epoch: ts are microseconds since 1970-01-01 UTC, as in torch's own compile trace (TORCH_TRACE, "
    "tlparse's chromium_events.json), so the two overlay; torch.profiler traces are laid on it through their "
    "baseTimeNanoseconds"
)
_OWN_TID = 1
# tracks of no process (torch's compile trace puts everything on pid 0) are numbered above the largest pid Linux
# can give (PID_MAX_LIMIT, 2**22), so that none looks like, or lands on, a real process's track
_NO_PROCESS_PIDS = 2**22


def to_trace_events(runs: Sequence[TelemetryRun], others: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    """The runs as a Trace Event document in absolute time (:data:`TIME_ORIGIN`), ``others`` (``(name, document)``:
    tlparse's, ``torch.profiler``'s) merged in. Each run and rank is a process (its OS pid where known, so a profile
    of it joins its track); a span that never ended lasts to its rank's last timestamp, ``"unfinished": true``."""
    own = [run.pid for run in runs]  # one pid per run and rank: the OS pid when every run has its own, else 1, 2, ...
    pids = own if all(own) and len(set(own)) == len(own) else list(range(1, len(runs) + 1))
    events = [event for run, pid in zip(runs, pids, strict=True) for event in _run_events(run, pid)]
    taken = set(pids)
    for name, document in others:
        events += _merged(name, document, taken)
    said = []  # each run's track, and the spans and events beyond what the reader keeps (not drawn), by name
    for run, pid in zip(runs, pids, strict=True):
        track: dict[str, Any] = {"run": run.run_id, "rank": run.rank, "pid": pid}
        for name, counts in (("spans_not_drawn", run.spans_not_kept), ("events_not_drawn", run.events_not_kept)):
            if counts:
                track[name] = dict(counts)
        said.append(track)
    return {  # the producer first: the file's head tells that telemetry-jit wrote it (TRACE)
        "otherData": {"producer": "telemetry-jit", "time_origin": TIME_ORIGIN, "runs": said},
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }


# what every trace begins with (as to_json writes it): `trace -o` replaces a file only where it is one
TRACE = OwnKind("trace", lambda head: head.startswith(b'{"otherData": {"producer": "telemetry-jit"'))


def _run_events(run: TelemetryRun, pid: int) -> list[dict[str, Any]]:
    status = run_status(run)
    label = f"run {short_run_id(run.run_id)} rank {run.rank} {run.node}".strip()
    label += "" if status.finished else f" ({status.state})"
    events = [
        _metadata("process_name", pid, 0, {"name": label}),
        _metadata("process_sort_index", pid, 0, {"sort_index": run.rank}),
        _metadata("thread_name", pid, _OWN_TID, {"name": "telemetry-jit"}),
    ]
    last = max((s.end_unix_ns or s.start_unix_ns for s in run.spans.values()), default=0)
    # parents before children when they start together, so viewers nest them
    for span in sorted(run.spans.values(), key=lambda s: (s.start_unix_ns, -(s.end_unix_ns or s.start_unix_ns))):
        end = span.end_unix_ns if span.end_unix_ns is not None else last
        args = _args(span.attributes)
        if span.end_unix_ns is None:
            args["unfinished"] = True
        cat = "compile" if span.name == JitSpanName.COMPILATION else "training"
        duration = max(end - span.start_unix_ns, 0) / 1000
        events.append(_event(span.name, cat, pid, args, ph="X", ts=span.start_unix_ns / 1000, dur=duration))
        for event in span.events:
            cat = "error" if event.is_error else "event"
            events.append(
                _event(event.name, cat, pid, _args(event.attributes), ph="i", s="t", ts=event.time_unix_ns / 1000)
            )
    return events


def _event(name: str, cat: str, pid: int, args: dict[str, Any], **kind: object) -> dict[str, Any]:
    """A span (``ph="X"``) or an instant (``ph="i"``) on the run's own thread."""
    return {"name": name, "cat": cat, **kind, "pid": pid, "tid": _OWN_TID, "args": args}


MAX_MERGED_BYTES = 2**30  # another tool's trace: torch.profiler exports of long runs reach hundreds of MB


def read_foreign_trace(path: str | os.PathLike[str]) -> Any:
    """Another tool's trace (``trace --with``): a regular file of at most :data:`MAX_MERGED_BYTES`. ValueError
    says why a file is none (a device or FIFO, too large or deep, not JSON, no Trace Event document)."""
    # opened without waiting: a FIFO's open would block until some process writes to it
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("not a regular file (a device or a pipe): pass the trace's file")
        data = handle.read(MAX_MERGED_BYTES + 1)
    if len(data) > MAX_MERGED_BYTES:
        raise ValueError(f"larger than {MAX_MERGED_BYTES // 2**20} MiB, more than telemetry-jit merges")
    try:
        document = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply to be a trace") from None
    except MemoryError:
        raise ValueError("too large to read") from None
    except UnicodeDecodeError:
        raise ValueError("not text (binary data)") from None
    foreign_trace_events(document)
    return document


# what a Trace Event may hold (the Trace Event Format, as Chrome and Perfetto read it): only these are copied from
# another tool's trace, so a JSON file that is something else (a config with a password) adds nothing to ours
TRACE_EVENT_FIELDS = frozenset(
    ("name", "cat", "ph", "ts", "tts", "dur", "tdur", "pid", "tid", "id", "id2", "bp", "scope", "s", "args", "cname")
    + ("sf", "stack", "esf", "estack", "bind_id", "flow_in", "flow_out", "use_async_tts")
)
# the phases of the Trace Event Format: duration, complete, instant, counter, async, flow, sample, object,
# metadata, memory dump, mark, clock sync and context events
PHASES = frozenset("BEXiICbnSTpFestfPONDMVvRc()")
_NOT_A_TRACE = "--with takes a Chrome or Perfetto trace (JSON: an object with traceEvents, or a list of events)"


def foreign_trace_events(document: Any) -> list[dict[str, Any]]:
    """The events of a Trace Event document (a list of events, or an object with ``traceEvents``), each with only
    its Trace Event fields; ValueError naming the first element that is no event (an object with a phase ``ph``
    and, where given, a numeric ``ts``)."""
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise ValueError(f"not a Trace Event document: {_NOT_A_TRACE}")
    for index, event in enumerate(events):
        phase = event.get("ph") if isinstance(event, dict) else None
        if not isinstance(phase, str) or phase not in PHASES:
            raise ValueError(
                f"element {index} of its events is no trace event (it has no phase 'ph' the Trace Event Format "
                f"defines): {_NOT_A_TRACE}; nothing of it is copied"
            )
        if "ts" in event and (isinstance(event["ts"], bool) or not isinstance(event["ts"], (int, float))):
            raise ValueError(f"element {index} of its events has a 'ts' that is no number: {_NOT_A_TRACE}")
    return [{key: value for key, value in event.items() if key in TRACE_EVENT_FIELDS} for event in events]


def _merged(name: str, document: Any, taken: set[int]) -> list[dict[str, Any]]:
    """Another tool's trace in absolute time (``baseTimeNanoseconds`` added); pid 0 renumbered above any real pid."""
    base_us = number(document.get("baseTimeNanoseconds")) / 1000 if isinstance(document, dict) else 0.0
    renamed: dict[Any, int] = {}
    events = []
    for event in foreign_trace_events(document):  # copies, of the events' known fields only
        if isinstance(event.get("ts"), (int, float)) and event.get("ph") != "M":
            event["ts"] = event["ts"] + base_us
        if event.get("pid") in (0, None):  # a pid of a real process stays: the profile of a run's process joins it
            pid = renamed.setdefault(event.get("pid"), max(_NO_PROCESS_PIDS, *taken) + 1)
            taken.add(pid)
            event["pid"] = pid
        events.append(event)
    events += [
        _metadata("process_name", pid, 0, {"name": f"{name} (no process: pid {old} in that file)"})
        for old, pid in renamed.items()
    ]
    return events


def _metadata(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}
