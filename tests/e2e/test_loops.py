"""Compile telemetry beyond the Trainer: a plain PyTorch loop and Lightning Fabric, exact as the Trainer's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import lightning as L
import torch
from nv_one_logger.training_telemetry.api import callbacks as one_logger

import telemetry_jit
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.compat.thunder import import_thunder
from tests.e2e.conftest import Telemetry, fresh_provider_state, needs_thunder
from tests.e2e.dynamo_facts import compiles_recorded_by_torch
from tests.e2e.test_dynamo_telemetry import assert_matches_torch, attempt, summary_of
from tests.e2e.test_quickstart import run_example

# a shape change is a recompile every time (torch may otherwise remember from an earlier run that a
# dimension is dynamic, and compile it dynamic from the start)
STATIC_SHAPES = torch._dynamo.config.patch(automatic_dynamic_shapes=False)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        print("", end="")  # a graph break in user code
        return self.head(h)


SOURCE = Path(__file__).read_text().splitlines()
PRINT_LINE = 1 + SOURCE.index('        print("", end="")  # a graph break in user code')
BATCHES = [torch.randn(4, 8) for _ in range(4)] + [torch.randn(2, 8)]  # the last is shorter: a recompile


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, on_step, backward=None) -> None:
    for step, x in enumerate(BATCHES * 2):
        on_step(step)
        loss = model(x).pow(2).mean()
        (backward or torch.Tensor.backward)(loss)
        optimizer.step()
        optimizer.zero_grad()


def assert_exact(
    run: telemetry_jit.analysis.reader.TelemetryRun, stats: telemetry_jit.CompileStats, parent: str
) -> None:
    spans = assert_matches_torch(run)  # every compile, torch's recompile reasons, every counted graph break
    recompiles = [m for m in compiles_recorded_by_torch() if attempt(m) > 0 and m.is_forward is not False]
    assert stats.recompile_count == len(recompiles) > 0
    assert sorted(stats.recompile_reasons) == sorted(m.recompile_reason for m in recompiles)
    first_recompile = min((s for s in spans if s.attributes["compile.is_recompile"]), key=lambda s: s.start_unix_ns)
    assert first_recompile.attributes["train.global_step"] == 4  # the step with the shorter batch
    assert {s.attributes["train.stage"] for s in spans} == {"train"}
    assert {run.parent(s).name for s in spans} == {parent}
    breaks = [e for s in spans for e in s.events if e.name == "graph_break"]
    where = f"e2e/test_loops.py:{PRINT_LINE}"
    assert breaks and all(e.attributes["graph_break.location"].endswith(where) for e in breaks)
    assert summary_of(run.find(parent)[0])["compile.count"] == len(spans) == stats.count


@STATIC_SHAPES
def test_a_plain_loop_is_exact(telemetry: Telemetry) -> None:
    model = torch.compile(Model(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        train(model, optimizer, recorder.step)
    telemetry_jit.shutdown()
    assert_exact(telemetry.run(), recorder.stats, parent="application")


@STATIC_SHAPES
def test_a_plain_loop_with_nv_one_logger_loop_spans_hangs_compiles_under_them(telemetry: Telemetry) -> None:
    model = torch.compile(Model(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    one_logger.on_app_start()
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        one_logger.on_train_start(train_iterations_start=0, train_samples_start=0, train_iterations_target_or_fn=10)
        train(model, optimizer, recorder.step)
        recorder.__exit__(None, None, None)  # the summary goes on the training loop while it runs
        one_logger.on_train_end()
    telemetry_jit.shutdown()
    assert_exact(telemetry.run(), recorder.stats, parent="training_loop")


@STATIC_SHAPES
def test_fabric_is_exact(telemetry: Telemetry) -> None:
    recorder = telemetry_jit.FabricCompileTelemetry(telemetry.provider)
    fabric = L.Fabric(accelerator="cpu", devices=1, callbacks=[recorder])
    model, optimizer = fabric.setup(*_compiled_model_and_optimizer())
    fabric.call("on_train_start", fabric)
    train(model, optimizer, lambda step: fabric.call("on_train_batch_start", step), backward=fabric.backward)
    fabric.call("on_train_end")
    telemetry_jit.shutdown()
    assert_exact(telemetry.run(), recorder.stats, parent="application")


@needs_thunder
def test_a_plain_loop_records_the_thunder_compiles_of_the_model_it_is_given(telemetry: Telemetry) -> None:
    from telemetry_jit.compilers import compile_with_thunder

    model = Model()
    thunder_module = compile_with_thunder(model.encoder, "encoder").thunder_module  # model itself runs eagerly
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with telemetry_jit.CompileTelemetry(telemetry.provider, model=model) as recorder:
        train(model, optimizer, recorder.step)
    telemetry_jit.shutdown()
    run = telemetry.run()
    spans = run.find("compilation")
    misses = import_thunder().cache_misses(thunder_module)
    assert len(spans) == misses >= 2 and {s.attributes["compile.source"] for s in spans} == {"thunder"}
    assert summary_of(run.find("application")[0])["compile.thunder_modules"] == ["encoder"]


def test_two_sessions_one_after_another_each_warn_of_rank_skew_in_a_plain_loop(tmp_path: Path) -> None:
    """A plain loop given a gather function gets every rank's totals and the skew warning, as the Trainer does;
    the warning is the session's: a second session in the same process says it again."""

    def gather(mine: torch.Tensor) -> torch.Tensor:  # this process as rank 0 of 2; rank 1 compiled 2 minutes longer
        return torch.stack([mine, mine + torch.tensor([0.0, 120_000.0], dtype=mine.dtype)])

    for name in ("first", "second"):
        fresh_provider_state()
        session = telemetry_jit.configure(name, file=tmp_path / f"{name}.jsonl")
        torch._dynamo.reset()  # each session compiles its model afresh
        model = torch.compile(torch.nn.Linear(4, 1), backend="eager")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop = telemetry_jit.CompileTelemetry(session, live=False, gather=gather)
            loop.set_rank(0, 0, 2)
            with loop:
                loop.step(0)
                model(torch.randn(2, 4))
            session.shutdown()
        assert sum("for 120.0 s longer on rank 1" in str(w.message) for w in caught) == 1, name
        (run,) = telemetry_jit.read_telemetry(tmp_path / f"{name}.rank0.jsonl")
        summary = summary_of(run.find("application")[0])
        assert summary["compile.count_by_rank"] == [loop.stats.count] * 2 and loop.stats.count > 0
    fresh_provider_state()


def _compiled_model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.compile(Model(), backend="aot_eager")
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def test_the_plain_loop_example_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "plain.jsonl"
    printed = run_example("plain_loop.py", out).stdout
    (run,) = telemetry_jit.read_telemetry(out)
    compiles = run.find("compilation")
    assert f"{len(compiles)} compilations" in printed and "telemetry-jit summary" in printed
    assert any(s.attributes["compile.is_recompile"] for s in compiles)
    assert any(e.name == "graph_break" for s in compiles for e in s.events)
    # it tells the loop the epoch's length: the recompile at the shorter last batch is named for what it is
    assert "last_batch" in {row.cause for row in summarize(run).causes}


def test_the_fabric_example_on_two_processes_writes_one_file_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "fabric.jsonl"
    printed = run_example("fabric_loop.py", out, "--devices", "2").stdout
    assert "telemetry-jit summary" in printed
    counts = []
    for rank in (0, 1):
        path = tmp_path / f"fabric.rank{rank}.jsonl"
        (run,) = telemetry_jit.read_telemetry(path)
        assert run.rank == rank
        records = [json.loads(line) for line in path.read_text().splitlines()]
        compile_records = [r for r in records if r.get("name") == "compilation"]
        assert compile_records and all((r["rank"], r["world_size"]) == (rank, 2) for r in compile_records)
        compiles = run.find("compilation")
        assert any(s.attributes["compile.is_recompile"] for s in compiles)
        counts.append(len(compiles))
    assert counts[0] == counts[1] > 0  # both ranks compiled alike
