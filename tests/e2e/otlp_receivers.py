"""Real OTLP receivers on loopback for the tests: the collector's gRPC TraceService and OTLP/HTTP."""

from __future__ import annotations

import gzip
import socket
import ssl
import struct
import subprocess
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_unix_ns: int
    end_unix_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    status_code: int
    resource: dict[str, Any]


@dataclass
class MetricPoint:
    name: str
    unit: str
    attributes: dict[str, Any]
    value: float  # a sum's value, a histogram's sum
    count: int  # a histogram's count; 0 for a sum
    resource: dict[str, Any]


@dataclass
class Received:
    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = field(default_factory=list)
    refused: int = 0  # requests refused as too large

    def metric_points(self) -> list[MetricPoint]:
        """The data points of the last request that held each metric (cumulative: the latest counts)."""
        latest: dict[tuple[str, tuple[tuple[str, Any], ...]], MetricPoint] = {}
        for request in self.metric_requests:
            for resource_metrics in request.resource_metrics:
                resource = _attributes(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            attributes = _attributes(point.attributes)
                            if kind in ("histogram", "exponential_histogram"):
                                value, count = point.sum, point.count
                            else:
                                value, count = point.as_double or point.as_int, 0
                            key = (metric.name, tuple(sorted(attributes.items())))
                            latest[key] = MetricPoint(metric.name, metric.unit, attributes, value, count, resource)
        return list(latest.values())

    def spans(self) -> list[ReceivedSpan]:
        spans = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                start_unix_ns=span.start_time_unix_nano,
                                end_unix_ns=span.end_time_unix_nano,
                                attributes=_attributes(span.attributes),
                                events=[(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events],
                                status_code=span.status.code,
                                resource=resource,
                            )
                        )
        return spans


class _GrpcMetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC method name
        self.received.metric_requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The collector's ``TraceService`` and ``MetricsService`` on 127.0.0.1."""

    def __init__(self, port: int = 0, tls: tuple[Path, Path] | None = None) -> None:
        self.received = Received()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_GrpcMetricsService(self.received), self._server)
        if tls is None:
            self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            certificate, key = (path.read_bytes() for path in tls)
            credentials = grpc.ssl_server_credentials([(key, certificate)])
            self.port = self._server.add_secure_port(f"127.0.0.1:{port}", credentials)
        self.scheme = "https" if tls else "http"
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC method name
        self.received.requests.append(request)
        self.received.metadata.append(dict(context.invocation_metadata()))
        self.received.raw.append(request.SerializeToString())
        return trace_service_pb2.ExportTraceServiceResponse()

    def stop(self) -> None:
        self._server.stop(grace=None).wait()


class HttpReceiver:
    """OTLP/HTTP (protobuf) on 127.0.0.1, paths ``/v1/traces`` and ``/v1/metrics``; a request larger
    than ``max_bytes`` is refused with 413, as collectors configured with a body limit do, the first
    ``refuse_first`` trace requests with 400 (a collector that cannot take them yet; not retried), and with
    ``traces_only`` every metrics request with 405 (a backend that takes traces only)."""

    def __init__(
        self,
        delay: float = 0.0,
        tls: tuple[Path, Path] | None = None,
        port: int = 0,
        max_bytes: int = 0,
        refuse_first: int = 0,
        traces_only: bool = False,
    ) -> None:
        self.received = Received()
        received = self.received
        refusals = self.refusals = [refuse_first]  # trace requests still to refuse

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                time.sleep(delay)  # a slow collector
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                restarting = self.path == "/v1/traces" and refusals[0] > 0
                refusals[0] -= restarting
                if traces_only and self.path == "/v1/metrics":
                    received.refused += 1
                    self.send_response(405, "Method Not Allowed")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if restarting or (max_bytes and len(body) > max_bytes):
                    received.refused += 1
                    self.send_response(400 if restarting else 413, "Not Yet" if restarting else "Too Large")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
                    metrics.ParseFromString(body)
                    received.metric_requests.append(metrics)
                    payload = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                elif self.path == "/v1/traces":
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.requests.append(request)
                    received.metadata.append({k.lower(): v for k, v in self.headers.items()})
                    received.raw.append(body)
                    payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls else "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/v1/traces"

    def refuse(self, requests: int) -> None:
        """Refuse the next ``requests`` trace requests (400)."""
        self.refusals[0] = requests

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class MisbehavingCollector:
    """A collector on 127.0.0.1 that never accepts a span, in one of these ways:

    ``black-hole`` accepts connections and never answers; ``reset`` accepts and resets each one;
    ``429`` / ``503`` answer OTLP/HTTP with that status (``Retry-After: 1``).
    """

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.port}" + ("/v1/traces" if protocol == "http/protobuf" else "")

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.behaviour == "black-hole":
                self._held.append(connection)  # open, never read, never answered
            elif self.behaviour == "reset":
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()  # RST
            else:
                threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            while True:
                headers = []
                while (line := stream.readline()) not in (b"\r\n", b""):
                    headers.append(line.decode("latin-1").lower())
                if not headers:
                    return
                length = next((int(h.split(":")[1]) for h in headers if h.startswith("content-length:")), 0)
                stream.read(length)
                status = {"429": "429 Too Many Requests", "503": "503 Service Unavailable"}[self.behaviour]
                connection.sendall(
                    f"HTTP/1.1 {status}\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n".encode("latin-1")
                )

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()
        for connection in self._held:
            connection.close()
        self._listener.close()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """``(certificate, key)`` for localhost and 127.0.0.1, made with the openssl command."""
    certificate, key = folder / "collector.crt", folder / "collector.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(certificate),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key
