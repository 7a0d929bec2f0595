"""One model through each entry point (a ``HookedTrainer``'s fit, Lightning Fabric, a plain loop in ``with
CompileTelemetry()``): each maps its hooks onto the one driver, so the records they write are the same, clocks and
ids aside, and so is how each ends: a run that raises fails, one that ran no batch trained nothing, one that ran
batches but compiled nothing finished."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.runs import TelemetryRun, run_status
from telemetry_jit.compat import torch as torch_compat
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import GrpcReceiver

# a shape change is a recompile every time, whichever entry point ran first in this process
STATIC_SHAPES = torch._dynamo.config.patch(automatic_dynamic_shapes=False)
BATCHES = [torch.randn(4, 8, generator=torch.Generator().manual_seed(n)) for n in range(4)] + [torch.randn(2, 8)]


class Net(pl.LightningModule):
    """The model every entry point trains: a graph break in its forward, a recompile at its shorter last batch."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)
        self.fail_at = fail_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        print("", end="")  # a graph break in user code
        return self.head(h)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return loss_of(self, batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    # Fabric calls each hook on the LightningModule it set up too, with the arguments its callbacks get
    def on_train_start(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_exception(self, *args: Any, **kwargs: Any) -> None:
        pass


def loss_of(model: Net, batch: torch.Tensor, index: int) -> torch.Tensor:
    if index == model.fail_at:
        raise RuntimeError(f"a bug at batch {index}")
    return model(batch).pow(2).mean()


def compiled(fail_at: int | None = None, compile_model: bool = True) -> Net:
    """A fresh model: compiled in place, with a layer compiled alone that this torch compiles nothing of."""
    torch._dynamo.reset()
    net = Net(fail_at)
    if compile_model:
        net.compile(backend="eager")
    net.head.compile(backend="eager")  # Module.compile() of torch's own layer: nothing compiled before torch 2.15
    return net


def with_trainer(session: telemetry_jit.Session, net: Net, batches: list[torch.Tensor]) -> None:
    trainer_cls, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, session)
    trainer = trainer_cls(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(net, torch.utils.data.DataLoader(batches, batch_size=None))


def with_fabric(session: telemetry_jit.Session, net: Net, batches: list[torch.Tensor]) -> None:
    telemetry = telemetry_jit.FabricCompileTelemetry(batches=len(batches))
    fabric = L.Fabric(accelerator="cpu", devices=1, callbacks=[telemetry])
    model, optimizer = fabric.setup(net, net.configure_optimizers())
    fabric.call("on_train_start", fabric, model)
    try:
        for index, batch in enumerate(batches):
            fabric.call("on_train_batch_start", index, batch_index=index)
            fabric.backward(loss_of(net, batch, index) if index == net.fail_at else model(batch).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    except Exception as error:
        fabric.call("on_exception", error)
        raise
    fabric.call("on_train_end")


def with_a_plain_loop(session: telemetry_jit.Session, net: Net, batches: list[torch.Tensor]) -> None:
    optimizer = net.configure_optimizers()
    with telemetry_jit.CompileTelemetry(model=net, batches=len(batches)) as telemetry:
        for index, batch in enumerate(batches):
            telemetry.step(index, index)
            loss_of(net, batch, index).backward()
            optimizer.step()
            optimizer.zero_grad()


ENTRY_POINTS: dict[str, Callable[[telemetry_jit.Session, Net, list[torch.Tensor]], None]] = {
    "trainer": with_trainer,
    "fabric": with_fabric,
    "plain loop": with_a_plain_loop,
}


def run_through(entry: str, path: Path, net: Net, batches: list[torch.Tensor], **configured: Any) -> TelemetryRun:
    """``net`` trained by ``entry`` into its own file, the session ended (as the process's exit would)."""
    fresh_provider_state()
    session = telemetry_jit.configure("agree", file=path, **configured)
    try:
        ENTRY_POINTS[entry](session, net, batches)
    finally:
        telemetry_jit.shutdown()
        fresh_provider_state()
    return telemetry_jit.read_telemetry(path)[-1]


_CLOCKS_AND_IDS = ("compile.id", "compile.resources.", "compile.time.", "compile.cache.", "duration", "timestamp")
# the JitConfig selector a Trainer's JitTransform would choose the module by: the Trainer's fix alone has one
_TRAINER_ONLY = ("not_compiled.selector",)


def _kept(attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` without clocks, ids and the host's measurements (memory, CPU time); a graph break's stack by
    its innermost frame (the frames around it are the entry point's own calls)."""
    return {
        key: value[-1:] if key == "graph_break.stack" else value
        for key, value in attributes.items()
        if not key.startswith(_CLOCKS_AND_IDS)
        and key not in _TRAINER_ONLY
        and not key.endswith(("_ms", "_s", "_ms_by_rank"))
        and key != "duration_msec"
        and key != "compile.time_share"
    }


def records(run: TelemetryRun) -> dict[str, Any]:
    """What a run wrote of its compiling, clocks and ids aside: its compiles (each with its events), its
    summaries, the modules it says compiled nothing, whether it trained nothing, and how it ended."""
    compiles = sorted(
        (
            _kept(span.attributes) | {"events": [{"name": e.name, **_kept(e.attributes)} for e in span.events]}
            for span in run.find("compilation")
        ),
        key=repr,
    )
    events = {
        name: [_kept(event.attributes) for event in run.events(name)]
        for name in ("compile_summary", "module_not_compiled", "trained_nothing", "fallback_cost")
    }
    status = run_status(run)
    return {"compiles": compiles, **events, "status": (status.state, status.detail.split(" (in its")[0])}


def _differences(got: Any, expected: Any, where: str = "") -> list[str]:
    """Where two records differ, each difference named by its path (a readable failure)."""
    if isinstance(got, dict) and isinstance(expected, dict):
        return [
            d for key in {**got, **expected} for d in _differences(got.get(key), expected.get(key), f"{where}.{key}")
        ]
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return [
            d for n, (a, b) in enumerate(zip(got, expected, strict=True)) for d in _differences(a, b, f"{where}[{n}]")
        ]
    return [] if got == expected else [f"{where}: {got!r} != {expected!r}"]


@STATIC_SHAPES
def test_one_model_through_a_trainer_fabric_and_a_plain_loop_writes_the_same_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written, hints = {}, {}
    for entry in ENTRY_POINTS:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            run = run_through(entry, tmp_path / f"{entry}.jsonl", compiled(), BATCHES)
        written[entry] = records(run)
        hints[entry] = [
            r.getMessage() for r in caplog.records if "read it with: telemetry-jit summary" in r.getMessage()
        ]
    trainer = written["trainer"]
    assert trainer["compiles"] and trainer["status"] == ("finished", "")
    assert any(c["compile.is_recompile"] and c["train.global_step"] == 4 for c in trainer["compiles"])
    assert any(e["name"] == "graph_break" for c in trainer["compiles"] for e in c["events"])
    assert [s["train.batches_run"] for s in trainer["compile_summary"]] == [len(BATCHES)]
    if not torch_compat.MODULE_COMPILE_TRACES_TORCH_LAYERS:
        assert [m["not_compiled.module"] for m in trainer["module_not_compiled"]] == ["head"]
    assert trainer["trained_nothing"] == []
    for entry in ("fabric", "plain loop"):
        differences = _differences(written[entry], trainer)
        assert not differences, f"{entry} wrote other records than the trainer:\n" + "\n".join(differences)
    for entry, said in hints.items():  # the reading hint, once each, naming the entry point's own file
        assert len(said) == 1 and said[0].endswith(f"summary {tmp_path / entry}.jsonl"), (entry, said)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_run_that_raises_fails_alike_in_its_file_and_over_otlp(entry: str, tmp_path: Path) -> None:
    receiver = GrpcReceiver()
    path = tmp_path / "t.jsonl"
    try:
        with pytest.raises(RuntimeError, match="a bug at batch 2"):
            run_through(
                entry, path, compiled(fail_at=2), BATCHES, otlp={"endpoint": receiver.endpoint, "protocol": "grpc"}
            )
    finally:
        receiver.stop()
    run = telemetry_jit.read_telemetry(path)[-1]
    status = run_status(run)
    assert status.state == "failed" and status.detail.startswith("RuntimeError: a bug at batch 2 (at train step 2)")
    assert cli.main(["check", str(path), "--max-graph-breaks", "100"]) == 3
    received = receiver.received.spans()
    root = next(span for span in received if span.name == "application")
    assert (root.status_code, root.attributes.get("error.type")) == (2, "RuntimeError")  # STATUS_CODE_ERROR
    exceptions = [a for span in received for name, _, a in span.events if name == "exception"]
    assert [a["exception.message"] for a in exceptions][:1] == ["a bug at batch 2"]
    assert list(run.events("trained_nothing")) == []


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_run_of_no_batch_trained_nothing_and_one_of_eager_batches_finished(
    entry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nothing = run_through(entry, tmp_path / "nothing.jsonl", compiled(compile_model=False), [])
    assert run_status(nothing).state == "empty"
    assert [e.attributes["reason"] for e in nothing.events("trained_nothing")]
    torch._dynamo.reset()
    eager = run_through(entry, tmp_path / "eager.jsonl", Net(), BATCHES)  # nothing compiled, on any torch
    assert (run_status(eager).state, list(eager.events("trained_nothing"))) == ("finished", [])
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path / "eager.jsonl"), "--max-graph-breaks", "0", "--max-recompiles", "0"]) == 0
    assert "TRAINED NOTHING" not in capsys.readouterr().out
