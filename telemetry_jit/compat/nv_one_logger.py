"""The nv-one-logger adapter: the internals of nv-one-logger 2.3 that telemetry-jit relies on.

Its public API (``TrainingTelemetryProvider``, the ``callbacks`` module, ``Span``/``Event``) is used
directly; what it does not offer publicly is here: handing an already finished span to the
recorder's exporters through its own export filter and error handling, trimming the event list
nv-one-logger keeps on a running span, and forgetting the per-process configuration.
"""

from __future__ import annotations

from typing import Any

from nv_one_logger.core.event import ErrorEvent, Event
from nv_one_logger.core.span import Span, StandardSpanName
from nv_one_logger.exporter.exporter import Exporter
from nv_one_logger.recorder.default_recorder import DefaultRecorder


def application_running(provider: Any) -> bool:
    """Whether nv-one-logger's ``application`` span is running (it allows one per process)."""
    return bool(provider.recorder.get_active_spans_by_name(StandardSpanName.APPLICATION))


def is_exported(recorder: DefaultRecorder, span: Span) -> bool:
    """Whether the recorder's export filter (nv-one-logger's span blacklist) lets ``span`` through."""
    return recorder._should_export_span(span)


def export_finished_span(recorder: DefaultRecorder, span: Span, events: list[Event]) -> None:
    """Hand a span that is already complete, with its events, to the recorder's exporters.

    nv-one-logger's ``start``/``event``/``stop`` exist for spans that stay open while work runs
    (each becomes the implicit parent of the next); a finished span goes straight to the exporters,
    through the recorder's own export filter and per-exporter error handling.
    """
    if not recorder._should_export_span(span):
        return
    for exporter in recorder._exporters:
        recorder._execute_export(exporter, exporter.export_start, span)
        for event in events:
            export = exporter.export_error if isinstance(event, ErrorEvent) else exporter.export_event
            recorder._execute_export(exporter, export, event, span)
        recorder._execute_export(exporter, exporter.export_stop, span)


def exporters(recorder: DefaultRecorder) -> list[Exporter]:
    """The exporters the recorder sends to."""
    return list(recorder._exporters)


def forget_exported_events(span: Span) -> None:
    """Drop the events nv-one-logger keeps on a running span once its exporters have them.

    nv-one-logger appends every event to the span's in-memory list until the span ends and formats
    that whole list on every ``Span.active`` check; it needs only the first one (the span start).
    """
    events = span.events
    if len(events) > 1:
        del events[1:]


def forget_configuration() -> None:
    """Forget the process's nv-one-logger configuration, so the next ``instance()`` is unconfigured.

    nv-one-logger allows one configuration per process; tests and benchmarks need several.
    """
    from nv_one_logger.core.internal.singleton import SingletonMeta

    SingletonMeta._instances.clear()
