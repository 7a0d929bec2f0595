"""What an OTLP exporter sends where: arguments over OpenTelemetry's variables over defaults, checked when the
exporter is built (docs/exporters.md). An argument that could send nothing is refused; a variable OpenTelemetry
could not use is warned of once and replaced by its default, as the specification says (one bad cluster-wide
variable must not stop every job). An empty variable counts as unset (the specification)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast
from urllib.parse import ParseResult, parse_qsl, unquote, urlencode, urlparse, urlunparse

from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.util.re import parse_env_headers

from telemetry_jit import redaction
from telemetry_jit.notices import NOWHERE, warn_once

Protocol = Literal["grpc", "http/protobuf"]
Signal = Literal["traces", "metrics"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
# OTEL_TRACES_EXPORTER names: the ones that mean OTLP, and OpenTelemetry's other exporters, which telemetry-jit
# does not implement
_OTLP_NAMES = ("otlp", "otlp_proto_grpc", "otlp_proto_http")
_OTHER_OTEL_NAMES = ("console", "zipkin", "zipkin_json", "zipkin_proto", "jaeger", "prometheus", "logging")
_BATCH = {  # BatchSpanProcessor's argument -> (variable, unit, OpenTelemetry's default)
    "max_queue_size": ("OTEL_BSP_MAX_QUEUE_SIZE", "spans", 2048),
    "schedule_delay_millis": ("OTEL_BSP_SCHEDULE_DELAY", "milliseconds", 5000),
    "max_export_batch_size": ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "spans", 512),
    "export_timeout_millis": ("OTEL_BSP_EXPORT_TIMEOUT", "milliseconds", None),  # default: bounds flush and close
}
_REQUEST_BYTES = ("TELEMETRY_JIT_OTLP_MAX_REQUEST_BYTES",)
DEFAULT_MAX_REQUEST_BYTES = 3 * 1024 * 1024  # under the 4 MiB gRPC receivers (the Collector's too) take by default
_Filter = logging.Filter | Callable[[logging.LogRecord], bool]
_HOST = re.compile(r"^[A-Za-z0-9._~%-]+$|^\[[0-9A-Fa-f:.]+\]$")


class OTLPSettingsError(ValueError):
    """An OTLP argument with which nothing could be sent."""


def invalid_variable(variable: str, problem: str, default: Any) -> None:
    """Say once per process that ``variable`` is replaced by ``default`` (the specification: warn, use the default).
    ``problem`` names the value where it is no secret."""
    value = os.environ.get(variable, "")
    warn_once(
        ("invalid OTEL variable", variable, value),
        f"telemetry-jit: {problem}; the default ({default}) is used instead, as OpenTelemetry's specification says "
        "for a value it cannot use. Training goes on.",
        every_rank=True,
        origin=NOWHERE,
    )


def _environ(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value and value.strip() else None  # empty counts as unset


def _parsed(url: str) -> ParseResult:
    # a gRPC address with no scheme (collector:4317) is a host, not a path
    return urlparse(url if "://" in url else f"//{url}")


def redact_url(url: str) -> str:
    """``url`` with its user info (a token often rides there), query values and fragment replaced by ``***``."""
    parsed = _parsed(url)
    netloc = "***@" + parsed.netloc.rsplit("@", 1)[1] if "@" in parsed.netloc else parsed.netloc
    pairs = parse_qsl(parsed.query, keep_blank_values=True) if "=" in parsed.query else []
    query = urlencode([(key, "***") for key, _ in pairs], safe="*") if pairs else "***" if parsed.query else ""
    redacted = parsed._replace(netloc=netloc, query=query, fragment="***" if parsed.fragment else "")
    if redacted == parsed:
        return url
    text = urlunparse(redacted)
    return text if "://" in url else text.removeprefix("//")


def _url_secrets(url: str) -> list[str]:
    """The parts of ``url`` :func:`redact_url` hides, as written and as decoded."""
    parsed = _parsed(url)
    parts = [parsed.netloc.rsplit("@", 1)[0]] if "@" in parsed.netloc else []
    parts += [parsed.query, parsed.fragment] if parsed.query or parsed.fragment else []
    parts += [value for _, value in parse_qsl(parsed.query, keep_blank_values=True)]
    parts += [parsed.username or "", parsed.password or ""]
    found = {*parts, *(unquote(part) for part in parts)}
    if parsed.username or parsed.password:  # as an HTTP client sends them (Basic), which a collector may echo
        pair = f"{unquote(parsed.username or '')}:{unquote(parsed.password or '')}".encode()
        found.add(base64.b64encode(pair).decode())
    return [part for part in found if len(part) >= redaction.SHORTEST_SECRET]


def configured_secrets() -> set[str]:
    """Every secret the ``OTEL_*`` variables hold, whichever of them the settings use: an exporter OpenTelemetry
    builds reads a variable that an argument overrode here (headers given as ``{}``), and its SDK's lines echo it."""
    found: set[str] = set()
    for signal in _SIGNALS:
        if (text := _environ(f"OTEL_EXPORTER_OTLP_{signal}HEADERS")) is not None:
            for pair in text.split(","):
                value = pair.partition("=")[2].strip()
                found.update((value, unquote(value)))
        if (url := _environ(f"OTEL_EXPORTER_OTLP_{signal}ENDPOINT")) is not None:
            found.update(_url_secrets(url.strip()))
    return found


@contextlib.contextmanager
def sdk_said(*loggers: str) -> Iterator[list[str]]:
    """The SDK's warnings meanwhile, collected and kept off the console (some repeat a malformed header's secret)."""
    said: list[str] = []

    def collect(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            said.append(record.getMessage())
        return record.levelno < logging.WARNING

    tap_sdk_loggers(collect, loggers)
    try:
        yield said
    finally:
        untap_sdk_loggers(collect, loggers)


def tap_sdk_loggers(tap: _Filter, loggers: Iterable[str]) -> None:
    # first: gRPC's exporter puts the SDK's DuplicateFilter on its logger, which drops a line seen in the last 20 s
    for name in loggers:
        logging.getLogger(name).filters.insert(0, tap)


def untap_sdk_loggers(tap: _Filter, loggers: Iterable[str]) -> None:
    for name in loggers:
        logging.getLogger(name).removeFilter(tap)


@dataclass(frozen=True)
class OTLPOptions:
    """What the user asked of an ``OTLPExporter`` (``None``: not said), which a spawned process needs to build
    the same exporter: secrets from the environment are read there again, not carried along."""

    endpoint: str | None = None
    protocol: str | None = None
    headers: Mapping[str, str] | str | None = None
    service_name: str | None = None
    timeout: float | None = None
    insecure: bool | None = None
    certificate_file: str | None = None
    resource_attributes: Mapping[str, Any] | None = None
    max_queue_size: int | None = None
    schedule_delay_millis: float | None = None
    max_export_batch_size: int | None = None
    export_timeout_millis: float | None = None
    max_request_bytes: int | None = None
    metrics: bool | None = None

    def given(self) -> dict[str, Any]:
        """The options that were set, by name."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    def __repr__(self) -> str:
        shown = {
            name: ("<redacted>" if name == "headers" else redact_url(value) if name == "endpoint" else value)
            for name, value in self.given().items()
        }
        return f"OTLPOptions({', '.join(f'{name}={value!r}' for name, value in shown.items())})"


@dataclass(frozen=True)
class Target:
    """Where one signal (traces, metrics) goes: its own variables first, then the shared ones."""

    protocol: Protocol
    endpoint: str
    headers: Mapping[str, str] = field(repr=False)
    timeout_s: float


@dataclass(frozen=True)
class OTLPSettings:
    """:class:`OTLPOptions` and the environment resolved; the arguments apply to both signals."""

    options: OTLPOptions  # what was asked (service name, TLS, resource attributes: used as given)
    targets: Mapping[Signal, Target]
    flush_timeout_s: float  # bounds a flush and the wait at close
    batch: Mapping[str, float]  # BatchSpanProcessor's arguments
    metrics: bool
    max_request_bytes: int  # one request's bound (receivers refuse larger ones)
    metrics_interval_ms: float
    metrics_export_timeout_ms: float
    sampler: Sampler | None  # OTEL_TRACES_SAMPLER's, as OpenTelemetry builds it (None: the SDK's default)
    # the OTEL_*_LIMIT variables, each one OpenTelemetry refuses at its default (compared by the variables they read)
    span_limits: SpanLimits | None = field(default=None, compare=False)
    ignored: tuple[str, ...] = ()  # variables OpenTelemetry's exporters read themselves, hidden from them (invalid)

    def scrub(self, text: str) -> str:
        """``text`` (an error OpenTelemetry or a transport wrote, a collector's answer) with the endpoints' and
        headers' secrets hidden, and any stretch of 8 characters or more of one (:mod:`telemetry_jit.redaction`)."""
        whole: set[str] = set()
        grams: set[str] = set()
        for secret in self.secrets():
            redaction.add_secret(secret, whole, grams)
        return redaction.scrub(redaction.scrub_with(text, whole, grams))

    def secrets(self) -> set[str]:
        """What no text may show: header values and an endpoint's credentials, as configured and as sent."""
        found = {secret for target in self.targets.values() for secret in _url_secrets(target.endpoint)}
        found.update(value for target in self.targets.values() for value in target.headers.values())
        return found

    def __repr__(self) -> str:
        traces = self.targets["traces"]
        return (
            f"OTLPSettings(protocol={traces.protocol!r}, endpoint={redact_url(traces.endpoint)!r}, "
            f"timeout_s={traces.timeout_s:g}, headers=<{len(traces.headers)} redacted>)"
        )

    @classmethod
    def resolve(cls, options: OTLPOptions) -> OTLPSettings:
        """Arguments over variables over defaults, checked; an error names the setting, its value and what is valid."""
        redaction.register(configured_secrets())  # before anything can fail and say why
        traces = _target(options, "traces")
        batch = {
            name: value
            for name, (variable, unit, default) in _BATCH.items()
            if (value := _positive(name, getattr(options, name), (variable,), unit, default)) is not None
        }
        oversized = batch["max_export_batch_size"] > batch["max_queue_size"]
        if oversized and options.max_export_batch_size is None:  # the default or its variable: at most the queue
            if _environ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") is not None:
                invalid_variable(
                    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                    f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE={batch['max_export_batch_size']:g} is larger than the "
                    f"queue ({batch['max_queue_size']:g} spans) a batch is taken from",
                    f"the queue's size, {batch['max_queue_size']:g}",
                )
            batch["max_export_batch_size"] = batch["max_queue_size"]
        elif oversized:
            raise OTLPSettingsError(
                f"OTLP max_export_batch_size ({batch['max_export_batch_size']:g}, OTEL_BSP_MAX_EXPORT_BATCH_SIZE) "
                f"is larger than max_queue_size ({batch['max_queue_size']:g}, OTEL_BSP_MAX_QUEUE_SIZE): "
                "a batch is taken from the queue, so it must be at most as large."
            )
        if (metrics := options.metrics) is None:
            known = ("otlp", "none", "console", "prometheus")
            metrics = "otlp" in _exporter_names("OTEL_METRICS_EXPORTER", "otlp", known, "Use 'otlp' or 'none'.")
        ignored = _check_sdk_variables()
        settings = cls(
            # a copy: the mapping the user passed may change after configure
            options=replace(options, resource_attributes=dict(options.resource_attributes or {})),
            targets={"traces": traces, "metrics": _target(options, "metrics", traces)},
            flush_timeout_s=batch.get("export_timeout_millis", traces.timeout_s * 1000) / 1000,
            batch=batch,
            metrics=metrics,
            max_request_bytes=_positive(
                "max_request_bytes", options.max_request_bytes, _REQUEST_BYTES, "bytes", DEFAULT_MAX_REQUEST_BYTES
            ),
            metrics_interval_ms=_positive(
                "metrics_interval", None, ("OTEL_METRIC_EXPORT_INTERVAL",), "milliseconds", 60_000.0
            ),
            metrics_export_timeout_ms=_positive(
                "metrics_export_timeout", None, ("OTEL_METRIC_EXPORT_TIMEOUT",), "milliseconds", 30_000.0
            ),
            sampler=_traces_sampler(span_limits := _span_limits()),
            span_limits=span_limits,
            ignored=ignored,
        )
        # hidden from every warning and record from now on, whoever says it
        redaction.register(settings.secrets() | configured_secrets())
        return settings


def _target(options: OTLPOptions, signal: Signal, traces: Target | None = None) -> Target:
    """Where ``signal`` goes. Metrics (given ``traces``) take their own variable, else the address spans go to
    when the protocol is the same (given, or from the variables), else the default."""
    protocol = _protocol(options.protocol, _variables(signal, "PROTOCOL"))
    given = options.endpoint if traces is None else None
    endpoint = _endpoint(protocol, signal, given, base=traces is None or options.endpoint is None)
    if endpoint is None and traces is not None and traces.protocol == protocol:
        http = protocol == "http/protobuf"
        endpoint = traces.endpoint.removesuffix("/v1/traces").rstrip("/") + "/v1/metrics" if http else traces.endpoint
    return Target(
        protocol=protocol,
        endpoint=endpoint or _default_endpoint(protocol, signal),
        headers=_headers(options.headers, _variables(signal, "HEADERS")),
        timeout_s=_timeout_s(options.timeout, _variables(signal, "TIMEOUT")),
    )


def _timeout_s(given: float | None, variables: tuple[str, ...]) -> float:
    """The export timeout in seconds: the argument's (seconds, as OpenTelemetry's Python exporters take it), else
    the variables' in milliseconds, the specification's unit (OpenTelemetry's Python exporters read seconds:
    open-telemetry/opentelemetry-python#4044; docs/exporters.md says why the specification wins here)."""
    if given is not None:
        return float(_positive("timeout", given, variables))
    milliseconds = float(_positive("timeout", None, variables, "milliseconds", 10_000.0))
    return milliseconds / 1000


def _variables(signal: Signal, setting: str) -> tuple[str, str]:
    """The signal's own variable for ``setting``, then the shared one (OpenTelemetry's order)."""
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_{setting}", f"OTEL_EXPORTER_OTLP_{setting}"


def sdk_disabled() -> bool:
    return (_environ("OTEL_SDK_DISABLED") or "false").strip().lower() == "true"


def _exporter_names(variable: str, default: str, known: tuple[str, ...], use: str) -> list[str]:
    """The names ``variable`` gives, as OpenTelemetry reads it; one it does not know either is an error."""
    value = _environ(variable) or default
    names = [name.strip().lower() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        invalid_variable(
            variable,
            f"{variable}={value!r} names {', '.join(map(repr, unknown))}, which is no exporter OpenTelemetry knows "
            f"({use})",
            repr(default),
        )
        names = [name for name in names if name in known] or [default]
    return names


_SIGNALS = ("", "TRACES_", "METRICS_")
# variables the SDK reads itself and takes anything for (anything but "true" is false): ours say true or false
_BOOLEANS = ("OTEL_SDK_DISABLED", *(f"OTEL_EXPORTER_OTLP_{s}INSECURE" for s in _SIGNALS))
# variables OpenTelemetry's exporters check as they are built (otlp_transport.checked_exporters)
CHECKED_BY_THE_EXPORTERS = (
    *(f"OTEL_EXPORTER_OTLP_{s}COMPRESSION" for s in _SIGNALS),
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
)
_FILES = tuple(
    f"OTEL_EXPORTER_OTLP_{s}{kind}" for s in _SIGNALS for kind in ("CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE")
)


def _check_sdk_variables() -> tuple[str, ...]:
    """The variables the SDK reads itself, each it would raise for mid-run or quietly replace warned of now; the
    ones its exporters read that must be hidden from them (a file that is not there), returned."""
    ignored = []
    for variable in _BOOLEANS:
        value = _environ(variable)
        if value is not None and value.strip().lower() not in ("true", "false"):
            # unset, as OpenTelemetry's exporter reads it: TLS unless the endpoint says http://
            invalid_variable(variable, f"{variable}={value!r}: must be one of true, false", "unset")
            ignored.append(variable)
    for variable in _FILES:
        value = _environ(variable)
        if value is not None and not os.access(value, os.R_OK):
            invalid_variable(variable, f"{variable}={value!r}: no readable file there (a certificate or key)", "none")
            ignored.append(variable)
    with sdk_said("opentelemetry.sdk.resources") as said:
        OTELResourceDetector().detect()  # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, as the SDK reads them
    if said:
        invalid_variable(
            "OTEL_RESOURCE_ATTRIBUTES",
            f"OTEL_RESOURCE_ATTRIBUTES is malformed ({said[0]}): expected 'key=value,key2=value2' (values "
            "percent-encoded)",
            "the well-formed pairs alone",
        )
    return tuple(ignored)


# OpenTelemetry's span limit variables -> SpanLimits' argument, and the default it stands for (UNSET: no limit)
_LIMITS = {
    "OTEL_ATTRIBUTE_COUNT_LIMIT": ("max_attributes", 128),
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": ("max_span_attributes", 128),
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": ("max_event_attributes", 128),
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": ("max_link_attributes", 128),
    "OTEL_SPAN_EVENT_COUNT_LIMIT": ("max_events", 128),
    "OTEL_SPAN_LINK_COUNT_LIMIT": ("max_links", 128),
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": ("max_attribute_length", SpanLimits.UNSET),
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": ("max_span_attribute_length", SpanLimits.UNSET),
}


def _span_limits() -> SpanLimits:
    """The span limits as OpenTelemetry reads them, a variable it would refuse (raising as the first span starts)
    replaced by its default."""
    replaced: dict[str, Any] = {}
    for variable, (argument, default) in _LIMITS.items():
        value = _environ(variable)
        if value is not None and not (value.strip().isdigit()):
            shown = "no limit" if default == SpanLimits.UNSET else default
            invalid_variable(variable, f"{variable}={value!r} must be a whole number of 0 or more", shown)
            replaced[argument] = default
    return SpanLimits(**replaced)


def environment_resource_attributes() -> dict[str, Any]:
    """``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` as OpenTelemetry's detector reads them (its warning of a
    malformed pair kept off the console: configure said it once)."""
    with sdk_said("opentelemetry.sdk.resources"):
        return dict(OTELResourceDetector().detect().attributes)


def environment_service_name() -> str | None:
    """``service.name`` as the environment sets it, read by OpenTelemetry's detector; ``None`` when unset."""
    with sdk_said("opentelemetry.sdk.resources"):
        name = OTELResourceDetector().detect().attributes.get("service.name")
    return str(name) if name else None


def _traces_sampler(span_limits: SpanLimits) -> Sampler | None:
    """``OTEL_TRACES_SAMPLER``'s sampler as the SDK builds it (``None``: unset); one it would replace is an error."""
    if _environ("OTEL_TRACES_SAMPLER") is None:
        return None
    with sdk_said("opentelemetry.sdk.trace.sampling") as said:
        # the SDK reads both variables here (and no resource: its detector would warn again of a malformed one)
        sampler = TracerProvider(shutdown_on_exit=False, span_limits=span_limits, resource=Resource.get_empty()).sampler
    if said:
        variables = ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")
        given = ", ".join(f"{name}={os.environ[name]!r}" for name in variables if name in os.environ)
        invalid_variable(
            "OTEL_TRACES_SAMPLER",
            f"{given}: OpenTelemetry cannot use it ({said[0].rstrip('.')}); use always_on, always_off, "
            "traceidratio or parentbased_* (with a ratio from 0 to 1 in OTEL_TRACES_SAMPLER_ARG)",
            sampler.get_description(),
        )
    return sampler


def traces_exporter_wanted() -> bool:
    """Whether ``OTEL_TRACES_EXPORTER`` asks for OTLP."""
    use = f"telemetry-jit sends spans over OTLP: use one of {sorted(_OTLP_NAMES)}, or 'none'."
    names = _exporter_names("OTEL_TRACES_EXPORTER", "none", (*_OTLP_NAMES, *_OTHER_OTEL_NAMES, "none"), use)
    others = [name for name in names if name in _OTHER_OTEL_NAMES]
    if others:
        warn_once(
            ("OTEL_TRACES_EXPORTER", os.environ["OTEL_TRACES_EXPORTER"]),
            f"telemetry-jit: OTEL_TRACES_EXPORTER names {', '.join(others)}; telemetry-jit exports only over OTLP "
            "(and to its file), so it leaves those to your own OpenTelemetry setup.",
            every_rank=True,
            origin=NOWHERE,
        )
    return any(name in _OTLP_NAMES for name in names)


def prometheus_wanted() -> bool:
    """Whether ``OTEL_METRICS_EXPORTER`` names ``prometheus`` (exporters/prometheus.py serves the metrics)."""
    known = ("otlp", "none", "console", "prometheus")
    names = _exporter_names("OTEL_METRICS_EXPORTER", "otlp", known, "Use 'otlp', 'prometheus' or 'none'.")
    return "prometheus" in names


def _given_or_variable(given: Any, argument: str, variables: tuple[str, ...]) -> tuple[Any, str]:
    """The argument when given, else the first of ``variables`` set: ``(value, where from)``, or ``(None, "")``."""
    if given is not None:
        return given, f"OTLPExporter({argument}=...)"
    for name in variables:
        if (value := _environ(name)) is not None:
            return value, name
    return None, ""


def _protocol(given: str | None, variables: tuple[str, ...]) -> Protocol:
    value, source = _given_or_variable(given, "protocol", variables)
    if value is None:
        return "grpc"
    protocol = value.strip().lower()
    if protocol in PROTOCOLS:
        return cast(Protocol, protocol)
    if protocol == "http/json":
        problem = f"{source}={value!r}: OTLP over http/json is not supported; use one of {list(PROTOCOLS)}"
    else:
        problem = f"{source}={value!r} is not an OTLP protocol; use one of {list(PROTOCOLS)}"
    if given is not None:
        raise OTLPSettingsError(problem + ".")
    invalid_variable(source, problem, "'grpc'")
    return "grpc"


def _endpoint(protocol: Protocol, signal: Signal, given: str | None, base: bool) -> str | None:
    """``given``, else the signal's variable, else (with ``base``) the shared one (+ ``/v1/<signal>`` for HTTP)."""
    value, source = _given_or_variable(given, "endpoint", _variables(signal, "ENDPOINT")[:1])
    if value is None and base and (shared := _environ("OTEL_EXPORTER_OTLP_ENDPOINT")) is not None:
        value = shared.strip().rstrip("/") + f"/v1/{signal}" if protocol == "http/protobuf" else shared.strip()
        source = "OTEL_EXPORTER_OTLP_ENDPOINT"
    return None if value is None else _checked_endpoint(value, protocol, source, variable=given is None)


def _default_endpoint(protocol: Protocol, signal: Signal) -> str:
    return "localhost:4317" if protocol == "grpc" else f"http://localhost:4318/v1/{signal}"


def _checked_endpoint(endpoint: str, protocol: Protocol, source: str, variable: bool = False) -> str | None:
    endpoint = endpoint.strip()
    parsed = _parsed(endpoint)
    try:
        port_ok = parsed.port is None or 0 < parsed.port < 65536
    except ValueError:
        port_ok = False
    schemes = ("http", "https") if protocol == "http/protobuf" else ("", "http", "https", "grpc", "grpcs", "unix")
    host_ok = bool(parsed.hostname) and bool(_HOST.match(parsed.hostname or "")) or parsed.scheme == "unix"
    if not host_ok or not port_ok or parsed.scheme not in schemes:
        problem = (
            f"{source}={redact_url(endpoint)!r} is not an OTLP endpoint for {protocol}; expected an address such "
            f"as {_default_endpoint(protocol, 'traces')!r}"
        )
        if not variable:
            raise OTLPSettingsError(problem + ".")
        invalid_variable(source, problem, "the default address")
        return None
    return endpoint


def _headers(given: Mapping[str, str] | str | None, variables: tuple[str, ...]) -> dict[str, str]:
    """Headers as OpenTelemetry reads them, values never shown; a control character (a line break would end the
    header and lose every request) refused."""
    text, source = _given_or_variable(given, "headers", variables)
    if text is None:
        return {}
    if isinstance(text, Mapping):
        headers = {str(name).lower(): str(value) for name, value in text.items()}
    else:
        with sdk_said("opentelemetry.util.re") as said:  # the SDK's verdict, its line (which shows the value) kept
            headers = dict(parse_env_headers(text, liberal=True))
        if said:
            invalid_variable(
                source,
                f"{source} is malformed: expected 'name=value,name2=value2' (values percent-encoded; not shown here)",
                "its well-formed headers alone",
            )
    for name, value in list(headers.items()):
        if _CONTROL.search(name) or _CONTROL.search(value):
            problem = (
                f"{source}: the header {_CONTROL.sub('?', name)!r} holds a control character (a line break?); no "
                "request would carry it. Remove it (the value is not shown here)"
            )
            if given is not None:
                raise OTLPSettingsError(problem + ".")
            invalid_variable(source, problem, "the other headers, without this one")
            del headers[name]
    return headers


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _positive(
    name: str, given: float | None, variables: tuple[str, ...], unit: str = "seconds", default: float | None = 10.0
) -> Any:
    """An argument, else the first variable set, else ``default``; a number > 0 either way."""
    value, source = _given_or_variable(given, name, variables)
    if value is None:
        return default
    if given is None:
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, str) or not 0 < value < float("inf"):
        shown = default if default is not None else "the export timeout"
        problem = f"{source}={value!r}: must be a number of {unit} greater than 0 (default: {shown})"
        if given is not None:
            raise OTLPSettingsError(problem + ". With it, nothing would be sent.")
        invalid_variable(source, problem, shown)
        value = default
        if value is None:
            return None
    return int(value) if name in ("max_queue_size", "max_export_batch_size", "max_request_bytes") else value
