"""Throughput of the exporters, seen from the training thread (prints figures; not a test).

    python benchmarks/exporter_throughput.py [--spans 5000]

Each exporter receives ``--spans`` finished spans (start, one event, stop) through nv-one-logger's
recorder: the JSON Lines file, OTLP/gRPC to a real receiver on loopback, and OTLP/gRPC to a
collector that is down. Reported: spans per second the training thread can hand over, and for
OTLP how many the receiver got.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path

from nv_one_logger.core.attributes import Attributes
from nv_one_logger.core.event import Event
from nv_one_logger.training_telemetry.api.callbacks import on_app_end, on_app_start

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.exporters import OTLPExporter
from telemetry_jit.schema import JitSpanName

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.otlp_receivers import GrpcReceiver  # noqa: E402 - a real receiver, shared with the tests


def spans_per_second(exporter: OTLPExporter | None, folder: Path, count: int) -> float:
    nv_one_logger_compat.forget_configuration()
    file = folder / "t.jsonl" if exporter is None else None
    provider = telemetry_jit.configure("throughput", file=file, otlp=exporter if exporter is not None else False)
    on_app_start()
    recorder = provider.recorder
    attributes = Attributes({"compile.id": "0/1", "compile.frame": "forward", "train.global_step": 7})
    start = time.perf_counter()
    for _ in range(count):
        span = recorder.start(span_name=JitSpanName.COMPILATION, span_attributes=attributes)
        recorder.event(span, Event.create("graph_break", Attributes({"graph_break.reason": "print"})))
        recorder.stop(span)
    seconds = time.perf_counter() - start
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_app_end()
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        file_rate = spans_per_second(None, folder, args.spans)

        receiver = GrpcReceiver()
        up = OTLPExporter(receiver.endpoint, protocol="grpc", timeout=5)
        up_rate = spans_per_second(up, folder, args.spans)
        receiver.stop()
        received = len(receiver.received.spans())

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        down = OTLPExporter(f"http://127.0.0.1:{port}", protocol="grpc", timeout=1)
        down_rate = spans_per_second(down, folder, args.spans)
    print(f"{args.spans} spans (start, 1 event, stop) handed over by the training thread")
    print(f"JSON Lines file:          {file_rate:10.0f} spans/s")
    print(f"OTLP/gRPC, collector up:  {up_rate:10.0f} spans/s  (receiver got {received} spans incl. application)")
    print(f"OTLP/gRPC, collector down:{down_rate:10.0f} spans/s  (lost {down.dropped}, reported once at app end)")


if __name__ == "__main__":
    main()
