"""The recorder on its own: records in, spans out (to a real nv-one-logger provider and file), listeners
told, failures contained. No training run: the records are what a probe would hand over."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from nv_one_logger.training_telemetry.api import callbacks as one_logger
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

import telemetry_jit
from telemetry_jit.causes import CAUSES, Classified
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.recording.console import EagerFallbackAlert
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.recorder import CompileRecorder, Position
from telemetry_jit.recording.stats import CompileStats
from telemetry_jit.records import CompileContext, CompileRecord, GraphBreak


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[TrainingTelemetryProvider]:
    nv_one_logger_compat.forget_configuration()
    yield telemetry_jit.configure("recorder-test", file=tmp_path / "t.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        telemetry_jit.shutdown()
    nv_one_logger_compat.forget_configuration()


def record(compile_id: str = "0/0", trigger: str = "dynamo", **fields: object) -> CompileRecord:
    defaults: dict[str, object] = {"frame": "forward", "location": "/src/train.py:10", "backend": "eager"}
    return CompileRecord(
        source="dynamo",
        compile_id=compile_id,
        trigger=trigger,  # type: ignore[arg-type]
        start_ns=1_000_000_000,
        end_ns=1_250_000_000,
        is_recompile=not compile_id.endswith("/0"),
        **{**defaults, **fields},  # type: ignore[arg-type]
    )


class Remember(CompileListener):
    def __init__(self) -> None:
        self.records: list[CompileRecord] = []

    def recorded(self, record: CompileRecord) -> None:
        self.records.append(record)


def test_a_record_becomes_a_span_under_the_running_loop_with_its_events(
    provider: TrainingTelemetryProvider, tmp_path: Path
) -> None:
    listener = Remember()
    recorder = CompileRecorder(provider, listeners=[listener])
    one_logger.on_train_start(train_iterations_start=0, train_samples_start=0, train_iterations_target_or_fn=10)
    recorder.start(lambda: Position(7, "train"), rank=0)
    breaking = GraphBreak("Call to `torch._dynamo.graph_break()`\n  Explanation: ...", "/src/train.py:12")
    recorder.record(record(graph_breaks=[breaking], recompile_reason=""))
    recorder.record(record("0/1", recompile_reason="0/0: tensor 'x' size mismatch at index 0. expected 8, actual 6"))
    recorder.stop()
    stats = recorder.emit_summary(None)
    one_logger.on_train_end()
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]

    (loop,) = run.find("training_loop")
    spans = sorted(run.find("compilation"), key=lambda s: s.attributes["compile.id"])
    assert [s.parent_id for s in spans] == [loop.span_id, loop.span_id]
    first, second = spans
    assert (first.start_unix_ns, first.end_unix_ns) == (1_000_000_000, 1_250_000_000)
    assert first.attributes["train.global_step"] == 7 and first.attributes["train.stage"] == "train"
    assert [e.attributes["graph_break.location"] for e in first.events] == ["/src/train.py:12"]
    assert first.events[0].attributes["graph_break.reason"] == "Call to `torch._dynamo.graph_break()`"
    assert second.attributes["compile.is_recompile"] and not second.events
    # listeners hear of each record, with where training was
    assert [r.compile_id for r in listener.records] == ["0/0", "0/1"]
    assert all(r.context == CompileContext(7, "train", r.context.parent, 0) for r in listener.records)
    assert (stats.count, stats.recompile_count, stats.graph_break_count) == (2, 1, 1)


def test_a_lazy_backward_graph_of_a_recompile_is_not_another_recompile() -> None:
    stats = CompileStats()
    stats.recorded(record("0/1"))
    stats.recorded(record("0/1", trigger="lazy_backward"))
    assert (stats.count, stats.recompile_count) == (2, 1)


def test_a_failing_listener_costs_one_warning_and_nothing_else(
    provider: TrainingTelemetryProvider, tmp_path: Path
) -> None:
    class Broken(CompileListener):
        def recorded(self, record: CompileRecord) -> None:
            raise KeyError("a listener's bug")

    recorder = CompileRecorder(provider, listeners=[Broken()])
    recorder.start(lambda: Position(0, "train"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for attempt in range(3):
            recorder.record(record(f"0/{attempt}"))
    recorder.stop()
    said = [str(w.message) for w in caught if "compile listener" in str(w.message)]
    assert len(said) == 1 and "failed in Broken.recorded" in said[0] and "a listener's bug" in said[0]
    assert provider.account.by_site()["recording.listener"]["count"] == 3  # counted, said once
    assert recorder.stats.count == 3  # the other listeners still heard
    telemetry_jit.shutdown()
    assert len(telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1].find("compilation")) == 3


def test_the_totals_stay_bounded_whatever_the_run_length() -> None:
    stats = CompileStats()
    for attempt in range(1, 1001):
        stats.recorded(record(f"0/{attempt}", recompile_reason=f"0/{attempt - 1}: size mismatch, {attempt}"))
    assert (stats.count, stats.recompile_count) == (1000, 1000)
    assert len(stats.recompile_reasons) == 200  # distinct reasons kept, the rest still counted
    assert len(stats.attributes(wall_time_s=1.0)["compile.top_recompile_reasons"]) == 5


def test_metrics_count_what_the_spans_say() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from telemetry_jit.recording.stats import CompileMetrics

    reader = InMemoryMetricReader()
    metrics = CompileMetrics(MeterProvider(metric_readers=[reader]))
    breaking = GraphBreak("Call to `torch._dynamo.graph_break()`")
    for item in (record(graph_breaks=[breaking, breaking]), record("0/1"), record("0/1", trigger="lazy_backward")):
        item.context = CompileContext(rank=3)
        metrics.recorded(item)
    points = {
        metric.name: metric.data.data_points[0]
        for resource in reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert points["telemetry_jit.compilations"].value == 3
    assert points["telemetry_jit.recompilations"].value == 1  # the recompile's backward graph is part of it
    assert points["telemetry_jit.graph_breaks"].value == 2
    duration = points["telemetry_jit.compile.duration"]
    assert duration.count == 3 and abs(duration.sum - 0.75) < 1e-9
    assert dict(duration.attributes) == {
        "telemetry_jit.compile.frame": "forward",
        "telemetry_jit.compile.source": "dynamo",
        "telemetry_jit.rank": 3,
    }


def test_the_recompile_limit_warning_names_a_fix_the_user_can_make() -> None:
    def limit_hit(frame: str, location: str) -> CompileRecord:
        return record(
            "3/8",
            frame=frame,
            location=location,
            recompile_limit_hit=True,
            fell_back_to_eager=True,
            failure="torch._dynamo hit config.recompile_limit (8)",
            context=CompileContext(global_step=12, stage="validate"),
            cause=Classified("recompile_limit", "", behind="python_value"),
        )

    with pytest.warns(RuntimeWarning) as caught:
        # Lightning's own `log`, compiled because the user compiled the whole LightningModule
        EagerFallbackAlert().recorded(
            limit_hit("log", "/venv/lib/python3.11/site-packages/lightning/pytorch/core/module.py:531")
        )
        EagerFallbackAlert().recorded(limit_hit("forward", "/home/me/model.py:20"))
    library, own = (str(warning.message) for warning in caught)
    assert "hit torch._dynamo.config.recompile_limit" in library and "at step 12" in library
    assert "Fix that: lightning's code cannot be edited" in library and "JitConfig(module_selector=" in library
    assert f"Fix that: {CAUSES['python_value'].fix_for('validate')}" in own
    assert "cannot be edited" not in own


def test_logger_figures_give_each_step_once_with_the_summarys_counts_and_cache_series_only_with_a_cache() -> None:
    from telemetry_jit.recording.driver import CompileFigures
    from telemetry_jit.recording.stats import CompileStats
    from telemetry_jit.records import CompileContext

    figures, stats = CompileFigures(), CompileStats()

    def compiled(item: CompileRecord, step: int) -> None:
        item.context = CompileContext(global_step=step)
        stats.recorded(item)
        figures.recorded(item)

    compiled(record("0/0"), 0)
    compiled(record("0/0", trigger="lazy_backward"), 0)
    assert figures.take(stats, current_step=0) == []  # step 0 still runs: nothing of it given out yet
    compiled(record("0/1"), 0)  # a recompile in the same step
    ((step, logged),) = figures.take(stats, current_step=1)
    assert step == 0 and logged["compile/time_s"] == 0.75  # the step's three compiles, one value
    assert (logged["compile/frame_compiles"], logged["compile/backward_graphs"], logged["compile/recompiles"]) == (
        2,
        1,
        1,
    )
    assert "compile/cache_hits" not in logged and "compile/cache_time_saved_s" not in logged  # eager: no cache
    compiled(record("1/0", backend="inductor", cache={"fx_graph_local_misses": 1}), 3)
    ((step, logged),) = figures.take(stats)  # the loop ended: every step is over
    assert step == 3 and (logged["compile/cache_hits"], logged["compile/cache_time_saved_s"]) == (0, 0.0)
