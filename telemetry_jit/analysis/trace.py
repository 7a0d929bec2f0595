"""Chrome Trace Event / Perfetto JSON from telemetry files: one track per rank, compile spans
nested under the loops that were running."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telemetry_jit.analysis.reader import SpanRecord, TelemetryRun
from telemetry_jit.analysis.status import run_status
from telemetry_jit.identity import short_run_id
from telemetry_jit.schema import JitSpanName


def _args(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in attributes.items() if value not in ("", None, [])}


def to_trace_events(runs: Sequence[TelemetryRun]) -> dict[str, Any]:
    """The runs as a Trace Event Format document (``{"traceEvents": [...]}``, times in µs).

    Each rank is a process (``pid`` = rank) with one thread; spans are complete events (``ph: X``)
    that nest by time, so compilations sit inside the loop that was running; span events such as
    ``graph_break`` are thread-scoped instant events. A span that never ended (the process was
    killed) lasts until the last timestamp of its rank and carries ``"unfinished": true``.
    """
    starts = [span.start_unix_ns for run in runs for span in run.spans.values()]
    origin = min(starts) if starts else 0
    events: list[dict[str, Any]] = []
    for run in runs:
        pid = run.rank
        node = run.node
        status = run_status(run)
        label = f"rank {pid} {node}".strip() + ("" if status.finished else f" ({status.state})")
        for name, tid, metadata in (
            ("process_name", 0, {"name": label}),
            ("process_sort_index", 0, {"sort_index": pid}),
            ("thread_name", 1, {"name": f"run {short_run_id(run.run_id)}"}),
        ):
            events.append({"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": metadata})
        last = max((s.end_unix_ns or s.start_unix_ns for s in run.spans.values()), default=origin)
        for span in sorted(run.spans.values(), key=_order):
            end = span.end_unix_ns if span.end_unix_ns is not None else last
            args = _args(span.attributes)
            if span.end_unix_ns is None:
                args["unfinished"] = True
            events.append(
                {
                    "name": span.name,
                    "cat": "compile" if span.name == JitSpanName.COMPILATION else "training",
                    "ph": "X",
                    "ts": (span.start_unix_ns - origin) / 1000,
                    "dur": max(end - span.start_unix_ns, 0) / 1000,
                    "pid": pid,
                    "tid": 1,
                    "args": args,
                }
            )
            for event in span.events:
                events.append(
                    {
                        "name": event.name,
                        "cat": "error" if event.is_error else "event",
                        "ph": "i",
                        "s": "t",
                        "ts": (event.time_unix_ns - origin) / 1000,
                        "pid": pid,
                        "tid": 1,
                        "args": _args(event.attributes),
                    }
                )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"producer": "telemetry-jit"}}


def _order(span: SpanRecord) -> tuple[int, int]:
    # parents before children when they start together, so viewers nest them
    return span.start_unix_ns, -(span.end_unix_ns or span.start_unix_ns)
