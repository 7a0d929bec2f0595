"""PrometheusEndpoint: where it serves, what it serves, and a port it cannot have."""

from __future__ import annotations

import socket
import urllib.request
import warnings

import pytest

from telemetry_jit.exporters.prometheus import DEFAULT_PORT, PORT_VARIABLE, PrometheusEndpoint
from telemetry_jit.schema import MetricName

pytest.importorskip("opentelemetry.exporter.prometheus", reason="the prometheus extra is not installed")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_specifications_defaults_and_arguments_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_VARIABLE, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_PROMETHEUS_HOST", raising=False)
    endpoint = PrometheusEndpoint()
    assert (endpoint.host, endpoint.port) == ("localhost", 9464)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv(PORT_VARIABLE, "9999")
    assert (PrometheusEndpoint().host, PrometheusEndpoint().port) == ("127.0.0.1", 9999)
    assert PrometheusEndpoint(host="0.0.0.0", port=1234).port == 1234


@pytest.mark.parametrize("value", ["http", "70000", "-1"])
def test_a_port_variable_that_is_no_port_is_warned_and_the_default_used(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PORT_VARIABLE, value)
    with pytest.warns(RuntimeWarning, match=f"{PORT_VARIABLE}={value!r} is no TCP port"):
        assert PrometheusEndpoint().port == DEFAULT_PORT


def test_it_serves_the_metrics_while_open_and_frees_the_port_at_close() -> None:
    port = _free_port()
    endpoint = PrometheusEndpoint(host="127.0.0.1", port=port)
    assert endpoint.meter_provider is None  # not yet initialized: nothing listens
    endpoint.initialize()
    endpoint.with_service_name("served-app")
    provider = endpoint.meter_provider
    assert provider is not None and endpoint.meter_provider is provider
    provider.get_meter("telemetry_jit").create_counter(MetricName.COMPILATIONS).add(2, {"telemetry_jit.rank": 0})
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "telemetry_jit_compilations_total{" in text and 'telemetry_jit_rank="0"} 2.0' in text
    assert 'service_name="served-app"' in text  # the resource, on target_info
    endpoint.close()
    after = PrometheusEndpoint(host="127.0.0.1", port=port)  # the port is free again: the next run serves there
    after.initialize()
    assert after.meter_provider is not None
    after.close()


def test_a_port_in_use_is_one_warning_naming_port_and_variable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = PrometheusEndpoint(host="127.0.0.1", port=port)
        endpoint.initialize()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            assert endpoint.meter_provider is None
            assert endpoint.meter_provider is None  # asked again: not tried, not said again
        endpoint.close()
    (warning,) = said
    assert f"127.0.0.1:{port}" in str(warning.message) and PORT_VARIABLE in str(warning.message)


@pytest.mark.parametrize(
    ("variables", "served"),
    [
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, True),
        ({"OTEL_METRICS_EXPORTER": "otlp,prometheus"}, True),
        ({"OTEL_METRICS_EXPORTER": "otlp"}, False),
        ({}, False),
        ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_configure_serves_metrics_where_otel_metrics_exporter_names_prometheus(
    variables: dict[str, str], served: bool, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telemetry_jit
    from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat

    for name in ("OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**variables, PORT_VARIABLE: str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    nv_one_logger_compat.forget_configuration()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OTEL_SDK_DISABLED is said; not the point here
        session = telemetry_jit.configure("served", file=tmp_path / "t.jsonl")
    try:
        endpoints = [e for e in session.exporters if isinstance(e, PrometheusEndpoint)]
        assert len(endpoints) == served
        if served:
            assert endpoints[0].meter_provider is not None
            port = endpoints[0].port
            assert urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=5).status == 200
    finally:
        session.shutdown()
        nv_one_logger_compat.forget_configuration()
