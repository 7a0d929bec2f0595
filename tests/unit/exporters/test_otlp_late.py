"""``exporters.otlp_late``: OpenTelemetry's lines after the account held while its exports run, its loggers left
as found once they end, and a setup of the user's own never waited for."""

from __future__ import annotations

import logging
import threading

import pytest

from telemetry_jit.exporters.otlp_late import untap_when_exports_end
from telemetry_jit.exporters.otlp_settings import tap_sdk_loggers

pytestmark = pytest.mark.any_torch

LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"


def held(record: logging.LogRecord) -> bool:
    return record.levelno < logging.WARNING


def test_lines_of_an_export_still_running_are_held_until_it_ends_then_the_logger_is_as_found() -> None:
    logger = logging.getLogger(LOGGER)
    found = list(logger.filters)
    users = threading.Event()
    user_reader = threading.Thread(target=users.wait, name="OtelPeriodicExportingMetricReader", daemon=True)
    user_reader.start()  # the user's own OpenTelemetry, running before and after: never waited for
    before = frozenset(threading.enumerate())
    go, logged = threading.Event(), []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:

        def late_export() -> None:
            go.wait()
            logger.warning("Failed to export traces to 127.0.0.1:1, error code: StatusCode.DEADLINE_EXCEEDED")

        export = threading.Thread(target=late_export, name="OtelBatchSpanRecordProcessor", daemon=True)
        export.start()
        tap_sdk_loggers(held, [LOGGER])
        waiter = untap_when_exports_end(held, [LOGGER], others=before)
        assert waiter is not None and held in logger.filters
        go.set()
        waiter.join(5)
        assert not waiter.is_alive() and logger.filters == found  # left as found, the user's reader still running
        assert logged == []  # the late line was held
        assert user_reader.is_alive()
        tap_sdk_loggers(held, [LOGGER])
        assert untap_when_exports_end(held, [LOGGER], others=before) is None  # nothing of ours runs: at once
        assert logger.filters == found
    finally:
        users.set()
        logger.removeHandler(handler)
