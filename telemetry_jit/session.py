"""A telemetry session: nv-one-logger's provider, this process's identity, the exporters and the account of
what telemetry could not do, from :func:`configure` to :func:`shutdown`. A process ``multiprocessing`` spawns
gets an inert session (it re-imports the script but is not the run); a forked one has telemetry off until it
configures its own."""

from __future__ import annotations

import atexit
import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nv_one_logger.api.config import LoggerConfig, OneLoggerConfig, OneLoggerErrorHandlingStrategy
from nv_one_logger.exporter.exporter import Exporter
from nv_one_logger.recorder.default_recorder import ExportCustomizationMode
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName
from nv_one_logger.training_telemetry.api.training_telemetry_provider import (
    DEFAULT_SPANS_EXPORT_BLACKLIST,
    TrainingTelemetryProvider,
)

from telemetry_jit import boundary, identity
from telemetry_jit.compat import distributed
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.exporters import FileExporter, IsolatedExporter
from telemetry_jit.exporters.otlp_settings import OTLPOptions, prometheus_wanted, sdk_disabled, traces_exporter_wanted
from telemetry_jit.exporters.protocols import Flushes, NeverBlocks, RankAware, ReportsDelivery
from telemetry_jit.identity import IdentityTracker
from telemetry_jit.notices import user_line, warn_once
from telemetry_jit.schema import rank_file

if TYPE_CHECKING:
    from telemetry_jit.exporters.otlp import OTLPExporter

_ITERATION_SPANS = (
    StandardTrainingJobSpanName.TRAINING_SINGLE_ITERATION,
    StandardTrainingJobSpanName.VALIDATION_SINGLE_ITERATION,
    StandardTrainingJobSpanName.TESTING_SINGLE_ITERATION,
)
_APP_START = boundary.call_site("nv_one_logger.app_start", "nv-one-logger's on_app_start")
_APP_END = boundary.call_site("nv_one_logger.app_end", "nv-one-logger's on_app_end")
_CLOSE = boundary.call_site("exporter.close", "closing an exporter (OTLP, or one given to configure)")


@dataclass(frozen=True)
class Configuration:
    """One :func:`configure` call's arguments but its exporters: what a spawned rank configures alike with."""

    app_name: str
    file: str | None
    otlp: OTLPOptions | None  # what the OTLP exporter was asked for (secrets from the environment not included)
    global_batch_size: int
    session_tag: str | None
    perf_tag: str | None
    world_size: int | None
    export_iteration_spans: bool
    training_config: dict[str, Any]

    def apply(self, rank: int, local_rank: int, world_size: int) -> Session:
        """:func:`configure` with these arguments, in a process that knows its rank (a spawned rank)."""
        tracker = IdentityTracker()
        tracker.update(rank, local_rank, world_size)
        return _configure(tracker, self, self.otlp, ())


class Session:
    """One run of telemetry in this process, from :func:`configure` to :func:`shutdown`; it passes on any
    attribute of nv-one-logger's provider, so code written against the provider keeps working."""

    def __init__(
        self,
        provider: TrainingTelemetryProvider,
        tracker: IdentityTracker,
        *,
        exporters: Sequence[Exporter] = (),
        configuration: Configuration | None = None,
        inert: str = "",
        account: boundary.Account | None = None,
    ) -> None:
        self.provider = provider
        self.identity = tracker
        self.exporters = tuple(exporters)
        self.configuration = configuration
        self.inert = inert  # why this session records nothing, or ""
        self.ended = bool(inert)
        self.said_where = False  # its reading hint said (once: fit, then validate, test and predict share its file)
        self.account = account or boundary.Account()  # its failed calls; its warnings (account.notices), said once
        self.looked_before = False  # whether a recorder noted what the process compiled before this session

    def __repr__(self) -> str:
        state = f"inert: {self.inert}" if self.inert else "ended" if self.ended else "recording"
        return f"Session({self.configuration.app_name if self.configuration else 'nv-one-logger'!r}, {state})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.provider, name)  # nv-one-logger's provider API, for code written against it

    @property
    def recording(self) -> bool:
        """Whether telemetry records now: the session runs and nv-one-logger has not switched itself off."""
        return not self.ended and nv_one_logger_compat.telemetry_enabled()

    def start_application(self) -> bool:
        """Start nv-one-logger's application span unless one runs (one per process); True when this call did."""
        if not self.recording or nv_one_logger_compat.application_running(self.provider):
            return False
        from nv_one_logger.training_telemetry.api.callbacks import on_app_start

        return _APP_START.call(on_app_start) is not boundary.FAILED

    def set_rank(self, rank: int, local_rank: int, world_size: int) -> None:
        """Which rank this is, once the strategy or launcher knows: every record carries it from now on."""
        if self.ended:
            return
        self.identity.update(rank, local_rank, world_size)
        for exporter in self._all_exporters():  # one built by hand, through nv-one-logger's builder, has its own
            if isinstance(exporter, RankAware) and exporter.identity not in (None, self.identity):
                exporter.identity.update(rank, local_rank, world_size)

    def health(self) -> dict[str, Any]:
        """Failed calls by call site and each exporter's delivery: the file's last record."""
        delivery = {repr(e): e.delivery() for e in self.exporters if isinstance(e, ReportsDelivery)}
        return {"failed_calls": self.account.by_site(), "exporters": delivery}

    def flush(self, timeout_seconds: float | None = None) -> bool:
        """Send what exporters hold now; True when each finished within its bound (default its own)."""
        if self.ended:
            return True
        flushes = [e.force_flush(timeout_seconds) for e in self._all_exporters() if isinstance(e, Flushes)]
        return all(flushes)

    def shutdown(self) -> None:
        """End the application span, flush and close every exporter. Idempotent; also runs at interpreter exit."""
        global _current, _last_ended
        if self.ended:
            return
        self.ended = True
        _last_ended = self.provider
        if _current is self:
            _current = None
            atexit.unregister(shutdown)
        if nv_one_logger_compat.switched_itself_off():  # nv-one-logger logs why only the first time per process
            _say_disabled("see onelogger.err beside the telemetry file")
        from nv_one_logger.training_telemetry.api.callbacks import on_app_end

        if nv_one_logger_compat.telemetry_enabled() and nv_one_logger_compat.application_running(self.provider):
            _APP_END.call(on_app_end)  # nv-one-logger closes the exporters
        # what nv-one-logger did not close (it stopped recording, or its on_app_end failed): the file last,
        # so that its last record accounts for the others
        files = [e for e in self.exporters if isinstance(e, FileExporter)]
        for exporter in [e for e in self.exporters if e not in files and e.ready]:
            _CLOSE.call(exporter.close)
        for file in [e for e in files if e.ready]:
            try:
                file.close()
            except Exception as error:  # noqa: BLE001 - shutdown runs at interpreter exit too: nothing may escape
                message = f"telemetry-jit: could not close {file.path} ({error!r})."
                self.account.notices.warn("closing the file", message, every_rank=True)
        identity.end_run()

    def reading_hint(self) -> str:
        """Where this run's file is and the command that reads it ("" without a file)."""
        file = next((e for e in self.exporters if isinstance(e, FileExporter)), None)
        if file is None:
            return ""
        world_size = self.identity.current().world_size
        where = rank_file(file.shown_path, "*", world_size)
        files = " (one file per rank)" if world_size > 1 else ""
        return f"telemetry-jit: compile telemetry is in {where}{files}; read it with: telemetry-jit summary {where}"

    def _all_exporters(self) -> list[Exporter]:
        return nv_one_logger_compat.exporters(self.provider.recorder) if self.provider.one_logger_ready else []


_current: Session | None = None  # the session in effect, from configure() to shutdown()
_last_ended: TrainingTelemetryProvider | None = None  # the provider of the last session that ended


def configure(
    app_name: str,
    *,
    file: str | os.PathLike[str] | None = "telemetry.jsonl",
    otlp: bool | str | dict[str, Any] | OTLPExporter | None = None,
    exporters: Sequence[Exporter] = (),
    global_batch_size: int = 1,
    session_tag: str | None = None,
    perf_tag: str | None = None,
    world_size: int | None = None,
    export_iteration_spans: bool = False,
    **training_config: Any,
) -> Session:
    """Start a telemetry session: configure nv-one-logger's provider, build and check the exporters. Called
    again while a session runs, it says so and returns that session; after :func:`shutdown`, a new run.

    Args:
        app_name: the application name; over OTLP, ``service.name`` unless ``OTEL_SERVICE_NAME`` (then
            ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) names the service.
        file: JSON Lines file to write (see :class:`telemetry_jit.exporters.FileExporter`);
            ``None`` for none.
        otlp: also export over OTLP (see :class:`telemetry_jit.exporters.OTLPExporter`): ``True``
            for the endpoint from the ``OTEL_EXPORTER_OTLP_*`` variables, an endpoint string, a dict
            of :class:`OTLPExporter` arguments, or an exporter. ``None`` (default) turns it on when
            ``OTEL_TRACES_EXPORTER`` names ``otlp``.
        exporters: further nv-one-logger exporters, each on its own thread (``IsolatedExporter``).
        global_batch_size: samples per optimizer step over all ranks.
        export_iteration_spans: also export per-iteration spans (off by default, as in nv-one-logger).
        training_config: more ``TrainingTelemetryConfig`` fields, e.g. ``log_every_n_train_iterations``.

    Raises:
        TypeError, ValueError: a bad argument, naming it; ``OTLPSettingsError`` (a ``ValueError``): an
            OpenTelemetry variable or argument with which nothing could be sent, naming it and what is
            valid; ``IdentityError``: a rank variable that names no rank.
    """
    if identity.reimporting_main():
        # the script's module level, run again in a spawned worker: that process is not the run
        return Session(TrainingTelemetryProvider.instance(), IdentityTracker(), inert="a spawned worker process")
    configuration = Configuration(
        app_name=app_name,
        file=None if file is None else os.fspath(file),
        otlp=None,
        global_batch_size=global_batch_size,
        session_tag=session_tag,
        perf_tag=perf_tag,
        world_size=world_size,
        export_iteration_spans=export_iteration_spans,
        training_config=training_config,
    )
    return _configure(IdentityTracker(), configuration, otlp, exporters)


def _after_fork_in_child() -> None:
    """The parent's exporters, file and application span are not a forked child's: telemetry is off there."""
    global _current
    session, _current = _current, None
    if session is None:
        return
    session.ended = True
    atexit.unregister(shutdown)
    nv_one_logger_compat.disable()
    identity.forked_from = os.getppid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _say_disabled(error: str) -> None:
    warn_once(
        "nv-one-logger disabled itself",
        f"telemetry-jit: nv-one-logger hit an error in its own code and switched telemetry off for the rest of this "
        f"process: {error.rstrip('.')}. What was recorded before is kept; nothing after it is recorded.",
        every_rank=True,
    )


def _check_training_config(training_config: dict[str, Any]) -> None:
    """nv-one-logger's config drops unknown fields without a word: a typo would keep its default."""
    own = {"global_batch_size_or_fn": "global_batch_size", "perf_tag_or_fn": "perf_tag"}
    valid = sorted(set(TrainingTelemetryConfig.model_fields) - set(own))
    for key in training_config:
        if key in own:
            raise TypeError(f"telemetry_jit.configure: pass {own[key]}=..., not {key}=...")
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"telemetry_jit.configure got an unknown training-config field {key!r}.{hint} Valid fields "
                f"(nv-one-logger's TrainingTelemetryConfig): {', '.join(valid)}."
            )


def _configure(
    tracker: IdentityTracker,
    configuration: Configuration,
    otlp: bool | str | dict[str, Any] | OTLPOptions | OTLPExporter | None,
    exporters: Sequence[Exporter],
) -> Session:
    """:func:`configure`, its exporters sharing ``tracker``."""
    global _current
    app_name, global_batch_size = configuration.app_name, configuration.global_batch_size
    if not isinstance(app_name, str) or not app_name:
        raise ValueError("configure(app_name=...) needs a non-empty application name.")
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or global_batch_size < 1:
        raise ValueError(f"configure(global_batch_size=...) takes a whole number >= 1, got {global_batch_size!r}.")
    _check_training_config(configuration.training_config)
    tracker.current()  # a rank variable that names no rank fails here, before anything is set up
    if _current is not None:
        warn_once(
            ("configured twice", app_name),
            f"telemetry_jit.configure({app_name!r}): a telemetry session is already running in this process "
            f"({_current.configuration.app_name if _current.configuration else 'nv-one-logger'!r}); nv-one-logger "
            "records one application per process, so this call changes nothing and returns that session. Call "
            "telemetry_jit.shutdown() first to start a new one.",
            every_rank=True,
            origin=user_line(),
        )
        return _current
    if identity.forked_from is not None:
        identity.forked_from = None  # a forked child configuring its own telemetry: the parent's is not its own
        nv_one_logger_compat.forget_configuration()
    provider = TrainingTelemetryProvider.instance()
    if provider.one_logger_ready:
        if provider is _last_ended or nv_one_logger_compat.application_ended(provider):  # a new run after shutdown
            nv_one_logger_compat.forget_configuration()
            identity.end_run()
            provider = TrainingTelemetryProvider.instance()
        else:
            warn_once(
                "configured elsewhere",
                "telemetry_jit.configure: nv-one-logger's provider was already configured in this process (through "
                "its own builder API), and it allows one configuration per process, so this call changes nothing "
                "and returns a session of that provider.",
                every_rank=True,
                origin=user_line(),
            )
            return session_of(provider)
    identity.run_id(share=distributed.shared_by_the_job)  # the job's, before any exporter stamps it
    account = boundary.Account()
    boundary.count_into(account)  # from here on, what fails is this session's
    otlp_exporter = _otlp_exporter(otlp, app_name, tracker)
    file = configuration.file
    file_exporter = FileExporter(file, identity=tracker) if file is not None else None
    exporters = [*exporters, *_prometheus_endpoint(app_name)]
    all_exporters = _safe_exporters(file_exporter, otlp_exporter, exporters)  # raises before the provider changes
    log_dir = file_exporter.path.parent if file_exporter is not None else Path.cwd()
    try:
        provider.with_base_config(
            OneLoggerConfig(
                application_name=app_name,
                session_tag_or_fn=configuration.session_tag or app_name,
                world_size_or_fn=configuration.world_size or tracker.current().world_size,
                error_handling_strategy=OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR,
                logger_config=LoggerConfig(
                    log_level="WARNING",
                    log_file_path_for_info=str(log_dir / "onelogger.log"),
                    log_file_path_for_err=str(log_dir / "onelogger.err"),
                ),
                telemetry_config=TrainingTelemetryConfig(
                    global_batch_size_or_fn=global_batch_size,
                    perf_tag_or_fn=configuration.perf_tag or app_name,
                    **configuration.training_config,
                ),
            )
        )
        for exporter in all_exporters:
            provider.with_exporter(exporter)
        # not EXPORT_ALL_SPANS: nv-one-logger 2.3 then passes its default blacklist along and its recorder refuses it
        exported = _ITERATION_SPANS if configuration.export_iteration_spans else ()
        blacklist = [name for name in DEFAULT_SPANS_EXPORT_BLACKLIST if name not in exported]
        provider.with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, blacklist)
        provider.configure_provider()
    except BaseException:
        # nv-one-logger takes one configuration per process: a failed one must not use it up (a notebook retries)
        nv_one_logger_compat.forget_configuration()
        raise
    nv_one_logger_compat.when_disabled(_say_disabled)
    configuration = replace(configuration, otlp=otlp_exporter.options if otlp_exporter is not None else None)
    session = Session(provider, tracker, exporters=all_exporters, configuration=configuration, account=account)
    if file_exporter is not None:
        file_exporter.health = session.health  # the file's last record: what telemetry could not do
    _current = session
    atexit.register(shutdown)
    return session


def _otlp_exporter(
    otlp: bool | str | dict[str, Any] | OTLPOptions | OTLPExporter | None, app_name: str, tracker: IdentityTracker
) -> OTLPExporter | None:
    """The OTLP exporter ``configure(otlp=...)`` asks for, named for the application."""
    if otlp is None:  # the standard variable decides
        otlp = traces_exporter_wanted()
    if isinstance(otlp, OTLPOptions):  # a spawned rank's: as the launching process was asked
        otlp = otlp.given()
    if otlp is False:
        return None
    if sdk_disabled():
        warn_once(
            "OTEL_SDK_DISABLED",
            "telemetry-jit: OTEL_SDK_DISABLED=true switches OpenTelemetry off in this process, so nothing is sent over "
            "OTLP (the file is written as usual).",
            every_rank=True,
        )
        return None
    from telemetry_jit.exporters.otlp import OTLPExporter

    # the application name is a default the job's environment overrides (OTEL_SERVICE_NAME, then service.name in
    # OTEL_RESOURCE_ATTRIBUTES): the user cannot leave it out of configure, so it is no choice made in code
    if otlp is True or isinstance(otlp, str):
        otlp = {} if otlp is True else {"endpoint": otlp}
    if isinstance(otlp, dict):
        otlp = OTLPExporter(**{"identity": tracker, **otlp})
    if not isinstance(otlp, OTLPExporter):
        raise TypeError(
            f"configure(otlp=...) takes True, an endpoint, a dict of OTLPExporter arguments or an OTLPExporter, "
            f"got {type(otlp).__name__}."
        )
    otlp.with_service_name(app_name)
    return otlp


def _prometheus_endpoint(app_name: str) -> list[Exporter]:
    """The endpoint Prometheus scrapes, where ``OTEL_METRICS_EXPORTER`` names ``prometheus``."""
    if not prometheus_wanted() or sdk_disabled():
        return []
    from telemetry_jit.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint()
    endpoint.with_service_name(app_name)
    return [endpoint]


def _safe_exporters(
    file_exporter: FileExporter | None, otlp_exporter: Exporter | None, others: Sequence[Exporter]
) -> list[Exporter]:
    """Every exporter, others' each on its own thread (ours never block), the file last: its last record says
    what the others could not deliver."""
    for exporter in others:
        if not isinstance(exporter, Exporter):
            raise TypeError(
                f"configure(exporters=...) takes nv-one-logger Exporter objects, got {type(exporter).__name__}."
            )
    exporters = [
        *[e if isinstance(e, NeverBlocks) else IsolatedExporter(e) for e in others],
        otlp_exporter,
        file_exporter,
    ]
    return [exporter for exporter in exporters if exporter is not None]


def session_of(provider: TrainingTelemetryProvider) -> Session:
    """The session recording through ``provider``; for one set up with nv-one-logger's builder API, a new one."""
    if _current is not None and _current.provider is provider:
        return _current
    session = Session(provider, IdentityTracker())
    if provider is not TrainingTelemetryProvider.instance() or provider is _last_ended:
        session.ended = True  # telemetry was configured anew since: this provider's application is over
    return session


def resolve(given: Session | TrainingTelemetryProvider | None) -> Session:
    """The session given, or of the provider given; for ``None`` (a spawned rank), this process's."""
    if isinstance(given, Session):
        return given
    if given is None:
        return _current if _current is not None else session_of(TrainingTelemetryProvider.instance())
    if isinstance(given, TrainingTelemetryProvider):
        return session_of(given)
    raise TypeError(
        "expected the Session telemetry_jit.configure(...) returns, or nv-one-logger's "
        f"TrainingTelemetryProvider.instance(); got {type(given).__name__}. Configure first, e.g. with "
        "telemetry_jit.configure(...)."
    )


def configuration() -> Configuration | None:
    """The configuration the running session was started with (``None`` without one)."""
    return _current.configuration if _current is not None else None


def shutdown() -> None:
    """End the running session; without one, an application span nv-one-logger's builder API started."""
    if _current is not None:
        _current.shutdown()
        return
    provider = TrainingTelemetryProvider.instance()
    if provider.one_logger_ready and not nv_one_logger_compat.application_ended(provider):
        Session(provider, IdentityTracker()).shutdown()


def flush(timeout_seconds: float | None = None) -> bool:
    """Send what the running session's exporters hold now (see :meth:`Session.flush`)."""
    return resolve(None).flush(timeout_seconds)
