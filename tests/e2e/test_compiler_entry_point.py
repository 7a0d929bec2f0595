"""A compiler that splits dynamo's graphs (as thunder does), added as a plug-in in this one file: found through its
package's ``telemetry_jit.compilers`` entry point (a dist-info laid on ``sys.path``; nothing registers it by hand),
it trains under ``HookedTrainer`` with ``JitConfig(backend="splitter")``, and its splits (graph breaks of dynamo's
compiles), its own compiles (a recompile classified by the cause classifier), its cache counts (per watched model)
and its word that it does not optimise are in the run file and the summary; no library file knows of it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import CompileRecord, GraphBreak
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.records import why_slower
from tests.e2e.conftest import fresh_provider_state, unregister_backend
from tests.models import TRAINER_DEFAULTS, Net, loader


class SplitterObserver:
    def __init__(self) -> None:
        self.pending: list[CompileRecord] = []
        self.splits: dict[str, list[GraphBreak]] = {}
        self.model = ""
        self.pieces: list[tuple[int, ...]] = []  # the batch shape each piece was made for

    def attach(self) -> None:
        pass

    def poll(self) -> list[CompileRecord]:
        taken, self.pending = self.pending, []
        return taken

    def detach(self) -> None:
        pass

    def watch(self, model: torch.nn.Module) -> None:
        self.model = type(model).__name__

    def take_splits(self, compile_id: str) -> list[GraphBreak]:
        return self.splits.pop(compile_id, [])

    def cache_counts(self) -> dict[str, tuple[int, int]]:
        return {f"{self.model}/piece{index}": (0, 1) for index in range(len(self.pieces))}


class SplitterBackend:
    """A ``torch.compile`` backend that leaves every ``tanh`` to torch (a split) and runs the graph as captured."""

    name, title, optimizes = "splitter", "toy.split", False

    def __init__(self) -> None:
        self.observer_ = SplitterObserver()

    def check(self, config: Any) -> None:
        pass

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        observer = self.observer_

        def splitter(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            tanhs = [node for node in graph.graph.nodes if node.target is torch.tanh]
            observer.splits[telemetry_jit.dynamo_compile_id()] = [
                GraphBreak("toy.split leaves tanh to torch", counted_by_torch=False, compiler="splitter") for _ in tanhs
            ]
            batch = next(t for t in example_inputs if isinstance(t, torch.Tensor) and not t.requires_grad)
            shape, seen = tuple(batch.shape), observer.pieces[-1:]
            observer.pieces.append(shape)
            reason = f"tensor 'x' size mismatch at index 0. expected {seen[0][0]}, actual {shape[0]}" if seen else ""
            now = time.time_ns()
            observer.pending.append(
                CompileRecord(
                    source="splitter",
                    compile_id=f"{label}/{len(observer.pieces) - 1}",
                    trigger="splitter",
                    start_ns=now,
                    end_ns=now,
                    backend="splitter",
                    frame=f"{label}.piece",
                    is_recompile=bool(seen),
                    recompile_reason=reason,
                )
            )
            return graph.forward

        return telemetry_jit.compile_in_place(module, backend=splitter)

    def observer(self) -> SplitterObserver:
        return self.observer_


def test_a_graph_splitting_compiler_found_by_its_entry_point_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "toy_splitter-0.1.dist-info"
    package.mkdir(parents=True)
    (package / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-splitter\nVersion: 0.1\n")
    (package / "entry_points.txt").write_text(f"[telemetry_jit.compilers]\nsplitter = {__name__}:SplitterBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    fresh_provider_state()
    session = telemetry_jit.configure("splitter", file=tmp_path / "t.jsonl")
    config = telemetry_jit.JitConfig(backend="splitter")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=config)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(42, 4))  # the last batch of 2: recompiles
    telemetry_jit.shutdown()
    monkeypatch.undo()  # the entry point gone, the next test's recorder no longer finds the plug-in

    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    compiles = run.find("compilation")
    dynamo = [s for s in compiles if s.attributes["compile.trigger"] == "dynamo"]
    assert dynamo and {s.attributes["compile.backend"] for s in dynamo} == {"splitter"}
    splits = [e for s in dynamo for e in s.events if e.name == "graph_break"]
    assert len(splits) == 2 * len(dynamo)  # two layers' tanh in each graph
    assert {e.attributes["graph_break.compiler"] for e in splits} == {"splitter"}
    pieces = [s for s in compiles if s.attributes["compile.trigger"] == "splitter"]
    assert [s.attributes["compile.is_recompile"] for s in pieces] == [False, True]
    assert pieces[1].attributes["compile.recompile_cause"] == "last_batch"  # classified: the epoch's last batch
    assert all(s.attributes["compile.backend_optimizes"] is False for s in [*dynamo, *pieces])
    summary = telemetry_jit.format_summary(run)
    assert "toy.split leaves tanh to torch" in summary and "Net/piece1" in summary, summary
    assert summarize(run).digest.plain_backends == {"splitter"}
    assert "splitter only captures graphs" in why_slower(0, 0, {"splitter"}, {"splitter"})


class InPlace:
    """A plug-in that compiles with dynamo through the public helper: what it returns is the library's own check."""

    name, title = "in-place", "compile_in_place"

    def check(self, config: Any) -> None:
        pass

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        return telemetry_jit.compile_in_place(module, backend="eager")

    def observer(self) -> None:
        return None


class SequentialNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_a_plug_in_compiling_an_nn_sequential_with_the_public_helper_is_recorded_on_every_torch(tmp_path: Path) -> None:
    """torch < 2.15 compiles nothing of an ``nn.Sequential`` with ``module.compile()``; ``compile_in_place`` does."""
    telemetry_jit.register_backend(InPlace())
    try:
        fresh_provider_state()
        session = telemetry_jit.configure("in-place", file=tmp_path / "t.jsonl")
        HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
            pl.Trainer, session, jit_config=telemetry_jit.JitConfig(backend="in-place")
        )
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(SequentialNet(), loader(16, 4))
        telemetry_jit.shutdown()
    finally:
        unregister_backend("in-place")
    compiles = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1].find("compilation")
    assert compiles and {s.attributes["compile.backend"] for s in compiles} == {"eager"}  # module.compile(): none
