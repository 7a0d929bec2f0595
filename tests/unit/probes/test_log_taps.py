"""``probes.log_taps``: torch's log records read without changing what the user's logging shows."""

from __future__ import annotations

import logging

from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.probes.log_taps import GraphBreakLog, cache_bypass_log, ddp_bucket_log
from tests.unit.compat.test_torch import BREAK, record


def test_a_tap_reads_every_record_and_shows_only_what_the_users_logging_would() -> None:
    logger = logging.getLogger("telemetry_jit.tests.tap")
    logger.setLevel(logging.WARNING)
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: shown.append(r.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    tap = GraphBreakLog([logger])  # the graph-break tap on a logger of the test's own
    try:
        tap.install()
        logger.debug(BREAK)  # read, not shown: the user's logger stops at WARNING
        logger.warning("the user's own warning")
        assert [location for location, _, _ in tap.entries] == ["/home/me/model.py:58"]
        assert shown == ["the user's own warning"]
        assert tap.take("Call to `torch._dynamo.graph_break()`")[0] == "/home/me/model.py:58"
        assert tap.take("Call to `torch._dynamo.graph_break()`") == ("", ())  # taken once
    finally:
        tap.uninstall()
        logger.removeHandler(handler)
    assert logger.level == logging.WARNING and not logger.filters  # as it was


def test_a_record_torch_reworded_never_fails_the_logging_call() -> None:
    tap = ddp_bucket_log()
    broken = record(torch_compat.DDP_LOGGER, "DDPOptimizer used bucket cap %s and created %s buckets", "many")
    assert tap.filter(broken) is False and tap.entries == []  # read failed quietly; DEBUG not shown by default
    bypass = cache_bypass_log()
    bypass.filter(record("torch._inductor.codecache", "Bypassing FX Graph Cache because '%s'", "a reason"))
    assert bypass.entries == ["fx_graph: a reason"]
