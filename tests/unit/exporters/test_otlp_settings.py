"""OTLP settings: arguments over OpenTelemetry's variables over defaults; an argument that would send nothing
refused when the exporter is built, a variable OpenTelemetry cannot use warned of once, naming it, and replaced by its
default (the specification)."""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from dataclasses import replace

import pytest
from opentelemetry.util.re import parse_env_headers

from telemetry_jit.exporters.otlp_settings import (
    OTLPOptions,
    OTLPSettings,
    OTLPSettingsError,
    redact_url,
    traces_exporter_wanted,
)

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_SERVICE_NAME",
    "OTEL_METRICS_EXPORTER",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_SDK_DISABLED",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def resolve(**options: object) -> OTLPSettings:
    return OTLPSettings.resolve(OTLPOptions(**options))  # type: ignore[arg-type]


def test_defaults_are_opentelemetrys() -> None:
    settings = resolve()
    traces = settings.targets["traces"]
    assert (traces.protocol, traces.endpoint, traces.timeout_s) == ("grpc", "localhost:4317", 10.0)
    assert dict(settings.batch) == {"max_queue_size": 2048, "schedule_delay_millis": 5000, "max_export_batch_size": 512}
    assert settings.flush_timeout_s == 10.0 and settings.metrics


def test_http_endpoints_follow_the_base_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    settings = resolve()
    assert (settings.targets["traces"].endpoint, settings.targets["metrics"].endpoint) == (
        "http://collector:4318/v1/traces",
        "http://collector:4318/v1/metrics",
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "OTEL_BSP_MAX_QUEUE_SIZE=0.0: must be a number of spans greater than 0"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "-5", "OTEL_BSP_MAX_QUEUE_SIZE=-5.0: must be a number of spans greater than 0"),
        ("OTEL_BSP_SCHEDULE_DELAY", "0", "OTEL_BSP_SCHEDULE_DELAY=0.0: must be a number of milliseconds"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "-1", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=-1.0"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "0", "OTEL_BSP_EXPORT_TIMEOUT=0.0: must be a number of milliseconds"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "OTEL_EXPORTER_OTLP_TIMEOUT=0.0: must be a number of milliseconds"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-1", "OTEL_EXPORTER_OTLP_TIMEOUT=-1.0: must be a number of milliseconds"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "nan", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=nan"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url", "OTEL_EXPORTER_OTLP_ENDPOINT='not a url' is not an OTLP endpoint"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://:99999", "is not an OTLP endpoint"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "ftp://x", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT='ftp://x'"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp", "OTEL_EXPORTER_OTLP_PROTOCOL='udp' is not an OTLP protocol"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "http/json is not supported"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization", "OTEL_EXPORTER_OTLP_HEADERS is malformed"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x", "OTEL_EXPORTER_OTLP_METRICS_HEADERS is malformed"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "udp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='udp'"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "0", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT=0.0"),
        # read by OpenTelemetry's SDK itself: it would raise mid-run, or quietly use its default
        ("OTEL_METRIC_EXPORT_INTERVAL", "0", "OTEL_METRIC_EXPORT_INTERVAL=0.0: must be a number of milliseconds"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "-1", "OTEL_METRIC_EXPORT_INTERVAL=-1.0"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "0", "OTEL_METRIC_EXPORT_TIMEOUT=0.0"),
        ("OTEL_SDK_DISABLED", "maybe", "OTEL_SDK_DISABLED='maybe': must be one of true, false"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "abc", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT='abc' must be a whole number"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-3", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT='-3' must be a whole number"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem", "no readable file there"),
        ("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "/no/such/key", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "yes please", "OTEL_EXPORTER_OTLP_INSECURE='yes please'"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=jit,oops", "OTEL_RESOURCE_ATTRIBUTES is malformed .*pair oops"),
        ("OTEL_TRACES_SAMPLER", "sometimes", "OTEL_TRACES_SAMPLER='sometimes': OpenTelemetry cannot use it"),
        ("OTEL_METRICS_EXPORTER", "otpl", "OTEL_METRICS_EXPORTER='otpl' names 'otpl'"),
    ],
)
def test_a_variable_opentelemetry_cannot_use_is_warned_of_once_and_its_default_used(
    variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = resolve()
    monkeypatch.setenv(variable, value)
    with pytest.warns(RuntimeWarning, match=message + ".*the default .* is used instead"):
        settings = resolve()
    assert defaults(settings) == defaults(expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        resolve()


def defaults(settings: OTLPSettings) -> OTLPSettings:
    """``settings`` as compared with the defaults': the variables hidden from OpenTelemetry's exporters aside, and
    the sampler by what it does."""
    sampler = settings.sampler.get_description() if settings.sampler is not None else None
    assert sampler in (
        None,
        "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler,"
        "remoteParentNotSampled:AlwaysOffSampler,localParentSampled:AlwaysOnSampler,"
        "localParentNotSampled:AlwaysOffSampler}",
    )
    return replace(settings, ignored=(), sampler=None)


def test_a_batch_larger_than_the_queue_is_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1")
    assert resolve().batch["max_export_batch_size"] == 1  # the default batch, 512, taken from a queue of 1
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096")
    with pytest.warns(RuntimeWarning, match="OTEL_BSP_MAX_EXPORT_BATCH_SIZE=4096 is larger than the queue"):
        assert resolve().batch["max_export_batch_size"] == 1
    with pytest.raises(OTLPSettingsError, match="max_export_batch_size \\(4096.*larger than max_queue_size"):
        resolve(max_export_batch_size=4096)  # an argument is code: refused


@pytest.mark.parametrize(
    "variable",
    [
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_BSP_EXPORT_TIMEOUT",
        "OTEL_METRIC_EXPORT_INTERVAL",
    ],
)
def test_a_value_that_is_no_number_is_warned_of_naming_what_is_valid(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = resolve()
    monkeypatch.setenv(variable, "lots")
    with pytest.warns(RuntimeWarning, match=f"{variable}='lots': must be a number of .* greater than 0"):
        assert resolve() == expected


def test_metrics_take_their_own_variables_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=jit")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-team=metrics")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "3000")  # milliseconds, as the specification says
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1500")
    settings = resolve()
    traces, metrics = settings.targets["traces"], settings.targets["metrics"]
    assert (traces.protocol, traces.endpoint) == ("grpc", "localhost:4317")
    assert (metrics.protocol, metrics.endpoint) == ("http/protobuf", "http://localhost:4318/v1/metrics")
    assert dict(traces.headers) == {"x-team": "jit"} and dict(metrics.headers) == {"x-team": "metrics"}
    assert (traces.timeout_s, metrics.timeout_s, settings.metrics_interval_ms) == (10.0, 3.0, 1500.0)


@pytest.mark.parametrize("variable", OTEL_VARIABLES)
def test_an_empty_variable_counts_as_unset(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = resolve()
    monkeypatch.setenv(variable, "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve() == expected


def test_arguments_win_and_are_checked_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "0")  # the argument wins: no error
    assert resolve(max_queue_size=10, max_export_batch_size=5).batch["max_queue_size"] == 10
    with pytest.raises(OTLPSettingsError, match=r"OTLPExporter\(timeout=...\)=0: must be a number of seconds"):
        resolve(timeout=0)


def test_headers_are_read_as_opentelemetry_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20SECRET, x-team = jit")
    assert dict(resolve().targets["traces"].headers) == {"authorization": "Bearer SECRET", "x-team": "jit"}


def test_a_headers_variable_is_malformed_where_opentelemetrys_parser_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's parser decides (a name given twice is no error to it: the last value wins), not a count of commas."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=a, X-Team=b,,")
    assert dict(resolve().targets["traces"].headers) == {"x-team": "b"}
    assert dict(parse_env_headers("x-team=a, X-Team=b,,", liberal=True)) == {"x-team": "b"}


def test_secrets_stay_out_of_every_representation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20SECRET")
    options = OTLPOptions(endpoint="http://user:PASSWORD@collector:4318/v1/traces", protocol="http/protobuf")
    settings = OTLPSettings.resolve(options)
    for text in (repr(options), repr(settings), str(settings)):
        assert "SECRET" not in text and "PASSWORD" not in text and "collector" in text
    # what a spawned rank receives: the arguments given, not what came from the environment
    assert b"SECRET" not in pickle.dumps(options)
    assert redact_url("http://user:PASSWORD@collector:4318/x") == "http://***@collector:4318/x"


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("https://TOKEN@collector:4318/v1/traces", "https://***@collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces?api_key=TOKEN&x=TOKEN2", "http://collector:4318/v1/traces?api_key=***&x=***"),
        ("http://collector:4318/v1/traces?TOKEN", "http://collector:4318/v1/traces?***"),
        ("http://collector:4318/v1/traces#TOKEN", "http://collector:4318/v1/traces#***"),
        ("collector:4317", "collector:4317"),
    ],
)
def test_every_part_of_an_endpoint_that_may_hold_a_token_is_redacted(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    settings = resolve(endpoint=url, protocol="http/protobuf" if url.startswith("http") else "grpc")
    assert "TOKEN" not in settings.scrub(f"HTTPConnectionPool: Max retries exceeded with url: {url}")


def test_scrubbing_hides_header_values_and_leaves_the_rest_of_an_error_readable() -> None:
    """A short header that is no credential (Tempo's tenant id ``X-Scope-OrgID: 1``) is not replaced wherever its
    text occurs: the reason for a failed export keeps its address."""
    settings = resolve(
        endpoint="http://127.0.0.1:4318/v1/traces",
        protocol="http/protobuf",
        headers={"x-scope-orgid": "1", "authorization": "Bearer s3cr3t"},
    )
    scrubbed = settings.scrub("Failed to export to http://127.0.0.1:4318 (Bearer s3cr3t refused): 401")
    assert scrubbed == "Failed to export to http://127.0.0.1:4318 (*** refused): 401"


def test_a_malformed_headers_variable_is_refused_without_the_sdk_printing_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cr3t,broken header s3cr3t")
    with pytest.warns(RuntimeWarning, match="OTEL_EXPORTER_OTLP_HEADERS is malformed") as raised:
        assert dict(resolve().targets["traces"].headers) == {"authorization": "Bearer s3cr3t"}  # the well-formed
    said = capsys.readouterr()
    assert "s3cr3t" not in str(raised[0].message) + said.out + said.err + caplog.text


def test_a_header_value_with_a_line_break_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OTLPSettingsError, match="'authorization' holds a control character") as raised:
        resolve(headers={"Authorization": "Bearer s3cr3t\r\nX-Injected: 1"})
    assert "s3cr3t" not in str(raised.value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cr3t%0D%0AX-Injected%3A%201,x-team=a")
    with pytest.warns(RuntimeWarning, match="OTEL_EXPORTER_OTLP_HEADERS: the header 'authorization' holds"):
        assert dict(resolve().targets["traces"].headers) == {"x-team": "a"}  # that header left out


@pytest.mark.parametrize(
    ("sampler", "argument", "message"),
    [("traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG='1.5'"), ("parentbased_traceidratio", "half", "'half'")],
)
def test_a_sampler_opentelemetry_would_replace_is_refused(
    sampler: str, argument: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    with pytest.warns(RuntimeWarning, match=message + ".*the default .* is used instead"):
        assert "{1.0}" in resolve().sampler.get_description()  # OpenTelemetry's default ratio
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    assert "0.25" in resolve().sampler.get_description()


@pytest.mark.parametrize(
    ("value", "wanted"),
    [("otlp", True), ("console, otlp", True), (" otlp_proto_http ", True), ("none", False), ("console", False)],
)
def test_the_traces_exporter_variable_is_read_as_opentelemetry_reads_it(
    value: str, wanted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert traces_exporter_wanted() is wanted


def test_an_unknown_traces_exporter_name_is_warned_of(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otpl")
    with pytest.warns(RuntimeWarning, match="OTEL_TRACES_EXPORTER='otpl' names 'otpl'.*use one of"):
        assert not traces_exporter_wanted()  # the product's default: the file alone
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otpl,otlp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert traces_exporter_wanted()


def test_names_telemetry_jit_leaves_to_opentelemetry_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with pytest.warns(RuntimeWarning, match="names console; telemetry-jit exports only over OTLP"):
        assert not traces_exporter_wanted()


@pytest.mark.parametrize(
    ("protocol", "missing"),
    [("grpc", "opentelemetry.exporter.otlp.proto.grpc"), ("http/protobuf", "opentelemetry.exporter.otlp.proto.http")],
)
def test_otlp_without_its_extra_is_refused_naming_what_to_install(
    protocol: str, missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telemetry_jit.exporters import OTLPExporter

    # as if the distribution were not installed: its modules already imported by earlier tests included
    for name in [name for name in sys.modules if name == missing or name.startswith(f"{missing}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(OTLPSettingsError, match=r"pip install 'telemetry-jit\[otlp\]'"):
        OTLPExporter("http://127.0.0.1:4317", protocol=protocol, metrics=False)


def test_the_request_bound_comes_from_its_variable_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES", "1000000")
    assert OTLPSettings.resolve(OTLPOptions()).max_request_bytes == 1_000_000
    assert OTLPSettings.resolve(OTLPOptions(max_request_bytes=5)).max_request_bytes == 5  # the argument wins
    monkeypatch.setenv("TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES", "4MB")
    with pytest.warns(RuntimeWarning, match="TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES='4MB': must be a number of bytes"):
        assert OTLPSettings.resolve(OTLPOptions()).max_request_bytes == 3 * 1024 * 1024


def test_every_recorded_name_has_one_opentelemetry_name_in_seconds_and_the_docs_say_it() -> None:
    """OpenTelemetry's names: the project's namespace, durations in seconds without a unit in the name,
    one name per fact; each name the rule alone would not give is in docs/telemetry.md."""
    from pathlib import Path

    from telemetry_jit import schema

    docs = (Path(__file__).resolve().parents[3] / "docs" / "telemetry.md").read_text()
    recorded = [
        value
        for holder in (
            schema.CompileAttr,
            schema.GraphBreakAttr,
            schema.DdpAttr,
            schema.TrainAttr,
            schema.StepAttr,
            schema.PayoffAttr,
            schema.CacheAttr,
            schema.FallbackAttr,
        )
        for key, value in vars(holder).items()
        if key.isupper() and isinstance(value, str) and not value.endswith(".")
    ]
    named: dict[str, list[str]] = {}
    for name in recorded:
        wire = schema.otel_name(name)
        if wire is None:
            assert name == "compile.num_graph_breaks"  # torch's count of compile.graph_breaks' breaks
            continue
        assert wire[0].startswith("telemetry_jit.") and not wire[0].endswith(("_ms", "_s")), wire
        assert wire[1] == (0.001 if "_ms" in name else 1.0), (name, wire)
        named.setdefault(wire[0], []).append(name)
        if wire[0] != f"telemetry_jit.{name}".removesuffix("_s"):
            assert f"`{wire[0]}`" in docs, f"docs/telemetry.md does not name {wire[0]} ({name})"
    assert named["telemetry_jit.compile.graph_breaks"] == ["compile.graph_break_count", "compile.graph_breaks"]
    assert [wire for wire, names in named.items() if len(names) > 1] == ["telemetry_jit.compile.graph_breaks"]


def test_names_recorded_after_the_rename_go_out_once_under_opentelemetrys_name() -> None:
    """A cache look-up's parts are long lists: over OTLP they travel once, as ``telemetry_jit.cache.*``."""
    from telemetry_jit.exporters.otlp import _attributes

    sent = _attributes({"cache.parts": ["gm\tabc\t"], "cache.time_saved_s": 1.5, "compile.frame": "forward"})
    assert sent == {
        "telemetry_jit.cache.parts": ["gm\tabc\t"],
        "telemetry_jit.cache.time_saved": 1.5,
        "telemetry_jit.compile.frame": "forward",
    }


def test_one_name_per_fact_and_no_empty_text_over_otlp() -> None:
    from telemetry_jit.exporters.otlp import _attributes

    sent = _attributes(
        {"compile.failure": "", "compile.recompile_reason": "", "compile.duration_ms": 1500, "rank": 1, "x": "kept"}
    )
    assert sent == {"telemetry_jit.compile.duration": 1.5, "telemetry_jit.rank": 1, "x": "kept"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_opentelemetrys_exporter_parsing_the_headers_itself_prints_no_value_either(
    protocol: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Given no headers (an empty dict here), OpenTelemetry's exporter reads the variable itself."""
    from telemetry_jit.exporters.otlp_transport import build_exporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "broken header s3cr3t")
    settings = resolve(headers={}, protocol=protocol)
    for built in (build_exporter(settings, "traces"), build_exporter(settings, "metrics")):
        built.shutdown()
    said = capsys.readouterr()
    assert "s3cr3t" not in said.out + said.err + caplog.text


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip"),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "lz4"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "bogus"),
        ("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "x"),
    ],
)
def test_what_opentelemetrys_exporters_would_not_use_is_warned_of_as_they_are_built(
    protocol: str, variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenTelemetry's exporters read these variables themselves (gRPC's raises for a compression it does not
    know, HTTP's warns and sends uncompressed; both warn of a temporality or aggregation and use their default):
    built once when the exporter is, whatever they object to is warned of naming the variable, before training, and
    left to OpenTelemetry's default (a variable its exporter raises for is hidden from it)."""
    from telemetry_jit.exporters import OTLPExporter

    monkeypatch.setenv(variable, value)
    with pytest.warns(RuntimeWarning, match=f"{variable}={value!r}: OpenTelemetry's exporter cannot use it"):
        exporter = OTLPExporter("http://127.0.0.1:4317", protocol=protocol)
    assert set(exporter._exporters) == {"traces", "metrics"}
    assert os.environ[variable] == value  # hidden only while the exporters were built


def test_resource_attributes_are_the_ones_given_not_a_later_change_of_the_users_mapping() -> None:
    given = {"team": "vision"}
    settings = resolve(resource_attributes=given)
    given["team"] = "changed"
    assert settings.options.resource_attributes == {"team": "vision"}
