"""One call to set up nv-one-logger's ``TrainingTelemetryProvider`` for the common case."""

from __future__ import annotations

import atexit
import difflib
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nv_one_logger.api.config import LoggerConfig, OneLoggerConfig, OneLoggerErrorHandlingStrategy
from nv_one_logger.exporter.exporter import Exporter
from nv_one_logger.recorder.default_recorder import ExportCustomizationMode
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName
from nv_one_logger.training_telemetry.api.training_telemetry_provider import (
    DEFAULT_SPANS_EXPORT_BLACKLIST,
    TrainingTelemetryProvider,
)

from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.exporters import FileExporter, IsolatedExporter, OTLPExporter
from telemetry_jit.exporters.otlp_settings import OTLPOptions, traces_exporter_wanted
from telemetry_jit.identity import IdentityTracker, forked_from, note_fork
from telemetry_jit.notices import warn_once

_ITERATION_SPANS = (
    StandardTrainingJobSpanName.TRAINING_SINGLE_ITERATION,
    StandardTrainingJobSpanName.VALIDATION_SINGLE_ITERATION,
    StandardTrainingJobSpanName.TESTING_SINGLE_ITERATION,
)


@dataclass(frozen=True)
class Configuration:
    """The arguments of one :func:`configure` call, minus other exporters: what a process started by
    spawning (a ``ddp_spawn`` rank) needs to configure alike."""

    app_name: str
    file: str | None
    otlp: OTLPOptions | None  # what the OTLP exporter was asked for (secrets from the environment not included)
    global_batch_size: int
    session_tag: str | None
    perf_tag: str | None
    world_size: int | None
    export_iteration_spans: bool
    training_config: dict[str, Any]

    def apply(self, rank: int, local_rank: int, world_size: int) -> TrainingTelemetryProvider:
        """:func:`configure` with these arguments, in a process that knows its rank (a spawned rank)."""
        tracker = IdentityTracker()
        tracker.update(rank, local_rank, world_size)
        arguments = asdict(self)
        return _configure(tracker, **arguments.pop("training_config"), **arguments)


# The configuration in effect, from configure() to shutdown(); while set, shutdown() runs at exit.
_in_effect: Configuration | None = None


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
) -> TrainingTelemetryProvider:
    """Configure ``TrainingTelemetryProvider.instance()`` and return it.

    Telemetry errors never propagate into training (nv-one-logger's
    ``DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR``), and :func:`shutdown` runs at interpreter exit
    unless you call it first.

    Args:
        app_name: the application name (``service.name`` for OTLP backends).
        file: JSON Lines file to write (see :class:`telemetry_jit.exporters.FileExporter`);
            ``None`` for none.
        otlp: also export over OTLP (see :class:`telemetry_jit.exporters.OTLPExporter`): ``True``
            for the endpoint from the ``OTEL_EXPORTER_OTLP_*`` variables, an endpoint string, a dict
            of :class:`OTLPExporter` arguments, or an exporter. ``None`` (default) turns it on when
            ``OTEL_TRACES_EXPORTER`` names ``otlp``.
        exporters: further nv-one-logger exporters; each runs on its own thread
            (:class:`telemetry_jit.exporters.IsolatedExporter`) so it cannot block or crash training.
        global_batch_size: samples per optimizer step over all ranks.
        export_iteration_spans: also export per-iteration spans (off by default, as in nv-one-logger).
        training_config: more ``TrainingTelemetryConfig`` fields, e.g. ``log_every_n_train_iterations``.

    Example::

        provider = telemetry_jit.configure("my-app", file="runs/telemetry.jsonl")
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(Trainer, provider)
    """
    return _configure(
        IdentityTracker(),
        app_name,
        file=file,
        otlp=otlp,
        exporters=exporters,
        global_batch_size=global_batch_size,
        session_tag=session_tag,
        perf_tag=perf_tag,
        world_size=world_size,
        export_iteration_spans=export_iteration_spans,
        **training_config,
    )


_fork_watched = False


def _watch_forks() -> None:
    global _fork_watched
    if not _fork_watched and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _fork_watched = True


_parent_pid = 0


def _before_fork() -> None:
    global _parent_pid
    _parent_pid = os.getpid()


def _after_fork_in_child() -> None:
    """A forked child is its own process: the parent's exporters, file and application span are not
    its own, so telemetry is off here (said when the child starts recording, not by every DataLoader
    worker)."""
    global _in_effect
    if _in_effect is None:
        return
    _in_effect = None
    atexit.unregister(shutdown)
    nv_one_logger_compat.disable()
    note_fork(_parent_pid)


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
    identity: IdentityTracker,
    app_name: str,
    *,
    file: str | os.PathLike[str] | None,
    otlp: bool | str | dict[str, Any] | OTLPOptions | OTLPExporter | None,
    exporters: Sequence[Exporter] = (),
    global_batch_size: int,
    session_tag: str | None,
    perf_tag: str | None,
    world_size: int | None,
    export_iteration_spans: bool,
    **training_config: Any,
) -> TrainingTelemetryProvider:
    """:func:`configure`, its exporters sharing ``identity``."""
    if not isinstance(app_name, str) or not app_name:
        raise ValueError("configure(app_name=...) needs a non-empty application name.")
    _check_training_config(training_config)
    global _in_effect
    if forked_from() is not None and _in_effect is None:
        # a forked child configuring its own telemetry: the parent's configuration is not its own
        nv_one_logger_compat.forget_configuration()
        note_fork(None)
    provider = TrainingTelemetryProvider.instance()
    if provider.one_logger_ready:
        warnings.warn(
            "telemetry_jit.configure: the telemetry provider is already configured in this process and nv-one-logger "
            "allows one configuration per application, so this call changes nothing and returns the existing "
            "provider. Configure once at start-up and reuse TrainingTelemetryProvider.instance().",
            RuntimeWarning,
            stacklevel=3,
        )
        return provider
    otlp_exporter = _otlp_exporter(otlp, app_name, identity)
    file_exporter = FileExporter(file, identity=identity) if file is not None else None
    all_exporters = _safe_exporters(file_exporter, otlp_exporter, exporters)  # raises before the provider changes
    log_dir = file_exporter.path.parent if file_exporter is not None else Path.cwd()
    provider.with_base_config(
        OneLoggerConfig(
            application_name=app_name,
            session_tag_or_fn=session_tag or app_name,
            world_size_or_fn=world_size or int(os.environ.get("WORLD_SIZE", "1")),
            error_handling_strategy=OneLoggerErrorHandlingStrategy.DISABLE_QUIETLY_AND_REPORT_METRIC_ERROR,
            logger_config=LoggerConfig(
                log_level="WARNING",
                log_file_path_for_info=str(log_dir / "onelogger.log"),
                log_file_path_for_err=str(log_dir / "onelogger.err"),
            ),
            telemetry_config=TrainingTelemetryConfig(
                global_batch_size_or_fn=global_batch_size,
                perf_tag_or_fn=perf_tag or app_name,
                **training_config,
            ),
        )
    )
    for exporter in all_exporters:
        provider.with_exporter(exporter)
    provider.with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, _blacklist(export_iteration_spans))
    provider.configure_provider()
    nv_one_logger_compat.when_disabled(_say_disabled)
    if _in_effect is None:
        atexit.register(shutdown)
        _watch_forks()
    _in_effect = Configuration(
        app_name=app_name,
        file=None if file is None else str(file),
        otlp=otlp_exporter.options if otlp_exporter is not None else None,
        global_batch_size=global_batch_size,
        session_tag=session_tag,
        perf_tag=perf_tag,
        world_size=world_size,
        export_iteration_spans=export_iteration_spans,
        training_config=dict(training_config),
    )
    return provider


def _otlp_exporter(
    otlp: bool | str | dict[str, Any] | OTLPOptions | OTLPExporter | None, app_name: str, identity: IdentityTracker
) -> OTLPExporter | None:
    """The OTLP exporter ``configure(otlp=...)`` asks for, named for the application."""
    if otlp is None:  # the standard variable decides
        otlp = traces_exporter_wanted()
    if isinstance(otlp, OTLPOptions):  # a spawned rank's: as the launching process was asked
        otlp = otlp.given()
    if otlp is False:
        return None
    if otlp is True:
        return OTLPExporter(service_name=app_name, identity=identity)
    if isinstance(otlp, str):
        return OTLPExporter(endpoint=otlp, service_name=app_name, identity=identity)
    if isinstance(otlp, dict):
        return OTLPExporter(**{"service_name": app_name, "identity": identity, **otlp})
    if isinstance(otlp, OTLPExporter):
        otlp.with_service_name(app_name)
        return otlp
    raise TypeError(
        f"configure(otlp=...) takes True, an endpoint, a dict of OTLPExporter arguments or an OTLPExporter, "
        f"got {type(otlp).__name__}."
    )


def _safe_exporters(
    file_exporter: FileExporter | None, otlp_exporter: OTLPExporter | None, others: Sequence[Exporter]
) -> list[Exporter]:
    """Every exporter, those not our own each on its own thread: ours never block (a local append;
    OTLP sends from its own thread), others might."""
    for exporter in others:
        if not isinstance(exporter, Exporter):
            raise TypeError(
                f"configure(exporters=...) takes nv-one-logger Exporter objects, got {type(exporter).__name__}."
            )
    safe = (FileExporter, OTLPExporter, IsolatedExporter)
    exporters = [file_exporter, *[e if isinstance(e, safe) else IsolatedExporter(e) for e in others], otlp_exporter]
    return [exporter for exporter in exporters if exporter is not None]


def _blacklist(export_iteration_spans: bool) -> list[Any]:
    # not EXPORT_ALL_SPANS: nv-one-logger 2.3 then passes its default blacklist along and its recorder refuses it
    return [
        name for name in DEFAULT_SPANS_EXPORT_BLACKLIST if not (export_iteration_spans and name in _ITERATION_SPANS)
    ]


def set_rank(provider: TrainingTelemetryProvider, rank: int, local_rank: int, world_size: int) -> None:
    """Tell the provider's exporters which rank this process is (each rank then writes its own file),
    once the trainer's strategy or the loop's launcher knows it."""
    if not nv_one_logger_compat.telemetry_enabled():
        return
    for exporter in nv_one_logger_compat.exporters(provider.recorder):
        for each in (exporter, getattr(exporter, "exporter", None)):  # an IsolatedExporter holds another
            tracker = getattr(each, "identity", None)
            if isinstance(tracker, IdentityTracker):
                tracker.update(rank, local_rank, world_size)


def configuration() -> Configuration | None:
    """The configuration :func:`configure` put in effect (``None`` if telemetry was set up otherwise,
    or after :func:`shutdown`). Other exporters passed with ``exporters=`` are not part of it."""
    return _in_effect


def shutdown() -> None:
    """End telemetry now: the application span ends (open loop spans with it) and every exporter is
    flushed and closed, each within its own bound (OTLP: one export timeout). Idempotent; it also
    runs at interpreter exit when you do not call it.

    Example::

        provider = telemetry_jit.configure("my-app", file="runs/telemetry.jsonl")
        ...
        telemetry_jit.shutdown()
    """
    from nv_one_logger.training_telemetry.api.callbacks import on_app_end

    global _in_effect
    if _in_effect is not None:
        atexit.unregister(shutdown)
        _in_effect = None
        if nv_one_logger_compat.switched_itself_off():  # nv-one-logger logs why only the first time per process
            _say_disabled("see onelogger.err beside the telemetry file")
    provider = TrainingTelemetryProvider.instance()
    try:
        # stopped recording (an internal error): nv-one-logger would skip on_app_end, with a warning
        if nv_one_logger_compat.telemetry_enabled() and nv_one_logger_compat.application_running(provider):
            on_app_end()
    except Exception:  # noqa: BLE001 - often interpreter exit: nothing left to report to
        pass


def flush(timeout_seconds: float | None = None) -> bool:
    """Send what exporters hold now, without ending anything (the file exporter writes as it goes).
    True when every exporter finished within its bound (``timeout_seconds``, default each one's own)."""
    provider = TrainingTelemetryProvider.instance()
    if not provider.one_logger_ready:
        return True
    flushed = [
        exporter.force_flush(timeout_seconds)
        for exporter in nv_one_logger_compat.exporters(provider.recorder)
        if hasattr(exporter, "force_flush")
    ]
    return all(flushed)
