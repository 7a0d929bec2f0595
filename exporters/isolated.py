"""Run any nv-one-logger exporter on its own thread, so a slow, hanging or failing one can neither
block nor crash the training thread (nv-one-logger calls exporters synchronously from the training loop).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

from nv_one_logger.exporter.exporter import BaseExporter, Exporter
from typing_extensions import override

from telemetry_jit.boundary import call_site
from telemetry_jit.notices import Notices

from .finished import FinishedSpan, export_finished

_STOP = object()
_CALLS = call_site(
    "exporter.isolated",
    "an exporter given to configure(exporters=...)",
    bound="its own thread; close waits close_timeout",
)


def _queued(name: str) -> Callable[..., None]:
    """nv-one-logger's exporter call ``name``, its state checked here and its run queued for the worker thread."""

    def queue(self: IsolatedExporter, *args: Any) -> None:
        self._check_state()
        self._submit(getattr(self.exporter, name), *args)

    return override(queue)  # nv-one-logger's exporters check that every override says so


class IsolatedExporter(BaseExporter):
    """Wrap ``exporter`` so that its calls run, in order, on a background thread; calls beyond ``max_queue_size``
    waiting are dropped and counted, as are failures, each said once. Its ``initialize`` runs on the caller's
    thread, so a configuration error still surfaces at configure; ``close`` waits ``close_timeout`` seconds.

    Example::

        provider.with_exporter(IsolatedExporter(MyDashboardExporter()))
    """

    never_blocks = True

    def __init__(self, exporter: Exporter, max_queue_size: int = 10_000, close_timeout: float = 5.0) -> None:
        super().__init__()
        self.exporter = exporter
        self.close_timeout = close_timeout
        self.dropped = 0
        self.errors = 0
        self.undone = 0  # calls still waiting when close gave up
        self._queue: queue.Queue[Any] = queue.Queue(max_queue_size)
        self._worker = threading.Thread(target=self._run, name=f"telemetry-{type(exporter).__name__}", daemon=True)
        self._notices = Notices()

    def __repr__(self) -> str:
        return f"IsolatedExporter({type(self.exporter).__name__})"

    def _warn_once(self, kind: str, message: str) -> None:
        self._notices.warn(kind, f"{self!r}: {message}", every_rank=True)

    def _submit(self, method: Callable[..., None], *args: Any) -> None:
        try:
            self._queue.put_nowait((method, args))
        except queue.Full:
            self.dropped += 1
            self._warn_once("full", "the exporter is too slow or stuck; telemetry records are being dropped.")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            method, args = item
            try:
                _CALLS.bind(method)(*args)
            except Exception as error:  # noqa: BLE001 - the exporter's failure must stay on this thread
                self.errors += 1
                _CALLS.failed(error)

    def delivery(self) -> dict[str, int]:
        return {"calls_dropped": self.dropped + self.undone, "calls_failed": self.errors}

    @override
    def initialize(self) -> None:
        super().initialize()
        self.exporter.initialize()
        self._worker.start()

    export_start = _queued("export_start")
    export_stop = _queued("export_stop")
    export_event = _queued("export_event")
    export_error = _queued("export_error")
    export_telemetry_data_error = _queued("export_telemetry_data_error")

    def export_finished_span(self, span: FinishedSpan) -> None:
        self._check_state()
        self._submit(export_finished, self.exporter, span)

    @override
    def close(self) -> None:
        if self.ready:
            self._submit(self.exporter.close)
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=self.close_timeout)
            self._worker.join(self.close_timeout)
            if self._worker.is_alive():
                self.undone = self._queue.qsize()
                self._warn_once(
                    "stuck", f"did not finish within {self.close_timeout} s; {self.undone} calls left undone."
                )
            if self.dropped or self.errors:
                self._warn_once("summary", f"{self.dropped} records dropped, {self.errors} export calls failed.")
        super().close()
