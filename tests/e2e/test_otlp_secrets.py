"""A collector that refuses the credentials and echoes them back, in its own words: no stretch of the token (8
characters or more) reaches anything telemetry-jit prints or writes: its warnings, the end-of-run account, the
run file's health record, the summary read from it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]


def echoed(token: str) -> str:
    """What a collector answers: the token without the header's "Bearer ", its first 16 characters, its end."""
    return f"invalid credentials: {token} (prefix {token[:16]}..., ends ...{token[-12:]})"


class RefusingGrpcCollector(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """The collector's gRPC services answering every export UNAUTHENTICATED, the bearer token in the details."""

    def __init__(self) -> None:
        self.refused = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self.endpoint = f"http://127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC method name
        self.refused += 1
        token = dict(context.invocation_metadata()).get("authorization", "").removeprefix("Bearer ")
        context.abort(grpc.StatusCode.UNAUTHENTICATED, echoed(token))

    def stop(self) -> None:
        self._server.stop(grace=None).wait()


class RefusingHttpCollector:
    """OTLP/HTTP answering every request 401, the bearer token in the body (and in the reason phrase)."""

    def __init__(self) -> None:
        self.refused = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.refused += 1
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                body = echoed(token).encode()
                self.send_response(401, f"Unauthorized {token[:20]}")
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


FIT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.e2e.test_otlp_exporter import JIT
    from tests.models import TRAINER_DEFAULTS, Net, loader

    endpoint, protocol, headers, path = sys.argv[1:5]
    otlp = {"endpoint": endpoint, "protocol": protocol, "timeout": 2}
    if headers:
        otlp["headers"] = {"authorization": headers}
    session = telemetry_jit.configure("secrets", file=path, otlp=otlp)
    trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
    trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(12, 4))
    telemetry_jit.shutdown()
    print("fit done")
    """
)


def pieces(token: str) -> list[str]:
    return [token[i : i + 8] for i in range(len(token) - 7)]


@pytest.mark.parametrize(
    ("protocol", "given_in"),
    [("grpc", "argument"), ("http/protobuf", "variable")],
)
def test_a_token_the_collector_echoes_is_never_printed_or_written(protocol: str, given_in: str, tmp_path: Path) -> None:
    token = "sk-" + secrets.token_urlsafe(30)
    collector = RefusingGrpcCollector() if protocol == "grpc" else RefusingHttpCollector()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    environment.update(OTEL_BSP_SCHEDULE_DELAY="50", OTEL_METRIC_EXPORT_INTERVAL="200", PYTHONWARNINGS="always")
    environment.pop("TELEMETRY_JIT_RUN_ID", None)
    header = ""
    if given_in == "variable":
        environment["OTEL_EXPORTER_OTLP_HEADERS"] = f"authorization={quote('Bearer ' + token)}"
    else:
        header = f"Bearer {token}"
    path = tmp_path / "t.jsonl"
    try:
        fit = subprocess.run(
            [sys.executable, "-c", FIT, collector.endpoint, protocol, header, str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=environment,
            timeout=240,
        )
    finally:
        collector.stop()
    assert fit.returncode == 0 and "fit done" in fit.stdout, fit.stderr[-3000:]
    assert collector.refused >= 1  # the collector did answer, echoing the token
    summary = subprocess.run(
        [sys.executable, "-m", "telemetry_jit", "summary", str(path)], capture_output=True, text=True, env=environment
    )
    said = fit.stdout + fit.stderr
    assert "could not deliver spans" in said and ("UNAUTHENTICATED" in said or "401" in said), said[-3000:]
    everything = said + path.read_text() + summary.stdout + summary.stderr
    shown = [piece for piece in pieces(token) if piece in everything]
    assert not shown, (shown, said[-3000:])
