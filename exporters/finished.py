"""Spans complete when recorded (a compilation), handed to exporters whole: one call (one write, one OTel span),
no nv-one-logger objects, where the exporter takes it (``export_finished_span``), else its usual calls."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from nv_one_logger.core.attributes import Attributes, AttributeValue
from nv_one_logger.core.event import ErrorEvent, Event, StandardEventAttributeName, StandardEventName
from nv_one_logger.core.span import Span, StandardSpanAttributeName
from nv_one_logger.core.time import TracingTimestamp
from nv_one_logger.exporter.exporter import Exporter

from .protocols import TakesFinishedSpans


@dataclass(slots=True)
class FinishedEvent:
    """An event of a :class:`FinishedSpan`; ``error`` marks nv-one-logger's error event (``error_message``)."""

    name: str
    time_unix_ns: int
    attributes: Mapping[str, AttributeValue]
    error: bool = False

    @classmethod
    def error_event(cls, message: str, time_unix_ns: int) -> FinishedEvent:
        return cls(StandardEventName.ERROR.value, time_unix_ns, {_ERROR_MESSAGE: message}, error=True)

    @property
    def message(self) -> str:
        return str(self.attributes.get(_ERROR_MESSAGE, ""))

    def exported_attributes(self) -> dict[str, AttributeValue]:
        """Its attributes as nv-one-logger exports them (it adds the time in milliseconds)."""
        return {**self.attributes, _TIMESTAMP_MSEC: self.time_msec}

    @property
    def time_msec(self) -> int:
        return self.time_unix_ns // 1_000_000


@dataclass(slots=True)
class FinishedSpan:
    """A span recorded after it ended; ``parent``: the nv-one-logger span it belongs under (already exported)."""

    name: str
    parent: Span | None
    start_unix_ns: int
    end_unix_ns: int
    attributes: Mapping[str, AttributeValue]
    events: tuple[FinishedEvent, ...] = ()
    id: uuid.UUID = field(default_factory=uuid.uuid4)

    def exported_attributes(self) -> dict[str, AttributeValue]:
        """Its attributes as nv-one-logger exports them (it adds the duration in milliseconds)."""
        return {**self.attributes, _DURATION_MSEC: self.duration_msec}

    @property
    def duration_msec(self) -> int:
        return (self.end_unix_ns - self.start_unix_ns) // 1_000_000

    def as_nv_one_logger(self) -> tuple[Span, list[Event]]:
        start, end = _timestamp(self.start_unix_ns), _timestamp(self.end_unix_ns)
        span = Span(
            id=self.id,
            name=self.name,
            start_event=Event(StandardEventName.SPAN_START, start),
            parent_span=self.parent,
            span_attributes=Attributes(dict(self.attributes)),
        )
        events: list[Event] = []
        for event in self.events:
            time = _timestamp(event.time_unix_ns)
            nv_event = (
                ErrorEvent(time, event.message)
                if event.error
                else Event(event.name, time, Attributes(dict(event.attributes)))
            )
            # nv-one-logger derives the milliseconds from a float; the exact ones, as the whole path writes them
            nv_event.attributes.add(_TIMESTAMP_MSEC, event.time_msec)
            span.add_event(nv_event)
            events.append(nv_event)
        span.stop(stop_time=end)
        span.add_attribute(_DURATION_MSEC, self.duration_msec)
        return span, events


def export_finished(exporter: Exporter, span: FinishedSpan) -> None:
    """Hand ``span`` to ``exporter``: whole where it takes whole spans, else through its usual calls."""
    if isinstance(exporter, TakesFinishedSpans):
        exporter.export_finished_span(span)
        return
    nv_span, events = span.as_nv_one_logger()
    exporter.export_start(nv_span)
    for event in events:
        if isinstance(event, ErrorEvent):
            exporter.export_error(event, nv_span)
        else:
            exporter.export_event(event, nv_span)
    exporter.export_stop(nv_span)


_ERROR_MESSAGE = StandardEventAttributeName.ERROR_MESSAGE.value
_TIMESTAMP_MSEC = StandardEventAttributeName.TIMESTAMP_MSEC.value
_DURATION_MSEC = StandardSpanAttributeName.DURATION_MSEC.value


def unix_ns(timestamp: TracingTimestamp) -> int:
    return round(timestamp.seconds_since_epoch * 1e9)


def _timestamp(unix_ns: int) -> TracingTimestamp:
    # the wall clock stands in for the performance counter too: nv-one-logger measures a span's
    # duration on that counter, and the two ends of a finished span are wall-clock times
    seconds = unix_ns / 1e9
    return TracingTimestamp(_seconds_since_epoch=seconds, _perf_counter_seconds=seconds)
