"""Compile metrics for Prometheus to scrape (``OTEL_METRICS_EXPORTER=prometheus``): OpenTelemetry's
``PrometheusMetricReader`` served over HTTP on ``OTEL_EXPORTER_PROMETHEUS_HOST``:``OTEL_EXPORTER_PROMETHEUS_PORT``
(the specification's defaults, localhost:9464). It carries no spans; docs/exporters.md has the metric names."""

from __future__ import annotations

import os
import threading
from typing import Any

from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter
from typing_extensions import override

from telemetry_jit.boundary import FAILED, call_site
from telemetry_jit.notices import NOWHERE, Notices

HOST_VARIABLE = "OTEL_EXPORTER_PROMETHEUS_HOST"
PORT_VARIABLE = "OTEL_EXPORTER_PROMETHEUS_PORT"
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 9464
EXTRA_HINT = "pip install 'telemetry-jit[prometheus]'"
_SDK = call_site("prometheus.serve", "OpenTelemetry's Prometheus exporter (starting its HTTP server)")


class PrometheusEndpoint(BaseExporter):
    """Serves this process's compile metrics (``/metrics``, Prometheus's text format) while the session runs.

    Arguments win over the variables, which win over the defaults. A port already taken (another rank on the same
    node, another job) costs a warning naming the port and the variable, never the run: metrics are then not served.

    Example::

        telemetry_jit.configure("train", exporters=[PrometheusEndpoint(port=9464)])
    """

    never_blocks = True  # serving happens on prometheus_client's own thread; span calls do nothing

    def __init__(self, host: str | None = None, port: int | None = None) -> None:
        super().__init__()
        self._notices = Notices()
        self.host = host or _environ(HOST_VARIABLE) or DEFAULT_HOST
        self.port = port if port is not None else self._port_variable()
        self._service_name: str | None = None
        self._meter_provider: Any = None
        self._server: Any = None
        self._started = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PrometheusEndpoint(host={self.host!r}, port={self.port})"

    def with_service_name(self, service_name: str) -> None:
        """``service.name`` on ``target_info`` where the environment names none (``configure``'s application name)."""
        self._service_name = service_name

    def _warn(self, kind: str, message: str) -> None:
        self._notices.warn(kind, message, every_rank=True, origin=NOWHERE)

    def _port_variable(self) -> int:
        value = _environ(PORT_VARIABLE)
        if value is None:
            return DEFAULT_PORT
        try:
            port = int(value)
        except ValueError:
            port = -1
        if not 0 <= port <= 65535:  # the specification: warn and use the default, never stop the job
            self._warn(
                "port",
                f"telemetry-jit: {PORT_VARIABLE}={value!r} is no TCP port (0 to 65535); Prometheus metrics are "
                f"served on the default port {DEFAULT_PORT} instead.",
            )
            return DEFAULT_PORT
        return port

    @property
    def meter_provider(self) -> Any:
        """The provider whose metrics are served (``None`` when the server could not start)."""
        with self._lock:
            if not self._started and self.ready:
                self._started = True
                started = _SDK.call(self._start)  # what fails there is said once and counted, never raised
                self._meter_provider = None if started is FAILED else started
        return self._meter_provider

    def _start(self) -> Any:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as error:  # a cluster-wide variable must not stop a job installed without the extra
            self._warn(
                "not installed",
                f"telemetry-jit: OTEL_METRICS_EXPORTER=prometheus needs OpenTelemetry's Prometheus exporter "
                f"({error.name} is not installed): {EXTRA_HINT}. Training goes on without serving metrics.",
            )
            return None
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource

        registry = CollectorRegistry()  # this session's own: a second configure in the process registers again
        try:
            reader = PrometheusMetricReader(registry=registry)
        except TypeError:  # older releases (the keyword came in 2026) take no registry: theirs is the global one
            from prometheus_client import REGISTRY as registry

            reader = PrometheusMetricReader()
        try:
            self._server, _ = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError as error:
            reader.shutdown()
            reason = error.strerror or str(error)
            self._warn(
                "port in use",
                f"telemetry-jit: could not serve Prometheus metrics on {self.host}:{self.port} ({reason}); training "
                f"goes on without them. Set {PORT_VARIABLE} (or {HOST_VARIABLE}) to a free one; "
                "ranks sharing a node each need their own.",
            )
            return None
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the application name (Resource.create reads them)
        named = {"service.name": self._service_name} if self._service_name and not _environ("OTEL_SERVICE_NAME") else {}
        return MeterProvider(resource=Resource.create(named), metric_readers=[reader], shutdown_on_exit=False)

    def force_flush(self, timeout_seconds: float | None = None) -> bool:
        return True  # Prometheus pulls: nothing waits to be sent

    @override
    def export_start(self, span: Span) -> None:
        pass

    @override
    def export_stop(self, span: Span) -> None:
        pass

    @override
    def export_event(self, event: Event, span: Span) -> None:
        pass

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        pass

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        pass

    @override
    def close(self) -> None:
        """Stop serving: the run is over, and Prometheus marks the series stale at its next scrape."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._meter_provider is not None:
            self._meter_provider.shutdown()
        if self.ready:
            super().close()


def _environ(name: str) -> str | None:
    value = os.environ.get(name)
    return value.strip() if value and value.strip() else None  # empty counts as unset
