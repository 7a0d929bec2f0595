"""OpenTelemetry's lines after the end-of-run account. An export given up on at close (the collector did not
answer within the export timeout) still runs on OpenTelemetry's threads, and logs when it fails ("Failed to export
traces ... DEADLINE_EXCEEDED"); the account has counted its spans as dropped already. Its lines are held, as they
were during the run, until those threads end; then OpenTelemetry's loggers are left as they were found."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable

from .otlp_settings import untap_sdk_loggers

# the threads an export runs on: OpenTelemetry's batch processors ("OtelBatchSpanRecordProcessor"), its metric
# reader, and the bounded close's own
EXPORT_THREADS = ("OtelBatch", "OtelPeriodicExportingMetricReader", "telemetry-jit-otlp-flush")


def untap_when_exports_end(
    tap: logging.Filter | Callable[[logging.LogRecord], bool],
    loggers: Iterable[str],
    others: Collection[threading.Thread] = (),
) -> threading.Thread | None:
    """Take ``tap`` off OpenTelemetry's ``loggers`` now if no export runs, else once every export thread running
    now has ended (on a thread of its own, returned). ``others``: threads not waited for (an OpenTelemetry setup
    of the user's own, running before the exporter started, whose metric reader never ends)."""
    loggers = tuple(loggers)
    running = [
        thread
        for thread in threading.enumerate()
        if thread.name.startswith(EXPORT_THREADS) and thread is not threading.current_thread() and thread not in others
    ]
    if not running:
        untap_sdk_loggers(tap, loggers)
        return None

    def untap_at_the_end() -> None:
        for thread in running:
            thread.join()
        untap_sdk_loggers(tap, loggers)

    waiter = threading.Thread(target=untap_at_the_end, name="telemetry-jit-otlp-late-lines", daemon=True)
    waiter.start()
    return waiter
