"""The dynamo probe fed what torch feeds it, compiling nothing: torch's own callback handler runs the probe's
callbacks with ``CallbackArgs``, ``CompilationMetrics`` are appended to torch's own list, graph breaks are
counted in torch's own counters and logged on its ``graph_breaks`` artifact logger. What dynamo would be
doing meanwhile is a function named as its ``_compile`` is, holding the compiled code and backend."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch._dynamo.utils as dynamo_utils
from torch._dynamo.callback import CallbackArgs, CallbackTrigger, callback_handler

from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.probes.dynamo import DynamoProbe
from telemetry_jit.records import CompileContext
from tests.unit.compat.test_torch import BREAK


@pytest.fixture
def torch_state() -> Iterator[None]:
    """torch's compile metrics, graph-break counters and callbacks as they were before the test."""
    metrics = list(dynamo_utils._compilation_metrics)
    breaks = dict(dynamo_utils.counters["graph_break"])
    callbacks = list(callback_handler.start_callbacks), list(callback_handler.end_callbacks)
    dynamo_utils._compilation_metrics.clear()
    dynamo_utils.counters["graph_break"].clear()
    try:
        yield
    finally:
        dynamo_utils._compilation_metrics.clear()
        dynamo_utils._compilation_metrics.extend(metrics)
        dynamo_utils.counters["graph_break"].clear()
        dynamo_utils.counters["graph_break"].update(breaks)
        callback_handler.start_callbacks[:] = callbacks[0]
        callback_handler.end_callbacks[:] = callbacks[1]


def forward(x: Any) -> Any:  # the user's frame dynamo compiles
    return x


# as the summary writes it: absolute, since tests run in a temporary folder (tests/conftest.py) it does not lie under
WHERE = f"forward ({forward.__code__.co_filename}:{forward.__code__.co_firstlineno})"


def inductor(gm: Any, inputs: Any) -> Any:  # the user's backend
    return gm


def _compile(code: Any, compiler_fn: Callable[..., Any], closure: Any, during: Callable[[], None]) -> None:
    """What dynamo's ``_compile`` frame holds while its start callbacks run (torch 2.8 - 2.15)."""
    during()


def compiling(compile_id: str, trigger: CallbackTrigger, breaks: tuple[str, ...] = ()) -> None:
    """One compile as torch brackets it: start callbacks, the graph breaks it counts and logs, end callbacks."""
    args = CallbackArgs(trigger, compile_id)

    def start() -> None:
        callback_handler.run_start_callbacks(args)

    _compile(forward.__code__, inductor, None, start)
    for reason in breaks:
        dynamo_utils.counters["graph_break"][reason] += 1
        torch_compat.graph_break_loggers()[0].debug(BREAK)
    callback_handler.run_end_callbacks(args)


def metrics(compile_id: str, **fields: Any) -> dynamo_utils.CompilationMetrics:
    """torch's metrics of a compile, appended after its end callbacks as torch does."""
    now_us = time.time_ns() // 1000
    metric = dynamo_utils.CompilationMetrics(
        compile_id=compile_id, start_time_us=now_us - 250_000, end_time_us=now_us, **fields
    )
    dynamo_utils._compilation_metrics.append(metric)
    return metric


@pytest.fixture
def started() -> list[str]:
    """What the probe said as each compile began."""
    return []


@pytest.fixture
def probe(torch_state: None, started: list[str]) -> Iterator[DynamoProbe]:
    probe = DynamoProbe(context=lambda: CompileContext(global_step=7, stage="train"), on_compile_start=started.append)
    probe.attach()
    try:
        yield probe
    finally:
        probe.detach()


def test_a_frame_compile_is_recorded_from_its_callbacks_and_metrics(probe: DynamoProbe, started: list[str]) -> None:
    assert not probe.has_news()
    compiling("0/0", CallbackTrigger.DYNAMO, breaks=("Call to `torch._dynamo.graph_break()`",))
    metric = metrics("0/0", is_forward=True, graph_op_count=3, guard_count=5)
    assert probe.has_news()

    (record,) = probe.poll()
    assert (record.compile_id, record.trigger, record.is_recompile) == ("0/0", "dynamo", False)
    assert record.frame == "forward" and record.location.endswith(f"test_dynamo.py:{forward.__code__.co_firstlineno}")
    assert record.backend == "inductor"  # from dynamo's _compile frame, not its metrics
    assert record.context == CompileContext(global_step=7, stage="train")
    assert (record.start_ns, record.end_ns) == (metric.start_time_us * 1000, metric.end_time_us * 1000)
    (graph_break,) = record.graph_breaks
    assert graph_break.reason == "Call to `torch._dynamo.graph_break()`"
    assert graph_break.location == "/home/me/model.py:58"  # the user line, from the log record
    assert record.extra == {"graph_op_count": 3, "guard_count": 5}
    assert started == [f"{WHERE} [0/0]"]
    assert probe.poll() == [] and not probe.has_news()  # each compile once


def test_a_recompile_and_its_lazy_backward_share_the_frame(probe: DynamoProbe, started: list[str]) -> None:
    compiling("0/0", CallbackTrigger.DYNAMO)
    metrics("0/0", is_forward=True)
    compiling("0/1", CallbackTrigger.DYNAMO)
    metrics("0/1", is_forward=True, recompile_reason="tensor 'x' size mismatch at index 0. expected 8, actual 5")
    compiling("0/1", CallbackTrigger.LAZY_BACKWARD)
    metrics("0/1", is_forward=False)

    first, recompile, backward = probe.poll()
    assert recompile.is_recompile and "size mismatch at index 0" in recompile.recompile_reason
    assert (backward.trigger, backward.compile_id, backward.frame) == ("lazy_backward", "0/1", "forward")
    assert backward.backend == "inductor"  # the frame's, remembered from its forward compile
    # no compile is in progress here, so torch has no reason to give while the recompile starts
    assert started[1] == f"{WHERE} [0/1, recompile: unknown]"
    assert started[2] == f"the backward graph of {WHERE} [0/1]"


def test_a_compile_whose_metrics_never_came_is_recorded_at_the_end(probe: DynamoProbe) -> None:
    compiling("1/0", CallbackTrigger.DYNAMO)
    assert probe.poll() == []  # torch may still append its metrics
    (record,) = probe.poll(final=True)
    assert (record.compile_id, record.frame, record.backend) == ("1/0", "forward", "inductor")
    assert 0 < record.start_ns <= record.end_ns


def test_what_is_not_a_compilation_is_not_recorded(probe: DynamoProbe, started: list[str]) -> None:
    for trigger in (CallbackTrigger.CUDAGRAPH_RECORDING, CallbackTrigger.TRITON_AUTOTUNING):
        compiling("0/0", trigger)
    metrics("0/0", is_runtime=True)
    assert probe.poll(final=True) == [] and started == []


def test_callbacks_cleared_by_dynamo_reset_are_news_and_registered_again(
    probe: DynamoProbe,
) -> None:
    callback_handler.clear()  # what torch._dynamo.reset() does to them
    assert probe.has_news()
    probe.ensure_registered()
    assert not probe.has_news()
    compiling("2/0", CallbackTrigger.DYNAMO)
    metrics("2/0", is_forward=True)
    assert [r.compile_id for r in probe.poll()] == ["2/0"]


def test_a_graph_break_counted_while_no_callback_was_registered_goes_to_the_next_unseen_compile(
    probe: DynamoProbe,
) -> None:
    """After ``torch._dynamo.reset()`` and before the probe registers again, torch compiles unseen: its
    metrics still name the frame, and the breaks it counted are given to it."""
    callback_handler.clear()
    dynamo_utils.counters["graph_break"]["Call to `torch._dynamo.graph_break()`"] += 1
    torch_compat.graph_break_loggers()[0].debug(BREAK)
    metrics("3/0", is_forward=True, co_name="forward", co_filename="/home/me/model.py", co_firstlineno=50)
    (record,) = probe.poll()
    assert (record.frame, record.location, record.context) == ("forward", "/home/me/model.py:50", None)
    assert [(b.reason, b.location) for b in record.graph_breaks] == [
        ("Call to `torch._dynamo.graph_break()`", "/home/me/model.py:58")
    ]
