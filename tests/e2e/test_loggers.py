"""Compile figures in the Lightning loggers people already watch: read back from what real loggers
wrote (TensorBoard's event files with tensorboard's own reader, CSVLogger's metrics.csv, MLflow's
local store), at the steps the compiles happened."""

from __future__ import annotations

import contextlib
import csv
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.recording.driver import PREFIX
from tests.e2e.conftest import Telemetry
from tests.e2e.test_loops import STATIC_SHAPES, _compiled_model_and_optimizer, train
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

FIGURES = ("time_s", "total_time_s", "frame_compiles", "backward_graphs", "recompiles", "graph_breaks")
NO_CACHE = ("cache_hits", "cache_time_saved_s")  # the eager backend has no compile cache: no such series


def _hooked(telemetry: Telemetry, **options: Any) -> Any:
    """Lightning's Trainer hooked to ``telemetry``, compiling the model with the eager backend: (class, callback)."""
    jit = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    return telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=jit, **options)


def _fit(telemetry: Telemetry, logger: object, log_figures: bool = True) -> telemetry_jit.analysis.reader.TelemetryRun:
    HookedTrainer, callback = _hooked(telemetry, log_figures=log_figures)
    defaults = {**TRAINER_DEFAULTS, "logger": logger, "log_every_n_steps": 1}
    HookedTrainer(max_epochs=2, **defaults).fit(Net("print"), loader(18, 4), loader(8, 4))  # last batch of 2
    callback.on_app_end()
    return telemetry.end()


def _expected(run: telemetry_jit.analysis.reader.TelemetryRun) -> dict[int, float]:
    """Compile seconds by the step Lightning logged that moment's metrics at, from the telemetry file: a
    training batch's at its global step, a fit's validation after step N at N - 1 (as ``val_loss``)."""
    by_step: dict[int, float] = defaultdict(float)
    for span in run.find("compilation"):
        step = int(span.attributes["train.global_step"])
        if span.attributes["train.stage"] == "validate" and step > 0:
            step -= 1
        by_step[step] += span.attributes["compile.duration_ms"] / 1000
    return dict(by_step)


@contextlib.contextmanager
def _torchs_own_account() -> Iterator[dict[str, Any]]:
    """What torch itself records while the block runs, independent of telemetry-jit: the id of every frame Dynamo
    compiles (its start callbacks) and the graph breaks it counts."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._dynamo.utils import counters

    said: dict[str, Any] = {"compile_ids": []}

    def started(args: Any) -> None:
        if args.callback_trigger == CallbackTrigger.DYNAMO:
            said["compile_ids"].append(str(args.compile_id))

    breaks = sum(counters["graph_break"].values())
    callback_handler.register_start_callback(started)
    try:
        yield said
    finally:
        callback_handler.remove_start_callback(started)
        said["graph_breaks"] = sum(counters["graph_break"].values()) - breaks


Logged = dict[str, dict[int, list[float]]]  # figure -> step -> every value logged at that step


def _csv_figures(path: Path) -> tuple[Logged, list[str]]:
    """A CSV logger's ``compile/`` figures by name and step, and all its columns."""
    logged: Logged = defaultdict(lambda: defaultdict(list))
    with open(path) as file:
        rows = csv.DictReader(file)
        for row in rows:
            for key, value in row.items():
                if key.startswith("compile/") and value != "":
                    logged[key][int(row["step"])].append(float(value))
    return logged, list(rows.fieldnames or [])


def _check(values: Logged, run: telemetry_jit.analysis.reader.TelemetryRun) -> None:
    # one value per key per step, as the logger's own reader gives them back
    assert {(key, step): len(v) for key, by_step in values.items() for step, v in by_step.items() if len(v) != 1} == {}
    assert not [key for key in values if key.removeprefix("compile/") in NO_CACHE and values[key]]
    logged = {key: {step: v[0] for step, v in by_step.items()} for key, by_step in values.items()}
    expected = _expected(run)
    assert len(expected) >= 2  # the first step, and the smaller last batch
    assert set(logged["compile/time_s"]) == set(expected)  # at the steps the compiles happened
    for step, seconds in expected.items():
        assert logged["compile/time_s"][step] == pytest.approx(seconds, abs=1e-3)
    last = max(expected)
    compiles = run.find("compilation")
    digest = summarize(run).digest  # the summary's words and counts: frame compiles, backward graphs apart
    assert (logged["compile/frame_compiles"][last], logged["compile/backward_graphs"][last]) == (
        digest.frame_compiles,
        digest.backward_graphs,
    )
    assert digest.frame_compiles + digest.backward_graphs == len(compiles)
    assert logged["compile/recompiles"][last] == summarize(run).digest.recompiles  # frames, as torch counts
    assert logged["compile/graph_breaks"][last] == sum(s.attributes["compile.graph_breaks"] for s in compiles)
    assert logged["compile/total_time_s"][last] == pytest.approx(sum(expected.values()), abs=1e-3)


def test_tensorboard_holds_the_compile_figures_at_their_steps(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb", name="run")
    run = _fit(telemetry, logger)
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert {f"compile/{name}" for name in FIGURES} <= set(events.Tags()["scalars"])
    logged: Logged = defaultdict(lambda: defaultdict(list))
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            logged[tag][event.step].append(event.value)
    _check(logged, run)


def test_csv_logger_holds_the_compile_figures_at_their_steps(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    with _torchs_own_account() as torch_said:
        run = _fit(telemetry, logger)
    logged, columns = _csv_figures(Path(logger.log_dir) / "metrics.csv")
    assert "val_loss" in columns  # the user's own metrics are still there
    _check(logged, run)
    # the run's totals as torch itself counted them: its frame compiles (compile ids), recompiles (an id's
    # attempt above 0) and graph breaks (counters["graph_break"])
    last = {key: by_step[max(by_step)][0] for key, by_step in logged.items()}
    assert (last["compile/frame_compiles"], last["compile/recompiles"], last["compile/graph_breaks"]) == (
        len(torch_said["compile_ids"]),
        len([i for i in torch_said["compile_ids"] if not i.endswith("/0")]),
        torch_said["graph_breaks"],
    )
    assert last["compile/frame_compiles"] > last["compile/recompiles"] > 0 and last["compile/graph_breaks"] > 0


def test_mlflow_holds_the_compile_figures_at_their_steps(
    telemetry: Telemetry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="mlflow-skinny is in the test extras")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its local file store behind this
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    logger = MLFlowLogger(experiment_name="compile", tracking_uri=uri)
    run = _fit(telemetry, logger)
    client = MlflowClient(tracking_uri=uri)
    logged: Logged = defaultdict(lambda: defaultdict(list))
    for name in (f"compile/{figure}" for figure in (*FIGURES, *NO_CACHE)):
        for metric in client.get_metric_history(logger.run_id, name):
            logged[name][metric.step].append(metric.value)
    _check(logged, run)


def test_one_switch_turns_the_figures_off(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    _fit(telemetry, logger, log_figures=False)
    header = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0]
    assert "compile/" not in header and "val_loss" in header


@STATIC_SHAPES  # as test_loops trains this model: torch would remember its batch dimension as dynamic
def test_fabric_logs_the_compile_figures_through_log_dict(telemetry: Telemetry, tmp_path: Path) -> None:
    import lightning as L
    from lightning.fabric.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="fabric")
    recorder = telemetry_jit.FabricCompileTelemetry(telemetry.provider)
    fabric = L.Fabric(accelerator="cpu", devices=1, callbacks=[recorder], loggers=[logger])
    model, optimizer = fabric.setup(*_compiled_model_and_optimizer())
    fabric.call("on_train_start", fabric)
    train(model, optimizer, lambda step: fabric.call("on_train_batch_start", step), backward=fabric.backward)
    fabric.call("on_train_end")
    logger.finalize("success")
    run = telemetry.end()
    _check(_csv_figures(Path(logger.log_dir) / "metrics.csv")[0], run)


def test_a_validation_compile_is_logged_at_the_step_of_that_validations_own_metrics(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """Dashboards line compile time up with ``val_loss``: Lightning logs a fit's validation one step behind
    ``global_step``, and the compile figures of that validation go to the same step."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    HookedTrainer = _hooked(telemetry, live=False)[0]
    defaults = {**TRAINER_DEFAULTS, "logger": logger, "log_every_n_steps": 1}
    HookedTrainer(max_epochs=2, **defaults).fit(Net(), loader(20, 4), loader(10, 4))  # validation's last: 2
    run = telemetry.end()
    validation = [
        int(s.attributes["train.global_step"])
        for s in run.find("compilation")
        if s.attributes["train.stage"] == "validate" and s.attributes["train.global_step"] > 0
    ]
    assert validation  # the smaller last batch of the first validation after training
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    val_steps = {int(row["step"]) for row in rows if row.get("val_loss")}
    compile_steps = {int(row["step"]) for row in rows if row.get("compile/time_s")}
    for step in validation:
        assert step not in val_steps and step - 1 in val_steps  # Lightning's own: one behind
        assert step - 1 in compile_steps and step not in compile_steps - {0}, (validation, compile_steps)


def _wandb_records(run_file: Path) -> list[bytes]:
    """The records of a W&B run file: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of
    LevelDB-log records (crc 4, length 2, type 1: full, first, middle, last), as W&B's own store writes."""
    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, partial, offset, block = [], b"", 7, 32 * 1024
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # the block's tail is padding
            offset += block - offset % block
            continue
        length = int.from_bytes(data[offset + 4 : offset + 6], "little")
        kind = data[offset + 6]
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            records.append(partial)
    return records


def _wandb_kinds(run_file: Path) -> bytes:
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    kinds = []
    for data in _wandb_records(run_file):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(data)
        except DecodeError:  # W&B's service is still writing it: what follows is not there yet
            break
        kinds.append(str(record.WhichOneof("record_type")))
    return " ".join(kinds).encode()


def _wandb_summary(run_file: Path) -> dict[str, object]:
    """The summary W&B shows for an offline run, replayed from its records in order: each history row sets
    its keys' summary to the row's value, and explicit summary updates set theirs."""
    import json

    from wandb.proto import wandb_internal_pb2

    summary: dict[str, object] = {}
    for data in _wandb_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        items = record.history.item if kind == "history" else record.summary.update if kind == "summary" else []
        for item in items:
            summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def test_weights_and_biases_summary_holds_the_runs_compile_total(telemetry: Telemetry, tmp_path: Path) -> None:
    """W&B keeps a metric's last value as the run's summary: compile/time_s there is the run's total."""
    pytest.importorskip("wandb", reason="W&B is not installed (pip install wandb)")
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="compile", save_dir=str(tmp_path), offline=True)
    run = _fit(telemetry, logger)
    logger.experiment.finish()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while b"exit" not in _wandb_kinds(run_file) and time.monotonic() < deadline:  # W&B's service writes it last
        time.sleep(0.2)
    summary = _wandb_summary(run_file)
    total = sum(s.attributes["compile.duration_ms"] for s in run.find("compilation")) / 1000
    assert summary["compile/total_time_s"] == pytest.approx(total, abs=1e-3)
    assert summary["compile/time_s"] == pytest.approx(total, abs=1e-3)  # not the last step's seconds
    assert summary["compile/frame_compiles"] == summarize(run).digest.frame_compiles


class LoggedLoss(Net):
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss


def test_a_mid_epoch_recompiles_figures_reach_the_logger_before_any_later_step(telemetry: Telemetry) -> None:
    """Loggers such as W&B drop a step lower than one already logged: the figures of a compile in training step N
    are logged as step N + 1 starts, before Lightning logs N + 1, not at the epoch's end."""
    calls: list[tuple[int, bool]] = []  # (step, holds compile figures), in the order the logger got them

    class Recording(Logger):
        name, version = "recording", "0"

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            calls.append((int(step or 0), f"{PREFIX}time_s" in metrics))

        def log_hyperparams(self, *args: object, **kwargs: object) -> None:
            pass

    x = torch.randn(18, 8)
    batches = [list(range(0, 4)), list(range(4, 8)), [8, 9], list(range(10, 14)), list(range(14, 18))]
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_sampler=batches)  # step 2 recompiles
    HookedTrainer, _ = _hooked(telemetry)
    defaults = {**TRAINER_DEFAULTS, "logger": Recording(), "log_every_n_steps": 1}
    HookedTrainer(max_epochs=1, **defaults).fit(LoggedLoss(), data)
    figures_at = [index for index, (_, figures) in enumerate(calls) if figures]
    assert [calls[index][0] for index in figures_at] == [0, 2]  # the first step's compile, the recompile
    for index in figures_at:
        step = calls[index][0]
        assert all(earlier <= step for earlier, _ in calls[:index]), calls


class FailsAfterTheRecompile(Net):
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 2:  # the smaller last batch has just recompiled
            raise RuntimeError("a bug after the recompile")
        return loss


def test_a_failed_fit_still_logs_the_compiles_of_the_step_it_failed_in(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    HookedTrainer = _hooked(telemetry, live=False)[0]
    with pytest.raises(RuntimeError, match="a bug after the recompile"):
        HookedTrainer(max_epochs=1, **{**TRAINER_DEFAULTS, "logger": logger}).fit(
            FailsAfterTheRecompile(), loader(10, 4)
        )
    run = telemetry.end()
    logged, _ = _csv_figures(Path(logger.log_dir) / "metrics.csv")
    expected = _expected(run)
    assert 2 in expected  # the recompile, in the step that failed
    assert {step: values for step, values in logged["compile/time_s"].items()} == {
        step: [pytest.approx(seconds, abs=1e-3)] for step, seconds in expected.items()
    }


class TwoOptimizers(pl.LightningModule):
    """A GAN's shape under manual optimization: a generator and a discriminator, each compiled and stepped by its own
    optimizer in every batch, so that ``trainer.global_step`` advances twice a batch; the generator's loss logged."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.generator = torch.compile(torch.nn.Linear(8, 8), backend="eager")
        self.discriminator = torch.compile(torch.nn.Linear(8, 1), backend="eager")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        g_opt, d_opt = self.optimizers()
        fake = self.generator(batch[0])
        g_loss = self.discriminator(fake).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        d_loss = self.discriminator(fake.detach()).square().mean()  # compiled again in the smaller last batch
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        self.log("g_loss", g_loss)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.generator.parameters(), 0.01),
            torch.optim.SGD(self.discriminator.parameters(), 0.01),
        ]


@pytest.mark.parametrize("fit", ["manual_two_optimizers", "accumulate_grad_batches"])
def test_compile_figures_go_to_the_step_lightning_logs_that_batchs_own_metrics_at(
    telemetry: Telemetry, tmp_path: Path, fit: str
) -> None:
    """Issue 63: under manual optimization with two optimizers ``trainer.global_step`` is twice the batch, and a
    batch's compile row went to step 18 where Lightning logs its ``g_loss`` at 9. Read back from a real CSVLogger:
    each batch's compile seconds at the step of that batch's own metric."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0]
    defaults = {**TRAINER_DEFAULTS, "logger": logger, "log_every_n_steps": 1, "max_epochs": 1}
    if fit == "manual_two_optimizers":
        module, metric, accumulate = TwoOptimizers(), "g_loss", 1
        HookedTrainer(**defaults).fit(module, loader(18, 4))  # 5 batches, the last of 2: compiled again
    else:
        module, metric, accumulate = LoggedLoss(), "loss", 2
        module.model = torch.compile(module.model, backend="eager")
        HookedTrainer(accumulate_grad_batches=2, **defaults).fit(module, loader(18, 4))
    run = telemetry.end()
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    compiled: dict[int, float] = defaultdict(float)  # batch -> its compile seconds, from the telemetry file
    for span in run.find("compilation"):
        compiled[int(span.attributes["train.batch_index"])] += span.attributes["compile.duration_ms"] / 1000
    assert set(compiled) == {0, 4}, compiled  # the first batch, and the smaller last one
    # the steps Lightning logged the metric at: the batches that stepped before (under accumulation it logs the
    # batch that steps, with the batches before it in the same step)
    metric_steps = [int(row["step"]) for row in rows if row.get(metric)]
    assert metric_steps == sorted({batch // accumulate for batch in range(5)}), metric_steps
    logged = {int(row["step"]): float(row["compile/time_s"]) for row in rows if row.get("compile/time_s")}
    expected: dict[int, float] = defaultdict(float)
    for batch, seconds in compiled.items():
        expected[batch // accumulate] += seconds
    assert set(logged) == set(expected), (logged, expected, metric_steps)
    for step, seconds in expected.items():
        assert logged[step] == pytest.approx(seconds, abs=1e-3)
