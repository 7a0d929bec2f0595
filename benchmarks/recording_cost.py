"""Cost of recording one compilation span with its events (prints figures; not a test).

    python benchmarks/recording_cost.py [--spans 2000] [--alone]

Records synthetic compile records (each with three graph breaks, a recompile reason and phase
times) through the real recorder into a provider whose exporter is a JSON Lines file, and prints
the time per span: what telemetry-jit adds to a compilation. Beside each, interleaved, the same
span and events recorded through nv-one-logger's own span calls (``start``, ``event``, ``stop``)
into the same file: the ratio between the two is the figure to compare across machines.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from nv_one_logger.core.attributes import Attributes
from nv_one_logger.core.event import Event
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.training_telemetry.api.callbacks import on_app_end, on_app_start
from nv_one_logger.training_telemetry.api.training_recorder import TrainingRecorder

import telemetry_jit
from telemetry_jit.recording.compile_spans import graph_break_attributes, record_attributes
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.records import CompileContext, CompileRecord, GraphBreak
from telemetry_jit.schema import JitEventName, JitSpanName


def record(index: int) -> CompileRecord:
    now = time.time_ns()
    return CompileRecord(
        source="dynamo",
        compile_id=f"0/{index}",
        trigger="dynamo",
        start_ns=now - 5_000_000,
        end_ns=now,
        backend="inductor",
        frame="forward",
        location="/app/model.py:42",
        is_recompile=index > 0,
        recompile_reason="0/0: tensor 'x' size mismatch at index 0. expected 32, actual 26",
        graph_breaks=[GraphBreak("Failed to trace builtin operator\n  Explanation: ...", "/app/model.py:45")] * 3,
        phase_times_s={"dynamo": 0.003, "backend": 0.002},
        extra={"graph_op_count": 12, "guard_count": 30},
    )


def nv_one_logger_span_calls(recorder: TrainingRecorder, item: CompileRecord, context: CompileContext) -> None:
    """The same span and events through nv-one-logger's own API, as a span that is open while it runs."""
    start = TracingTimestamp.for_timestamp(item.start_ns / 1e9, validate_timestamp=False)
    span = recorder.start(
        JitSpanName.COMPILATION,  # an enum member: nv-one-logger's name check rejects a plain str on Python 3.11
        span_attributes=Attributes(record_attributes(item, context)),
        start_time=start,
        parent_span=context.parent,
    )
    for graph_break in item.graph_breaks:
        attributes = Attributes(graph_break_attributes(graph_break))
        recorder.event(span, Event.create(JitEventName.GRAPH_BREAK, attributes, timestamp=start))
    recorder.stop(span, stop_time=TracingTimestamp.for_timestamp(item.end_ns / 1e9, validate_timestamp=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=2000)
    parser.add_argument("--alone", action="store_true", help="without nv-one-logger's own calls beside each span")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        provider = telemetry_jit.configure("recording-cost", file=Path(folder) / "t.jsonl")
        recorder = CompileRecorder(provider)
        context = CompileContext(global_step=7, stage="train", parent=on_app_start())
        recorder.start(lambda: Position(7, "train"))
        records = [record(i) for i in range(args.spans)]
        for item in records:
            item.context = context
        samples, own = [], []
        for item in records:
            start = time.perf_counter_ns()
            recorder.record(item)
            samples.append(time.perf_counter_ns() - start)
            if not args.alone:
                start = time.perf_counter_ns()
                nv_one_logger_span_calls(provider.recorder, item, context)
                own.append(time.perf_counter_ns() - start)
        recorder.stop()
        on_app_end()
    ours = statistics.median(samples) / 1000
    print(f"{args.spans} compilation spans, 3 graph-break events each, to a JSON Lines file")
    print(f"median per span:    {ours:8.1f} us   (p95 {sorted(samples)[int(0.95 * len(samples))] / 1000:.1f} us)")
    if own:
        theirs = statistics.median(own) / 1000
        print(f"nv-one-logger's own span calls for the same span: {theirs:8.1f} us   (ratio {ours / theirs:.2f})")


if __name__ == "__main__":
    main()
