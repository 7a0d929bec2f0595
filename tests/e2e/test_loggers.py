"""Compile figures in the Lightning loggers people already watch: read back from what real loggers
wrote (TensorBoard's event files with tensorboard's own reader, CSVLogger's metrics.csv, MLflow's
local store), at the steps the compiles happened."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import pytest

import telemetry_jit
from telemetry_jit.analysis.summary import summarize
from tests.e2e.conftest import Telemetry
from tests.e2e.test_loops import STATIC_SHAPES, _compiled_model_and_optimizer, train
from tests.models import TRAINER_DEFAULTS, Net, loader

FIGURES = ("time_s", "total_time_s", "compilations", "recompiles", "graph_breaks", "cache_hits")


def _fit(telemetry: Telemetry, logger: object, log_figures: bool = True) -> telemetry_jit.analysis.reader.TelemetryRun:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        telemetry.provider,
        jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"}),
        log_figures=log_figures,
    )
    defaults = {**TRAINER_DEFAULTS, "logger": logger, "log_every_n_steps": 1}
    HookedTrainer(max_epochs=2, **defaults).fit(Net("print"), loader(18, 4), loader(8, 4))  # last batch of 2
    callback.on_app_end()
    return telemetry.end()


def _expected(run: telemetry_jit.analysis.reader.TelemetryRun) -> dict[int, float]:
    """Compile seconds by the step each compile started in, from the telemetry file."""
    by_step: dict[int, float] = defaultdict(float)
    for span in run.find("compilation"):
        by_step[int(span.attributes["train.global_step"])] += span.attributes["compile.duration_ms"] / 1000
    return dict(by_step)


def _csv_figures(path: Path) -> tuple[dict[str, dict[int, float]], list[str]]:
    """A CSV logger's ``compile/`` figures by name and step, and all its columns."""
    logged: dict[str, dict[int, float]] = defaultdict(dict)
    with open(path) as file:
        rows = csv.DictReader(file)
        for row in rows:
            for key, value in row.items():
                if key.startswith("compile/") and value != "":
                    logged[key][int(row["step"])] = float(value)
    return logged, list(rows.fieldnames or [])


def _check(logged: dict[str, dict[int, float]], run: telemetry_jit.analysis.reader.TelemetryRun) -> None:
    expected = _expected(run)
    assert len(expected) >= 2  # the first step, and the smaller last batch
    assert set(logged["compile/time_s"]) == set(expected)  # at the steps the compiles happened
    for step, seconds in expected.items():
        assert logged["compile/time_s"][step] == pytest.approx(seconds, abs=1e-3)
    last = max(expected)
    compiles = run.find("compilation")
    assert logged["compile/compilations"][last] == len(compiles)
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
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    _check(logged, run)


def test_csv_logger_holds_the_compile_figures_at_their_steps(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "csv", name="run")
    run = _fit(telemetry, logger)
    logged, columns = _csv_figures(Path(logger.log_dir) / "metrics.csv")
    assert "val_loss" in columns  # the user's own metrics are still there
    _check(logged, run)


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
    logged = {
        name: {m.step: m.value for m in client.get_metric_history(logger.run_id, name)}
        for name in (f"compile/{figure}" for figure in FIGURES)
    }
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
