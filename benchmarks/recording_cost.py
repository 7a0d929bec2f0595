"""Cost of recording one compilation span with its events (prints figures; not a test).

    python benchmarks/recording_cost.py [--spans 2000]

Records synthetic compile records (each with three graph breaks, a recompile reason and phase
times) through the real recorder into a provider whose exporter is a JSON Lines file, and prints
the time per span: what telemetry-jit adds to a compilation. Target: under 100 us.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from nv_one_logger.training_telemetry.api.callbacks import on_app_end, on_app_start

import telemetry_jit
from telemetry_jit.recording.recorder import CompileContext, CompileRecorder
from telemetry_jit.recording.records import CompileRecord, GraphBreak


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        provider = telemetry_jit.configure("recording-cost", file=Path(folder) / "t.jsonl")
        recorder = CompileRecorder(provider)
        context = CompileContext(global_step=7, stage="train", parent=on_app_start())
        records = [record(i) for i in range(args.spans)]
        for item in records:
            item.context = context
        samples = []
        for item in records:
            start = time.perf_counter_ns()
            recorder._record(item)
            samples.append(time.perf_counter_ns() - start)
        size = (Path(folder) / "t.jsonl").stat().st_size
        on_app_end()
    print(f"{args.spans} compilation spans, 3 graph-break events each, to a JSON Lines file")
    print(f"median per span: {statistics.median(samples) / 1000:8.1f} us   (target: under 100 us)")
    print(f"p95 per span:    {sorted(samples)[int(0.95 * len(samples))] / 1000:8.1f} us")
    print(f"file bytes per span: {size / args.spans:8.0f}")


if __name__ == "__main__":
    main()
