"""Compile telemetry from torch._dynamo agrees exactly with torch's own accounting."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

import telemetry_jit
from telemetry_jit import JitConfig, cli, hook_trainer_cls
from telemetry_jit.analysis.reader import SpanRecord, TelemetryRun, read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.causes import normalize_reason
from telemetry_jit.compat.torch import UNAVAILABLE, compile_start_callbacks
from tests.e2e.conftest import Telemetry
from tests.e2e.dynamo_facts import compiles_recorded_by_torch, reset_compile_state, total_graph_breaks
from tests.models import TRAINER_DEFAULTS, Net, loader

MODELS_FILE = "tests/models.py"


def attempt(metric: Any) -> int:
    return int(str(metric.compile_id).split("/")[-1])


def compilation_spans(run: TelemetryRun) -> list[SpanRecord]:
    return sorted(run.find("compilation"), key=lambda span: span.start_unix_ns)


def summary_of(span: SpanRecord) -> dict[str, Any]:
    (event,) = [e for e in span.events if e.name == "compile_summary"]
    return event.attributes


def assert_matches_torch(run: TelemetryRun, breaks_before: int = 0) -> list[SpanRecord]:
    """The run's compilation spans are exactly the compiles torch recorded (the fixture cleared them)."""
    torch_compiles = compiles_recorded_by_torch()
    spans = [s for s in compilation_spans(run) if s.attributes["compile.source"] == "dynamo"]
    assert len(spans) == len(torch_compiles) > 0

    def key(span: SpanRecord) -> tuple[str, bool]:
        return span.attributes["compile.id"], span.attributes["compile.trigger"] == "lazy_backward"

    # ids repeat after torch._dynamo.reset(): a multiset, matched by torch's own start time
    assert sorted(map(key, spans)) == sorted((str(m.compile_id), m.is_forward is False) for m in torch_compiles)
    for metric in torch_compiles:
        span = min(
            (s for s in spans if key(s) == (str(metric.compile_id), metric.is_forward is False)),
            key=lambda s: abs(s.start_unix_ns / 1000 - metric.start_time_us),
        )
        attempt = int(str(metric.compile_id).split("/")[-1])
        assert span.attributes["compile.is_recompile"] is (attempt > 0)
        assert span.attributes["compile.recompile_reason"] == (metric.recompile_reason or "")
        # torch's own start and end (float seconds in nv-one-logger timestamps: sub-microsecond error)
        assert abs(span.start_unix_ns / 1000 - metric.start_time_us) <= 1
        assert abs(span.end_unix_ns / 1000 - metric.end_time_us) <= 1
        # how long it compiled is torch's duration_us (shorter than the window: torch's bookkeeping of the metrics)
        assert round(span.attributes["compile.duration_ms"] * 1000) == metric.duration_us
        parent = run.spans.get(span.parent_id or "")
        assert parent is not None and parent.name in ("training_loop", "validation_loop", "testing_loop", "application")
    events = [e for s in spans for e in s.events if e.name == "graph_break"]
    counted = [e for e in events if e.attributes["graph_break.counted_by_torch"]]
    assert len(counted) == total_graph_breaks() - breaks_before
    assert sum(s.attributes["compile.graph_breaks"] for s in spans) == len(events)
    return spans


def fit(
    telemetry: Telemetry,
    model: pl.LightningModule,
    train: DataLoader,
    val: DataLoader | None = None,
    jit: JitConfig | None = None,
    epochs: int = 2,
    **trainer_kwargs: Any,
) -> TelemetryRun:
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=jit)
    trainer = HookedTrainer(max_epochs=epochs, **{**TRAINER_DEFAULTS, **trainer_kwargs})
    trainer.fit(model, train, val)
    callback.on_app_end()
    return telemetry.run()


def eager_jit(selector: str = "", **kwargs: Any) -> JitConfig:
    return JitConfig(use_torch=True, module_selector=selector, torch_kwargs={"backend": "aot_eager", **kwargs})


@pytest.mark.parametrize(
    ("graph_break", "reason", "line_text"),
    [
        ("print", "print", 'print("", end="")'),
        ("item", "Tensor.item()", "h.sum().item()"),
        ("branch", "Data-dependent", "h.sum() > 0"),
    ],
)
def test_graph_breaks_in_forward(telemetry: Telemetry, graph_break: str, reason: str, line_text: str) -> None:
    run = fit(telemetry, Net(graph_break), loader(16, 4), jit=eager_jit())
    spans = assert_matches_torch(run)
    events = [e for s in spans for e in s.events if e.name == "graph_break"]
    assert events
    # torch counts a data-dependent branch under counters["unimplemented"], not "graph_break"
    assert all(e.attributes["graph_break.counted_by_torch"] is (graph_break != "branch") for e in events)
    first = events[0].attributes
    assert reason.lower() in first["graph_break.reason_full"].lower()
    assert "\n" not in first["graph_break.reason"]
    path, _, line = first["graph_break.location"].rpartition(":")
    assert path.endswith(MODELS_FILE)
    assert line_text in Path(path).read_text().splitlines()[int(line) - 1]
    assert any(s.attributes["compile.trigger"] == "lazy_backward" for s in spans)
    forward = spans[0].attributes
    assert forward["compile.backend"] == "aot_eager"
    assert forward["compile.frame"] == "forward"
    assert forward["compile.location"].startswith(__import__("tests.models").models.__file__)
    assert forward["train.stage"] == "train" and forward["train.global_step"] == 0
    assert forward["compile.time.dynamo_s"] > 0


class _LogsInAProperty(torch.nn.Module):
    """transformers' shape (GPT-2's loss_function warns once in a property): torch breaks the graph at the logging
    call, and logs a second "graph break" for the trace it restarts, which it does not count."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    @property
    def loss_kind(self) -> str:
        logging.getLogger("a_users_library").warning("loss kind unset: mse")
        return "mse"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.lin(x)
        _ = self.loss_kind
        return self.lin(x) * 2


def test_graph_breaks_are_the_ones_torch_counts_not_its_restarted_traces(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """torch's counters['graph_break'] (tlparse's too) is what 'graph breaks' means: the note torch logs for a trace
    it restarts ("Encountered graph break that we cannot resume from") is no break of its own (the oracle's GPT-2:
    20 said, 14 counted)."""
    model = Net()
    model.model = _LogsInAProperty()
    with caplog.at_level(logging.CRITICAL, logger="a_users_library"):
        run = fit(telemetry, model, loader(16, 4), jit=eager_jit(), epochs=1)
    assert_matches_torch(run)
    summary = summarize(run)
    assert summary.digest.break_count == total_graph_breaks() > 0
    assert cli.main(["check", str(telemetry.path), "--max-graph-breaks", str(total_graph_breaks())]) == 0


@torch._dynamo.config.patch(automatic_dynamic_shapes=False)  # a static recompile compiles its own backward
def test_last_batch_of_another_size_is_a_recompile_with_torchs_reason(telemetry: Telemetry) -> None:
    run = fit(telemetry, Net(), loader(18, 4), jit=eager_jit(), epochs=1)  # 4 batches of 4, then 2
    spans = assert_matches_torch(run)
    assert_compiled_dynamic(spans, "false")
    recompiles = [s for s in spans if s.attributes["compile.is_recompile"]]
    assert recompiles
    assert "size mismatch at index 0. expected 4, actual 2" in recompiles[0].attributes["compile.recompile_reason"]
    assert recompiles[0].attributes["train.global_step"] == 4
    # the recompiled frame's backward graph is part of that recompile: torch counts frames compiled again
    assert {s.attributes["compile.trigger"] for s in recompiles} == {"dynamo", "lazy_backward"}
    torch_recompiles = [m for m in compiles_recorded_by_torch() if attempt(m) > 0 and m.is_forward is not False]
    summary = summary_of(run.find("training_loop")[0])
    assert summary["compile.count"] == len(spans)
    assert summary["compile.recompile_count"] == len(torch_recompiles) == 1
    assert summary["compile.top_recompile_reasons"] == ["1x " + torch_recompiles[0].recompile_reason]
    cli_summary = summarize(run)
    assert cli_summary.digest.recompiles == len(torch_recompiles)
    (frame,) = [row for row in cli_summary.digest.frame_rows() if row.recompiles]
    assert list(frame.reasons) == [normalize_reason(torch_recompiles[0].recompile_reason)]
    torch_ms = sum(m.duration_us for m in compiles_recorded_by_torch()) / 1000
    assert summary["compile.total_time_ms"] == pytest.approx(torch_ms, rel=0.01, abs=5)
    assert 0 < summary["compile.time_share"] < 1


def test_validation_batches_of_another_shape_and_users_own_compile(telemetry: Telemetry) -> None:
    model = Net()
    model.model.compile(backend="aot_eager")  # the user's own torch.compile, before fit: no JitTransform
    run = fit(telemetry, model, loader(16, 4), loader(10, 4), epochs=1)  # sanity check sees 4, 4; then 2
    spans = assert_matches_torch(run)
    stages = {s.attributes["train.stage"] for s in spans}
    assert {"sanity_check", "train", "validate"} <= stages
    for span in spans:
        expected = "training_loop" if span.attributes["train.stage"] == "train" else "validation_loop"
        assert run.spans[span.parent_id or ""].name == expected


class Normalize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)


class CastNet(Net):
    """Compiles a parameter-free normalisation that sees float64 in validation, float32 in training."""

    def __init__(self) -> None:
        super().__init__()
        self.normalize = Normalize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(x).float())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x if batch_idx < 2 else x.double()), y)


def test_dtype_change_recompiles(telemetry: Telemetry) -> None:
    model = CastNet()
    model.normalize.compile(backend="eager")
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    trainer.fit(model, loader(16, 4))
    callback.on_app_end()
    spans = assert_matches_torch(telemetry.run())
    reasons = [s.attributes["compile.recompile_reason"] for s in spans if s.attributes["compile.is_recompile"]]
    assert any("dtype mismatch" in reason for reason in reasons), reasons


def test_dynamic_true_does_not_recompile_for_sizes(telemetry: Telemetry) -> None:
    run = fit(telemetry, Net(), loader(18, 4), jit=eager_jit(dynamic=True), epochs=1)
    spans = assert_matches_torch(run)
    assert_compiled_dynamic(spans, "true")
    assert not any("size mismatch" in s.attributes["compile.recompile_reason"] for s in spans)


def assert_compiled_dynamic(spans: list[SpanRecord], dynamic: str) -> None:
    """compile.dynamic on every frame's span, and torch's own record of the graph's inputs agreeing: a batch
    dimension compiled as a symbol under dynamic=True, as a number under "false"."""
    frames = [s for s in spans if s.attributes["compile.trigger"] == "dynamo"]
    assert frames and {s.attributes["compile.dynamic"] for s in frames} == {dynamic}
    if "input_shapes" not in UNAVAILABLE:  # torch 2.8 records no graph_node_shapes
        batch_dims = {s.attributes["compile.input_shapes"][0].split("[", 1)[1].split(",")[0] for s in frames}
        assert all(dim.startswith("s") == (dynamic == "true") for dim in batch_dims), batch_dims


def test_fullgraph_true_has_spans_and_no_breaks(telemetry: Telemetry) -> None:
    run = fit(telemetry, Net(), loader(16, 4), jit=eager_jit(fullgraph=True), epochs=1)
    spans = assert_matches_torch(run)
    assert {s.attributes["compile.fullgraph"] for s in spans if s.attributes["compile.trigger"] == "dynamo"} == {True}
    assert all(not s.events for s in spans)
    assert summary_of(run.find("training_loop")[0])["compile.graph_break_count"] == 0
    # fullgraph reached torch.compile: the same config on a model with a graph break fails as torch does
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=eager_jit(fullgraph=True))
    with pytest.raises(torch._dynamo.exc.Unsupported):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(8, 4))


@torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False)
def test_recompile_limit_hit_is_an_error_event_and_one_warning(telemetry: Telemetry) -> None:
    x = torch.randn(1 + 2 + 3 + 4 + 5, 8)
    batches = [(x[sum(range(1, n)) : sum(range(1, n + 1))],) for n in range(1, 6)]  # sizes 1..5

    class Sizes(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self(batch[0]).pow(2).mean()

    train = DataLoader(batches, batch_size=None)
    said = r"recompile_limit \(2\) at step \d+ .* mostly: a dimension keeps changing.*only postpones"
    with pytest.warns(RuntimeWarning, match=said):
        run = fit(telemetry, Sizes(), train, jit=eager_jit(), epochs=2)
    spans = assert_matches_torch(run)
    failed = [s for s in spans if s.attributes["compile.failed"]]
    assert failed
    assert any(e.is_error and "recompile limit" in e.attributes["error_message"] for s in failed for e in s.events)
    assert failed[0].attributes["compile.frame"] == "forward"
    assert summary_of(run.find("training_loop")[0])["compile.recompile_limit_hits"] == len(failed)


def test_two_compiled_submodules(telemetry: Telemetry) -> None:
    run = fit(telemetry, Net(layers=2), loader(16, 4), jit=eager_jit("layer*"), epochs=1)
    spans = assert_matches_torch(run)
    assert {s.attributes["compile.frame"] for s in spans} == {"forward"}
    dynamo = [s for s in spans if s.attributes["compile.trigger"] == "dynamo"]
    assert len(dynamo) >= 2
    # both blocks share Block.forward: the second one compiles as a recompile of the same code
    assert not dynamo[0].attributes["compile.is_recompile"] and dynamo[1].attributes["compile.is_recompile"]


def test_compile_inside_a_validation_only_run(telemetry: Telemetry) -> None:
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=eager_jit())
    trainer = HookedTrainer(**TRAINER_DEFAULTS)
    trainer.validate(Net(), loader(8, 4), verbose=False)
    callback.on_app_end()
    run = telemetry.run()
    spans = assert_matches_torch(run)
    (loop,) = run.find("validation_loop")
    assert all(run.spans.get(s.parent_id or "") is loop and s.attributes["train.stage"] == "validate" for s in spans)
    assert summary_of(loop)["compile.count"] == len(spans)


def train_losses(hooked: Telemetry | None) -> tuple[list[float], int, int]:
    reset_compile_state()
    model = Net("item")
    model.model.compile(backend="aot_eager")
    trainer_cls = hook_trainer_cls(pl.Trainer, hooked.provider)[0] if hooked else pl.Trainer
    trainer_cls(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    recompiles = sum(int(str(m.compile_id).split("/")[-1]) > 0 for m in compiles_recorded_by_torch())
    return model.losses, total_graph_breaks(), recompiles


def test_telemetry_changes_neither_breaks_nor_recompiles_nor_losses(telemetry: Telemetry) -> None:
    plain = train_losses(None)
    hooked = train_losses(telemetry)
    assert hooked == plain
    assert plain[1] > 0 and plain[2] > 0


def test_callbacks_are_removed_and_a_second_fit_counts_only_its_own(telemetry: Telemetry) -> None:
    registered = list(compile_start_callbacks())
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=eager_jit())
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    trainer.fit(Net(), loader(16, 4))
    assert list(compile_start_callbacks()) == registered
    first = trainer.compile_telemetry.last_stats.count
    assert first > 0
    before = len(compiles_recorded_by_torch())
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    trainer.fit(Net("print"), loader(16, 4))
    assert list(compile_start_callbacks()) == registered
    second = trainer.compile_telemetry.last_stats.count
    assert second == len(compiles_recorded_by_torch()) - before
    callback.on_app_end()
    loops = telemetry.run().find("training_loop")
    assert [summary_of(loop)["compile.count"] for loop in loops] == [first, second]


def test_compile_spans_never_hang_under_dropped_iteration_spans(telemetry: Telemetry) -> None:
    run = fit(telemetry, Net(), loader(16, 4), jit=eager_jit(), epochs=1)
    assert not run.find("training_single_iteration")
    for span in compilation_spans(run):
        assert span.parent_id in run.spans


@torch._dynamo.config.patch(recompile_limit=2000, accumulated_recompile_limit=4000, automatic_dynamic_shapes=False)
def test_a_hundred_recompiles_in_one_step_are_all_recorded(telemetry: Telemetry) -> None:
    """torch keeps only its last 64 CompilationMetrics; 100 compiles inside one training step are more
    than that, and every one is still recorded, with its id and torch's reason."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._dynamo.utils import set_compilation_metrics_limit

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    class ManyShapesInTheFirstStep(Net):
        def __init__(self) -> None:
            super().__init__()
            self.scale = Scale()
            self.scale.compile(backend="eager")

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            for length in range(1, 101 if batch_idx == 0 else 1):
                self.scale(torch.ones(length))  # a shape never seen before: a recompile each
            return super().training_step(batch, batch_idx)

    started: list[str] = []

    def count(args: Any) -> None:  # torch's own account, independent of telemetry-jit
        if args.callback_trigger == CallbackTrigger.DYNAMO:
            started.append(str(args.compile_id))

    set_compilation_metrics_limit(64)  # torch's default (the fixture raised it)
    callback_handler.register_start_callback(count)
    try:
        HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
        trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
        trainer.fit(ManyShapesInTheFirstStep(), loader(12, 4))
        callback.on_app_end()
    finally:
        callback_handler.remove_start_callback(count)
    spans = compilation_spans(telemetry.run())
    assert sorted(s.attributes["compile.id"] for s in spans) == sorted(started) and len(started) == 100
    assert all(s.attributes["compile.recompile_reason"] for s in spans if s.attributes["compile.is_recompile"])
    assert trainer.compile_telemetry.last_stats.recompile_count == 99


CONSOLE_SCRIPT = """
import sys
import torch
from telemetry_jit.probes.dynamo import DynamoProbe
from telemetry_jit.causes import normalize_reason

def f(x):
    x = x + 1
    print("", end="")  # a graph break
    return x * 2

probe = DynamoProbe()
if sys.argv[1] == "probe":
    probe.attach()
torch.compile(f, backend="eager")(torch.ones(3))
records = probe.poll(final=True)
print("locations:", [b.location.rsplit(":", 1)[-1] for r in records for b in r.graph_breaks])
probe.detach()
"""


@pytest.mark.parametrize("torch_logs", ["", "graph_breaks"])
def test_reading_graph_break_locations_leaves_the_console_as_it_was(torch_logs: str, tmp_path: Path) -> None:
    script = tmp_path / "breaks.py"
    script.write_text(CONSOLE_SCRIPT)
    env = {name: value for name, value in os.environ.items() if name != "TORCH_LOGS"}
    if torch_logs:
        env["TORCH_LOGS"] = torch_logs
    plain, probed = (
        subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, env=env, timeout=300)
        for mode in ("plain", "probe")
    )
    assert plain.returncode == probed.returncode == 0, probed.stderr[-2000:]
    assert probed.stderr.count("Graph break") == plain.stderr.count("Graph break")
    assert ("Graph break" in plain.stderr) == bool(torch_logs)  # shown only when the user asked torch for it
    line = CONSOLE_SCRIPT.splitlines().index('    print("", end="")  # a graph break') + 1
    assert f"locations: ['{line}']" in probed.stdout  # and read either way


def test_every_fact_read_from_torch_exists_on_this_torch_and_spans_say_what_is_missing(telemetry: Telemetry) -> None:
    import dataclasses

    from torch._dynamo.utils import CompilationMetrics

    from telemetry_jit.compat import torch as torch_compat

    fields = {f.name for f in dataclasses.fields(CompilationMetrics)}
    read = {name for _, name, _ in torch_compat._PHASES} | set(torch_compat._COUNTS)
    cache = {name for _, name in torch_compat._CACHE}
    # a torch release that drops one of these fails here: teach the torch adapter where it went
    assert read <= fields
    if torch_compat.VERSION[:2] >= (2, 9):  # the local cache counts came with torch 2.9
        assert cache <= fields
    missing = [f"CompilationMetrics.{name}" for name in (read | cache) - fields]
    if not hasattr(torch._dynamo.exc, "get_gbid_documentation_link"):  # torch 2.8 gives no graph-break links
        missing.append("graph-break documentation links")
    if "graph_node_shapes" not in fields:  # torch 2.8 records no input shapes (compile.input_shapes)
        missing.append("CompilationMetrics.graph_node_shapes")
    assert sorted(missing) == sorted(torch_compat.UNAVAILABLE.values())
    run = fit(telemetry, Net(), loader(8, 4), jit=eager_jit())
    for span in compilation_spans(run):
        assert span.attributes.get("compile.unavailable", []) == sorted(torch_compat.UNAVAILABLE)


@pytest.mark.parametrize("hook", ["on_train_batch_start", "on_train_epoch_end"])
def test_torch_dynamo_reset_mid_run_keeps_every_compile_and_graph_break_exact(telemetry: Telemetry, hook: str) -> None:
    reset_at: list[int] = []

    class ResetDynamo(pl.Callback):  # a user's (or a library's) reset between phases
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            if hook == "on_train_batch_start" and trainer.global_step == 3:
                self.reset(trainer)

        def on_train_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if hook == "on_train_epoch_end" and trainer.current_epoch == 0:
                self.reset(trainer)

        def reset(self, trainer: pl.Trainer) -> None:
            torch._dynamo.reset()  # clears dynamo's caches and every compile callback
            reset_at.append(trainer.global_step)

    model = Net("print")
    model.model.compile(backend="aot_eager")
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=2, callbacks=[ResetDynamo()], **TRAINER_DEFAULTS).fit(model, loader(16, 4))
    callback.on_app_end()
    spans = assert_matches_torch(telemetry.run())  # every compile and graph break torch counted, after the reset too
    starts = sorted((s for s in spans if s.attributes["compile.id"] == "0/0"), key=lambda s: s.start_unix_ns)
    assert len(starts) == 2  # compile ids begin again at 0/0 after a reset
    after_reset = [s for s in spans if s.start_unix_ns >= starts[1].start_unix_ns]
    assert {s.attributes["train.global_step"] for s in after_reset} == set(reset_at)  # the step they compiled in
    breaks = [e for s in after_reset for e in s.events if e.name == "graph_break"]
    assert breaks and all(e.attributes["graph_break.location"].endswith(f"{MODELS_FILE}:36") for e in breaks)


@pytest.mark.parametrize("graph_break", [False, True], ids=["whole-graph", "graph-break"])
def test_a_transformer_with_variable_lengths_matches_torch(telemetry: Telemetry, graph_break: bool) -> None:
    from tests.e2e.transformer import LanguageModel, variable_length_batches

    model = LanguageModel(graph_break)
    batches = variable_length_batches([12, 12, 9, 16, 12, 7])  # sequence lengths vary: recompiles
    run = fit(telemetry, model, DataLoader(batches, batch_size=None), jit=eager_jit(), epochs=1)
    spans = assert_matches_torch(run)  # every compile, recompile reason and counted graph break
    torch_recompiles = [m for m in compiles_recorded_by_torch() if attempt(m) > 0 and m.is_forward is not False]
    summary = summary_of(run.find("training_loop")[0])
    assert summary["compile.recompile_count"] == len(torch_recompiles) > 0
    assert summarize(run).digest.recompiles == len(torch_recompiles)
    reasons = sorted(
        s.attributes["compile.recompile_reason"]
        for s in spans
        if s.attributes["compile.trigger"] == "dynamo" and s.attributes["compile.is_recompile"]
    )
    assert reasons == sorted(m.recompile_reason for m in torch_recompiles)
    assert all(reasons)
    breaks = [e for s in spans for e in s.events if e.name == "graph_break"]
    if graph_break:
        assert any(e.attributes["graph_break.location"].endswith("e2e/transformer.py:66") for e in breaks)
    assert len(model.losses) == 6


def test_a_module_compiled_whole_with_its_backward_in_the_step_trains_as_without_telemetry(tmp_path: Path) -> None:
    """``trainer.fit(torch.compile(model))``, Lightning's way, compiles ``training_step`` itself; with manual
    optimization each backward runs inside it, and its graph compiles at the first backward while dynamo's
    frame hook is still set. Telemetry's callbacks run there uncompiled (before, dynamo compiled them, and that
    nested compile waited on torch's callback lock forever): the fit ends, torch compiles the same frames as
    without telemetry, and each is a span."""
    script = Path(__file__).with_name("whole_module_fit.py")

    def frames(out: str) -> list[str]:
        done = subprocess.run([sys.executable, str(script), out], capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    plain = frames("plain")
    hooked = frames(str(tmp_path / "t.jsonl"))
    assert hooked == plain and "3/0 backward" in plain
    (run,) = read_telemetry(tmp_path / "t.jsonl")
    spans = compilation_spans(run)
    assert (
        sorted(
            s.attributes["compile.id"] + (" backward" if s.attributes["compile.trigger"] == "lazy_backward" else "")
            for s in spans
        )
        == plain
    )
    assert not [s for s in spans if "telemetry_jit" in str(s.attributes.get("compile.location"))]


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_dynamic_graphs_backward_is_compiled_within_its_frame_and_not_counted_apart(
    telemetry: Telemetry, dynamic: bool
) -> None:
    # docs/telemetry.md says so: a fix that marks a dimension dynamic shows fewer backward graphs in diff
    model = TwoLayers()
    model.compile(backend="aot_eager")
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        for step, length in enumerate((5, 6, 7)):
            recorder.step(step)
            x = torch.randn(4, length, 8)
            if dynamic:
                torch._dynamo.mark_dynamic(x, 1)
            model(x).sum().backward()
    d = summarize(telemetry.end()).digest
    # static: 5 compiles its forward and, lazily, its backward; 6 recompiles dynamic, its backward within
    assert (d.frame_compiles, d.backward_graphs) == ((1, 0) if dynamic else (2, 1))
