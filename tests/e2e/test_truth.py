"""Every statement true on the runs users have: torch's own layers compiled, fit then validate, predict,
the Tuner, a sanity check, a failed and a killed run, the recompile limit, a break reached from two lines;
and the fix loop closed: the named fix applied to the same run, ``diff`` and ``check`` say exactly what
changed (docs/fixing.md, docs/ci-gate.md)."""

from __future__ import annotations

import inspect
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.runs import run_status
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.causes import CAUSES
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.recording.fallback_cost import FallbackCostMeter
from telemetry_jit.terminal import frame_shown
from tests.e2e import dynamo_facts
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Block
from tests.words import flat, short_paths

ROOT = Path(__file__).resolve().parents[2]
EAGER = {"backend": "eager"}


def data(samples: int, batch: int, width: int = 8, seed: int = 0, **loader: Any) -> DataLoader:
    x = torch.randn(samples, width, generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=batch, **loader)


class Regressor(pl.LightningModule):
    """``self.model`` is whatever the test compiles; every step calls it."""

    def __init__(self, model: torch.nn.Module | None = None, fail_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = model or torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.fail_at = fail_at
        self.batch_size = 8  # the Tuner scales it

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise ValueError("a bug in training_step")
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.model(x), y), add_dataloader_idx=False)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.model(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def hooked(telemetry: Telemetry, selector: str = "", **torch_kwargs: Any) -> type[pl.Trainer]:
    config = telemetry_jit.JitConfig(use_torch=True, module_selector=selector, torch_kwargs={**EAGER, **torch_kwargs})
    return telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)[0]


def run_after_the_fix(tmp_path: Path) -> Telemetry:
    """The run after the user applied a fix, as a new process has it: a session of its own (``fixed.jsonl``),
    torch's compile caches and counters empty."""
    fresh_provider_state()
    dynamo_facts.reset_compile_state()
    path = tmp_path / "fixed.jsonl"
    return Telemetry(telemetry_jit.configure("fixed", file=path), path)


def said(*args: str) -> tuple[int, str]:
    """What the command prints (both streams, wrapping undone) and its exit status."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(args))
    return status, flat(out.getvalue() + err.getvalue())


def frames_compiled() -> int:
    return torch_compat.frames_compiled()


# -- torch's own layers ------------------------------------------------------------------------------
LAYERS = {  # selector, the model, its data
    "sequential": ("", lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))),
    "linear": ("1", lambda: torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(8, 1))),
    "transformer-layers": (
        "0.layers.*",
        lambda: torch.nn.Sequential(
            torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2)
        ),
    ),
}


def layer_data(case: str) -> DataLoader:
    if case != "transformer-layers":
        return data(32, 8)
    x = torch.randn(16, 5, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x), batch_size=4)


def selected(model: torch.nn.Module, selector: str) -> list[tuple[torch.nn.Module, str]]:
    """``(parent, name)`` of each module ``selector`` names (a trailing ``*``: every child)."""
    parts = selector.split(".") if selector else []
    parent = model
    for part in parts[:-1]:
        parent = getattr(parent, part)
    if not parts:
        return []
    names = [name for name, _ in parent.named_children()] if parts[-1] == "*" else [parts[-1]]
    return [(parent, name) for name in names]


@pytest.mark.parametrize("case", list(LAYERS))
def test_torchs_own_layers_compile_in_place_and_checkpoints_load_into_the_plain_model(
    telemetry: Telemetry, case: str
) -> None:
    selector, make = LAYERS[case]
    before = frames_compiled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = hooked(telemetry, selector)(max_epochs=1, **{**TRAINER_DEFAULTS, "enable_checkpointing": True})
        trainer.fit(Regressor(make()), layer_data(case))
    ours = frames_compiled() - before
    assert ours > 0 and not [w for w in caught if "never ran" in str(w.message)]
    # the same fit, plain Lightning, each selected module replaced by torch.compile(module): what torch compiles
    dynamo_facts.reset_compile_state()
    plain = Regressor(make())
    if selector:
        for parent, name in selected(plain.model, selector):
            setattr(parent, name, torch.compile(getattr(parent, name), backend="eager"))
    else:
        plain.model = torch.compile(plain.model, backend="eager")
    before = frames_compiled()
    pl.Trainer(max_epochs=1, **TRAINER_DEFAULTS).fit(plain, layer_data(case))
    assert ours == frames_compiled() - before
    # the checkpoint of the compiled run loads into the plain model, strictly: its state_dict keys did not change
    (checkpoint,) = Path(trainer.default_root_dir).rglob("*.ckpt")
    Regressor(make()).load_state_dict(torch.load(checkpoint, weights_only=False)["state_dict"], strict=True)
    run = telemetry.end()
    frames = {row.frame for row in summarize(run).digest.frame_rows()}
    assert frames and all(frame.endswith(".forward") for frame in frames), frames  # named by the layer class


class CompilesItsModel(Regressor):
    """Compiles its torch layers itself, with ``Module.compile()`` in ``configure_model`` (``compile_it``)."""

    def __init__(self, compile_it: bool) -> None:
        super().__init__()
        self.compile_it = compile_it

    def configure_model(self) -> None:
        if self.compile_it:
            self.model.compile(backend="eager")


def test_torchs_layers_given_to_module_compile_are_said_to_run_eagerly_and_the_named_fix_compiles_them(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """torch before 2.15 compiles nothing of its own layers under ``Module.compile()`` and says nothing
    (pytorch/pytorch#150915); the run says which module runs eagerly, at its first training batch and in the
    summary, and the gate fails it. The fix it names, applied, compiles the module: diff and check say so."""
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0]
    before = frames_compiled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(CompilesItsModel(True), data(32, 8), data(16, 8))
    compiled = frames_compiled() - before
    run = telemetry.end()
    live = [str(w.message) for w in caught if "was compiled with Module.compile()" in str(w.message)]
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    if torch_compat.MODULE_COMPILE_TRACES_TORCH_LAYERS:  # torch compiles them: nothing to say
        assert compiled > 0 and not live and not summarize(run).not_compiled and status == 0
        return
    assert compiled == 0 and len(live) == 1, live
    assert live[0].startswith("telemetry-jit: `model` (Sequential) was compiled with Module.compile()")
    assert "JitConfig(module_selector='*', use_torch=True)" in live[0]  # the root its selectors resolve against
    (found,) = summarize(run).not_compiled
    assert (found.module, found.cls, found.selector) == ("model", "torch.nn.modules.container.Sequential", "*")
    assert "1. `model` (Sequential) was compiled with Module.compile()" in said("summary", str(telemetry.path))[1]
    assert status == 1 and "it runs eagerly, without compilation" in out
    (facts,) = json.loads(said("summary", str(telemetry.path), "--json")[1])["runs"]
    assert [entry["module"] for entry in facts["not_compiled"]] == ["model"]

    fixed = run_after_the_fix(tmp_path)
    before = frames_compiled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the fix as named: the call removed, JitTransform compiles the root
        hooked(fixed, "*")(max_epochs=1, **TRAINER_DEFAULTS).fit(CompilesItsModel(False), data(32, 8), data(16, 8))
    assert frames_compiled() - before > 0
    assert not [w for w in caught if "Module.compile()" in str(w.message)]
    fixed.end()
    out = said("diff", str(telemetry.path), str(fixed.path))[1]
    assert "fixed: modules compiled to no effect in the base run: `model` (Sequential)" in out
    facts = json.loads(said("diff", str(telemetry.path), str(fixed.path), "--json")[1])
    assert (facts["fixed_not_compiled"], facts["new_not_compiled"]) == (["model"], [])
    assert said("check", str(fixed.path), "--no-eager-fallback")[0] == 0


def test_jit_transform_compiles_a_layer_the_users_module_compile_left_uncompiled(telemetry: Telemetry) -> None:
    model = Regressor()
    model.model.compile(backend="eager")  # once, where the model is built: nothing compiles of it before 2.15
    before = frames_compiled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked(telemetry, "*")(max_epochs=1, **TRAINER_DEFAULTS).fit(model, data(32, 8))
    assert frames_compiled() - before > 0
    assert not [w for w in caught if "Module.compile()" in str(w.message) or "never ran" in str(w.message)]
    assert not summarize(telemetry.end()).not_compiled


# -- evaluation: fit then validate, predict --------------------------------------------------------
def test_validate_after_fit_is_the_inference_mode_price_and_its_fix_removes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    model = Regressor()
    trainer = hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS)
    trainer.fit(model, data(32, 8), data(16, 8))
    trainer.validate(model, data(16, 8), verbose=False)
    run = telemetry.end()
    s = summarize(run)
    rows = {(row.cause, row.kind): row for row in s.causes}
    assert ("inference_mode", "eval") in rows and not rows[("inference_mode", "eval")].unexpected
    text = flat(telemetry_jit.format_summary(run))
    assert "what to fix first" not in text  # a price, not something to fix
    assert "validate/test/predict run outside fit under inference mode" in text
    assert "Trainer(inference_mode=False) avoids them" in text
    assert "compiling outside the training loop" in text and "validation" in text  # shown apart, not in the share
    assert s.share is not None and s.share <= 1
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "0")[0] == 0
    # the fix, on the same run
    fixed = run_after_the_fix(tmp_path)
    model = Regressor()
    trainer = hooked(fixed)(max_epochs=1, inference_mode=False, **TRAINER_DEFAULTS)
    trainer.fit(model, data(32, 8), data(16, 8))
    trainer.validate(model, data(16, 8), verbose=False)
    fixed.end()
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles: inference_mode (expected)" in out


def test_predict_with_a_remainder_gets_the_evaluation_fix_never_drop_last(telemetry: Telemetry, tmp_path: Path) -> None:
    model = Regressor()
    trainer = hooked(telemetry)(**TRAINER_DEFAULTS)
    trainer.predict(model, data(200, 32))  # 6 batches of 32, then 8: drop_last would lose 8 predictions
    telemetry.end()
    status, out = said("summary", str(telemetry.path))
    assert "the last batch of an epoch is smaller than the others" in out and "in predict()" in out
    fix = out.split("fix: ", 1)[1]
    assert "dynamic" in fix and "pad the last batch" in fix and "drop_last=True would leave samples unevaluated" in fix
    fixed = run_after_the_fix(tmp_path)
    predictions = hooked(fixed, dynamic=True)(**TRAINER_DEFAULTS).predict(Regressor(), data(200, 32))
    fixed.end()
    assert sum(len(p) for p in predictions) == 200  # every sample predicted
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles: last_batch in eval" in out


class HeadCompiled(Regressor):
    """Only its last layer compiled; ``mark`` says where the step puts ``mark_dynamic``: on the batch, or on
    the tensor the compiled layer receives."""

    def __init__(self, mark: str) -> None:
        super().__init__(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()))
        self.head = torch.nn.Sequential(torch.nn.Linear(16, 1), torch.nn.ReLU())
        self.compiled_head = torch.compile(self.head, backend="eager")
        self.mark = mark

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        if self.mark == "batch":
            torch._dynamo.mark_dynamic(x, 0)
        h = self.model(x)
        if self.mark == "at the call":
            torch._dynamo.mark_dynamic(h, 0)
        return self.compiled_head(h)


@pytest.mark.parametrize("mark", ["batch", "at the call"])
def test_mark_dynamic_works_where_the_fix_puts_it_on_the_compiled_calls_argument(
    telemetry: Telemetry, mark: str
) -> None:
    fix = CAUSES["last_batch"].fix_for("predict")
    assert "on the tensor the compiled call receives" in fix and "right before that call" in fix
    before = frames_compiled()
    telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0](**TRAINER_DEFAULTS).predict(
        HeadCompiled(mark),
        DataLoader(TensorDataset(torch.randn(40, 8)), batch_size=16),  # 16, 16, then 8
    )
    recompiles = summarize(telemetry.end()).digest.recompiles
    assert frames_compiled() - before > 0
    # a mark on the batch does not pass to the tensor computed from it: the last batch still recompiles
    assert recompiles == (1 if mark == "batch" else 0)


def test_drop_last_on_the_training_loader_leaves_validations_last_batch_named_with_its_fix(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """Training 100 = 12 x 8 + 4, validation 30 = 3 x 8 + 6: the training remainder recompiles (torch then
    makes the batch dimension dynamic, and validation's remainder fits). The user applies drop_last to the
    training loader as told; now validation's last batch recompiles, and is said with the evaluation fix."""
    hooked(telemetry)(max_epochs=2, **TRAINER_DEFAULTS).fit(Regressor(), data(100, 8), data(30, 8, seed=1))
    telemetry.end()
    status, out = said("summary", str(telemetry.path))
    item = out.split("what to fix first", 1)[1].split(" 2. ", 1)[0]
    assert "the last batch of an epoch is smaller" in item and "in training" in item and "drop_last=True" in item
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed)(max_epochs=2, **TRAINER_DEFAULTS).fit(Regressor(), data(100, 8, drop_last=True), data(30, 8, seed=1))
    fixed.end()
    status, out = said("summary", str(fixed.path))
    item = out.split("what to fix first", 1)[1].split(" 2. ", 1)[0]
    assert "the last batch of an epoch is smaller" in item and "in validation" in item
    assert "drop_last=True would leave samples unevaluated" in item  # the evaluation fix, not drop_last again
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    # what the fix did, and what it left: training's remainder fixed, validation's now met
    assert (
        "new recompiles, by cause: last_batch in eval: 1" in out and "fixed recompiles: last_batch in train: 1" in out
    )
    assert "gone recompile reason: tensor 'args[0]' size mismatch at index 0. expected 8, actual 4" in out
    assert "new recompile reason: tensor 'args[0]' size mismatch at index 0. expected 8, actual 6" in out
    assert "GLOBAL_STATE" not in out.split("per frame")[1]  # a reason both runs have is neither new nor gone
    status, out = said("check", str(fixed.path), "--baseline", str(telemetry.path), "--no-new-graph-breaks")
    assert status == 0, out


def test_validations_last_batch_met_first_leaves_trainings_its_own_last_batch_and_drop_last_removes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """Validation twice an epoch: its remainder (30 = 3 x 8 + 6) recompiles at step 6, before training's (100 =
    12 x 8 + 4) at step 12. Each is its loop's last batch, with its loop's fix; a dimension that changed in the
    other loop is no dimension that keeps changing."""
    hooked(telemetry)(max_epochs=1, val_check_interval=0.5, **TRAINER_DEFAULTS).fit(
        Regressor(), data(100, 8), data(30, 8, seed=1)
    )
    rows = {(row.cause, row.kind): row for row in summarize(telemetry.end()).causes}
    assert (rows[("last_batch", "eval")].count, rows[("last_batch", "train")].count) == (1, 1), rows
    assert rows[("last_batch", "eval")].steps[0] < rows[("last_batch", "train")].steps[0] == 12
    status, out = said("summary", str(telemetry.path))
    training = next(item for item in out.split("what to fix first", 1)[1].split("\n   ") if "in training" in item)
    assert "the last batch of an epoch is smaller" in training and "drop_last=True" in training, training
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed)(max_epochs=1, val_check_interval=0.5, **TRAINER_DEFAULTS).fit(
        Regressor(), data(100, 8, drop_last=True), data(30, 8, seed=1)
    )
    fixed.end()
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles: last_batch in train: 1" in out and "new recompiles" not in out, out
    status, out = said("check", str(fixed.path), "--baseline", str(telemetry.path), "--max-unexpected-recompiles", "1")
    assert status == 0, out


class Stream(torch.utils.data.IterableDataset):
    """A loader of no length (a stream), as ``data`` makes them."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        self.x = torch.randn(samples, 8, generator=torch.Generator().manual_seed(seed))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x in self.x:
            yield x, x.sum(dim=0, keepdim=True)


def test_a_stream_of_no_length_ends_its_epoch_in_its_last_batch_and_drop_last_removes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """Training 100 = 12 x 8 + 4 and validation 30 = 3 x 8 + 6 from IterableDatasets: nothing knows their length,
    yet Lightning, fetching a batch ahead, knows each epoch's last batch; each loop's is its last_batch with its
    fix, never a dimension that keeps changing."""
    fit = {"max_epochs": 1, "val_check_interval": 6, **TRAINER_DEFAULTS}
    hooked(telemetry)(**fit).fit(Regressor(), DataLoader(Stream(100), 8), DataLoader(Stream(30, seed=1), 8))
    rows = {(row.cause, row.kind): row for row in summarize(telemetry.end()).causes}
    assert {cause for cause, _ in rows} <= {"last_batch", "stage_switch"}, rows
    assert (rows[("last_batch", "eval")].count, rows[("last_batch", "train")].count) == (1, 1), rows
    status, out = said("summary", str(telemetry.path))
    training = next(item for item in out.split("what to fix first", 1)[1].split("\n   ") if "in training" in item)
    assert "the last batch of an epoch is smaller" in training and "drop_last=True" in training, training
    fixed = run_after_the_fix(tmp_path)
    loaders = DataLoader(Stream(100), 8, drop_last=True), DataLoader(Stream(30, seed=1), 8)
    hooked(fixed)(**fit).fit(Regressor(), *loaders)
    fixed.end()
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles: last_batch in train: 1" in out and "new recompiles" not in out, out


def test_fit_again_after_the_fix_in_one_application_says_the_last_loop_no_longer_has_it(telemetry: Telemetry) -> None:
    """A notebook: fit, read the advice, apply drop_last and remove the graph break, fit again in the same
    process and file. The recompile the first fit left says which loop it was in and that the last one had
    none, or the user reads the fix as failed; the break says which loop's compiles found it; each first step
    says its loop."""

    def model(graph_break: str | None) -> Regressor:
        return Regressor(torch.nn.Sequential(Block(8, graph_break), torch.nn.Linear(8, 1)))

    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(model("print"), data(100, 8))
    dynamo_facts.reset_compile_state()  # a new model in the notebook compiles afresh
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(model(None), data(100, 8, drop_last=True))
    telemetry.end()
    status, out = said("summary", str(telemetry.path))
    recompiles, breaks = out.split("what to fix first", 1)[1].split(" 2. ", 1)
    assert "the last batch of an epoch is smaller" in recompiles, out
    assert "at step 12 in training (training loop 1 of 2, none in the last): " in recompiles, out
    assert "graph break" in breaks and "found compiling training loop 1 of 2 fix: " in breaks, out
    assert "first train step (step 0, training loop 1 of 2)" in out and "(step 0, training loop 2 of 2)" in out, out
    (run,) = json.loads(said("summary", "--json", str(telemetry.path))[1])["runs"]
    assert run["loop_count"] == 2 and [row["loops"] for row in run["recompile_causes"]] == [[1]], run
    assert [group["loops"] for group in run["graph_breaks"]] == [[1]], run
    assert [step["loops"] for step in run["first_steps"]] == [[1], [2]], run


# -- the Tuner, a sanity check, shares --------------------------------------------------------------
def test_the_tuners_trials_are_a_stage_of_their_own_and_an_expected_price(telemetry: Telemetry) -> None:
    from lightning.pytorch.tuner import Tuner

    class Tunable(Regressor):
        def train_dataloader(self) -> DataLoader:
            return data(64, self.batch_size)

        def val_dataloader(self) -> DataLoader:
            return data(16, 8)

    model = Tunable()
    model.model = torch.compile(model.model, backend="eager")  # the user compiles it: the trials compile too
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0]
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Tuner(trainer).scale_batch_size(model, mode="power", max_trials=3, steps_per_trial=2)
        trainer.fit(model)
    run = telemetry.end()
    s = summarize(run)
    stages = {stage for row in s.causes for stage in row.stages}
    assert "tuner" in stages and all(row.cause == "tuner" for row in s.causes if "tuner" in row.stages)
    assert not any(row.unexpected for row in s.causes if row.cause == "tuner")
    assert s.share is not None and s.share <= 1
    assert "the Tuner's trials" in flat(telemetry_jit.format_summary(run))


def test_compiling_before_the_loop_is_shown_apart_and_every_share_is_under_a_hundred_percent(
    telemetry: Telemetry,
) -> None:
    """A model the user compiled, a sanity check: what compiles before the training loop counts against the
    application, not the loop."""
    model = Regressor()
    model.model = torch.compile(model.model, backend="eager")
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0]
    HookedTrainer(max_epochs=1, num_sanity_val_steps=2, **TRAINER_DEFAULTS).fit(model, data(16, 8), data(16, 8))
    run = telemetry.end()
    s = summarize(run)
    assert s.outside_ms.get("sanity_check", 0) > 0 and s.share is not None and s.share <= 1
    text = flat(telemetry_jit.format_summary(run))
    assert "compiling outside the training loop:" in text and "sanity check" in text
    assert "first sanity check step" in text  # labelled as the stage it was, like its spans
    assert {step.stage for step in s.first_steps} >= {"sanity_check", "train"}


def test_a_share_budget_names_its_unit_or_is_refused(telemetry: Telemetry) -> None:
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(16, 8))
    telemetry.end()
    status, out = said("check", str(telemetry.path), "--max-compile-share", "0.5")
    assert status == 2 and "is ambiguous: 0.5% or 50% of the loop? Write the unit" in out
    status, out = said("check", str(telemetry.path), "--max-compile-share", "100%")
    assert status == 0, out
    status, out = said("check", str(telemetry.path), "--max-compile-share", "0.001%")
    assert status == 1 and "of the training loop's wall time" in out


# -- runs that did not finish ------------------------------------------------------------------------
def test_a_run_that_raised_at_step_5_says_so_first_on_every_surface(telemetry: Telemetry, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a bug in training_step"):
        hooked(telemetry)(max_epochs=3, **TRAINER_DEFAULTS).fit(Regressor(fail_at=5), data(64, 8))
    run = telemetry.end()
    text = telemetry_jit.format_summary(run).splitlines()
    assert flat(text[1]).startswith("this run FAILED: ValueError: a bug in training_step (at train step 5)")
    status, out = said("summary", str(telemetry.path), "--json")
    (mine,) = json.loads(out)["runs"]
    assert mine["status"]["state"] == "failed" and "at train step 5" in mine["status"]["detail"]
    assert said("report", str(telemetry.path), "-o", str(tmp_path / "r.html"))[0] == 0
    assert 'id="status" class="unfinished">this run FAILED' in (tmp_path / "r.html").read_text()
    assert said("trace", str(telemetry.path), "-o", str(tmp_path / "t.json"))[0] == 0
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = [event["args"].get("name", "") for event in trace if event["ph"] == "M"]
    assert any(name.endswith("(failed)") for name in names)
    status, out = said("diff", str(telemetry.path), str(telemetry.path))
    assert "base: this run FAILED" in out and "new: this run FAILED" in out
    status, out = said("check", str(telemetry.path), "--max-recompiles", "100")
    assert status == 3 and "the run (rank 0) failed: ValueError" in out and "--allow-incomplete" in out
    assert said("check", str(telemetry.path), "--max-recompiles", "100", "--allow-incomplete")[0] == 0


KILLED = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.e2e.test_truth import Regressor, data
    from tests.models import TRAINER_DEFAULTS

    class Slow(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:
                print("step 3", flush=True)
            time.sleep(0.2)

    session = telemetry_jit.configure("killed", file={path!r})
    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}})
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=config, live=False)
    HookedTrainer(max_epochs=50, callbacks=[Slow()], **TRAINER_DEFAULTS).fit(Regressor(), data(64, 8))
    """
)


def test_a_killed_run_is_said_killed_and_the_gate_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED.format(root=str(ROOT), path=str(path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None and "step 3" in process.stdout.readline()
    time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    status, out = said("summary", str(path))
    assert "this run KILLED: its application, training_loop never ended" in out
    status, out = said("check", str(path), "--max-recompiles", "100")
    assert status == 3 and "killed" in out


# -- the recompile limit, through a Python value ----------------------------------------------------
class Tagged(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.tag = "a"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tag == "a":  # a string attribute the compiled code compares
            x = x * 2
        return self.linear(x)


class Retagging(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.model.tag = f"step {batch_idx}"
        return super().training_step(batch, batch_idx)


@torch._dynamo.config.patch(recompile_limit=3)
def test_the_recompile_limit_names_what_led_there_and_never_advises_raising_it(telemetry: Telemetry) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Retagging(Tagged()), data(48, 8))
    (warning,) = [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    assert "mostly: a Python number or attribute is burned into the graph" in warning
    assert "Raising the limit only postpones it" in warning and "or raise the limit" not in warning
    run = telemetry.end()
    rows = {row.cause: row for row in summarize(run).causes}
    assert rows["python_value"].count == 2 and "self.tag == 'step 0'" in rows["python_value"].reasons[0]
    assert "a Python number or attribute" in rows["recompile_limit"].fix  # the cause behind it, and its fix
    assert "burned into the graph. Fix that: keep what the compiled code reads" in rows["recompile_limit"].fix
    status, out = said("summary", str(telemetry.path))
    assert "fell back to eager: 1 (recompile limit hit: 1)" in out
    # torch's record counts the refused attempt among the frame compiles (--json too); the line says it apart
    digest = summarize(run).digest
    assert (digest.frame_compiles, digest.recompiles) == (4, 3)  # 0/0, 0/1, 0/2 and the refused 0/3
    # (torch 2.8 records no input shapes: the line says of which compiles the backward graphs went uncounted)
    assert re.search(
        r"compiled: 3 frame compiles \(2 of them recompiles\)( \(not counted: [^;]* any of 3 frame compiles [^;]*;"
        r"[^)]*\))?; 1 more attempt refused at the recompile limit, which compiled nothing",
        flat(out),
    ), out
    # the gate that refuses a silent slowdown names the frame and the step it went eager from
    (fallback,) = summarize(run).digest.fallbacks
    since = 6 - fallback.step  # 48 samples in batches of 8: the loop ends at step 6
    line = f"{fallback.frame} runs eagerly from step {fallback.step} on ({since} steps since; it hit the recompile"
    assert line in short_paths(flat(out))
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and line in short_paths(flat(out)), out
    assert summary_json(run)["fell_back_to_eager"][0]["steps_since"] == since


@torch._dynamo.config.patch(recompile_limit=3)
def test_a_fallback_fixed_as_told_is_gone_in_diff_and_the_gate_passes(telemetry: Telemetry, tmp_path: Path) -> None:
    """The user's loop: the run says the frame runs eagerly and why; they give the attribute its value once (the
    fix it names), rerun, and diff and check say what changed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Retagging(Tagged()), data(48, 8))
    telemetry.end()
    assert said("check", str(telemetry.path), "--no-eager-fallback")[0] == 1
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(Tagged()), data(48, 8))  # the tag set once
    fixed.end()
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    fixed_title = "fixed: frames that ran eagerly in the base run and no longer do:"
    assert fixed_title in out and "new: frames that run eagerly" not in out
    # the frame that fell back, by the key diff compares frames by (its name, file and first line)
    line = inspect.getsourcelines(Tagged.forward)[1]
    assert f"forward (e2e/test_truth.py:{line})" in short_paths(flat(out.split(fixed_title)[1]))
    status, out = said("diff", str(telemetry.path), str(fixed.path), "--json")
    facts = json.loads(out)
    assert (len(facts["fixed_eager_fallbacks"]), facts["new_eager_fallbacks"]) == (1, [])
    assert said("check", str(fixed.path), "--no-eager-fallback")[0] == 0


@torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=3)
def test_the_accumulated_recompile_limit_is_named_as_the_limit_that_was_hit(telemetry: Telemetry) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Retagging(Tagged()), data(48, 8))
    (warning,) = [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    assert "hit torch._dynamo.config.accumulated_recompile_limit (3) at step 3" in warning, warning
    run = telemetry.end()
    (fallback,) = summarize(run).fallbacks
    assert (fallback.step, fallback.limit_hit) == (3, True)
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and "runs eagerly from step 3 on" in flat(out)


class TaggedChain(torch.nn.Module):
    """Elementwise work inductor fuses into one kernel (eager runs each op on its own), behind a string guard."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(width))
        self.tag = "a"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        if self.tag == "a":
            h = h * 1.5
        for _ in range(4):
            h = torch.sin(h) * 1.01 + torch.cos(h) * 0.5
        return h


class RetaggingLater(pl.LightningModule):
    """Ten steps with one tag (compiled, quiet), then a new tag every step: the recompile limit, then eager."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.model = TaggedChain(width)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.model.tag = "a" if batch_idx < 10 else f"step {batch_idx}"
        return self.model(batch[0]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@torch._dynamo.config.patch(recompile_limit=2)
@torch._inductor.config.patch(compile_threads=1)
def test_a_fallback_says_what_running_eagerly_costs_against_the_same_frame_compiled(telemetry: Telemetry) -> None:
    width = 2**16
    loader = DataLoader(TensorDataset(torch.randn(8 * 30, width, generator=torch.Generator().manual_seed(0))), 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked(telemetry, backend="inductor")(max_epochs=1, **TRAINER_DEFAULTS).fit(RetaggingLater(width), loader)
    run = telemetry.end()
    (fallback,) = summarize(run).fallbacks
    cost = fallback.cost
    assert cost is not None and not cost.not_measured, cost
    # step 10 recompiles, step 11 hits the limit: nine quiet compiled batches before (1 - 9); after, 12 - 28 (the
    # last batch has no next one to end it), of the 19 batches (11 - 29) it ran eagerly in
    assert fallback.step == 11 and (cost.compiled_batches, cost.eager_batches, cost.batches_since) == (9, 17, 19)
    # inductor fused the chain: the same steps run eagerly are slower, and the run says by how much (by 1.5x and
    # more on most machines; a whole suite on Python 3.13 + torch 2.15 here once measured less)
    assert cost.eager_batch_ms > 1.2 * cost.compiled_batch_ms, cost
    assert cost.cost_s == pytest.approx((cost.eager_batch_ms - cost.compiled_batch_ms) * 19 / 1000)
    words = cost.words()
    status, out = said("summary", str(telemetry.path))
    assert words in flat(out)
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and words in flat(out)
    (costed,) = summary_json(run)["fell_back_to_eager"]
    assert costed["cost"]["batches_since"] == 19 and costed["cost"]["cost_s"] == pytest.approx(cost.cost_s, abs=1e-3)


@pytest.mark.parametrize("eager_ms", [(9.0, 12.0, 10.0, 8.5), (20.0, 21.0, 19.5, 20.5)], ids=["noise", "slower"])
@torch._dynamo.config.patch(recompile_limit=2)
def test_a_fallbacks_cost_is_said_only_where_its_batches_tell_it_from_noise(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch, eager_ms: tuple[float, ...]
) -> None:
    """Issue 63: a fallback's cost from medians of noisy batches was printed as fact, by check too. The batches'
    times are the test's (a clock it drives: each training step's length, by step), the run real."""
    lengths = [10.0 + (step % 4 - 1.5) for step in range(11)] + [eager_ms[step % 4] for step in range(19)]
    starts = [int(sum(lengths[:step]) * 1e6) for step in range(len(lengths) + 1)]
    timed = FallbackCostMeter.batch_started
    monkeypatch.setattr(
        FallbackCostMeter, "batch_started", lambda meter, stage, step, now_ns: timed(meter, stage, step, starts[step])
    )
    loader = DataLoader(TensorDataset(torch.randn(8 * 30, 8, generator=torch.Generator().manual_seed(0))), 8)
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(RetaggingLater(8), loader)
    run = telemetry.end()
    (fallback,) = summarize(run).fallbacks
    cost = fallback.cost
    assert cost is not None and fallback.step == 11 and (cost.compiled_batches, cost.eager_batches) == (9, 17)
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    line = next(line for line in out.splitlines() if "runs eagerly from step 11" in line)
    if eager_ms[0] < 15:  # the eager batches as long as the compiled ones, give or take
        assert cost.extra_low_ms is not None and cost.extra_low_ms < 0 < cost.extra_high_ms
        assert "not enough batches to tell what it costs" in line and "holds zero" in line
        assert "costs " not in line and "saves " not in line
    else:
        assert cost.told and f"costs {cost.extra_ms:.1f} ms a training batch (95% interval " in line
    assert status == 1 and cost.words() in line


def exploding(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
    raise RuntimeError("backend exploded\nat the second op\n\nsome hints")  # torch puts its words on a line above


@torch._dynamo.config.patch(suppress_errors=True)
def test_a_compile_that_fails_under_suppress_errors_is_said_at_once_and_fails_the_no_fallback_gate(
    telemetry: Telemetry,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked(telemetry, backend=exploding)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(32, 8))
    (warning,) = [str(w.message) for w in caught if "runs eagerly from now on" in str(w.message)]
    assert "failed at step 0" in warning and "backend exploded" in warning and "--no-eager-fallback" in warning
    # JitTransform's check that the compiled code ran knows why it did not
    (never,) = [str(w.message) for w in caught if "never ran" in str(w.message)]
    assert "compiling it failed and dynamo runs it eagerly" in never and "does not trace" not in never, never
    run = telemetry.end()
    assert run_status(run).finished  # training went on, eagerly
    (span,) = [span for span in run.find("compilation") if span.attributes["compile.fell_back_to_eager"]]
    assert any(event.is_error and "runs eagerly" in str(event.attributes) for event in span.events)
    (fallback,) = summarize(run).digest.fallbacks
    assert (fallback.step, fallback.limit_hit) == (0, False)
    expected = f"{fallback.frame} runs eagerly from step 0 on (4 steps since; compiling it failed, in training)"
    status, out = said("summary", str(telemetry.path))
    assert expected in short_paths(flat(out))
    raised = f"{expected}: backend='exploding' raised: RuntimeError: backend exploded at the second op;"
    assert raised in short_paths(flat(out))
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and expected in short_paths(flat(out))


def _backward_compiler_raises(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
    raise RuntimeError("backward compiler exploded")


@pytest.mark.parametrize("suppress_errors", [False, True])
def test_a_backward_compile_that_raised_is_not_said_compiled_nor_counted_and_its_graph_is_named(
    telemetry: Telemetry, suppress_errors: bool
) -> None:
    """Issue 63: a backward compile that raised (InductorError there) was said live as "compiled the backward graph
    of forward ... in 8.1 s" and counted among backward graphs; "failed compilations: 1" named no graph. A backward
    compile raises into training whatever suppress_errors says: it runs at the first backward, not in dynamo."""
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=lambda gm, inputs: gm.forward, bw_compiler=_backward_compiler_raises)
    lines: list[str] = []
    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": backend})
    console = telemetry_jit.CompileConsole(threshold_s=0.0, print_fn=lines.append)  # every compile said
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=console)[0]
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    with torch._dynamo.config.patch(suppress_errors=suppress_errors), pytest.raises(RuntimeError, match="exploded"):
        trainer.fit(Regressor(), data(16, 8))
    backward = [line for line in lines if "backward graph of" in line]
    assert len(backward) == 2 and backward[0].endswith(" ...") and " failed after " in backward[1], lines
    assert backward[1].endswith("RuntimeError: backward compiler exploded")
    assert "compiled the backward" not in "".join(lines)
    assert any(line.startswith("telemetry-jit: compiled ") for line in lines)  # the forward, which did compile
    stats = trainer.compile_telemetry.last_stats  # what compile/backward_graphs is logged from
    assert stats is not None and (stats.frame_compiles, stats.backward_graphs) == (1, 0)
    run = telemetry.end()
    digest = summarize(run).digest
    assert (digest.frame_compiles, digest.backward_graphs, digest.failed) == (1, 0, 1)
    (frame,) = summarize(run).digest.frame_rows()
    out = short_paths(said("summary", str(telemetry.path))[1])
    assert "1 frame compile (0 of them recompiles), " in out and "backward graph" not in out.split("failed")[0]
    failed = f"failed compilations: 1, first: the backward graph of {frame_shown(frame.frame, frame.location)} [0/0]"
    assert short_paths(failed) + ": RuntimeError: backward compiler exploded" in out, out
    first = summary_json(run)["first_failed_compilation"]
    assert first["graph"].startswith("the backward graph of ") and first["error"].endswith("compiler exploded")


class SlowAfterItsFirstBatch(Regressor):
    """Spends 1.5 s after its first training batch has ended (in its batch-end hook, which Lightning calls after the
    callbacks'), before the next batch starts."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            time.sleep(1.5)


def test_a_first_step_ends_at_its_batchs_end_not_at_the_next_batchs_start(telemetry: Telemetry) -> None:
    """Issue 63: a first step's "running" time ran to the next batch's start (0.62 s more than the batch)."""
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(SlowAfterItsFirstBatch(), data(32, 8))
    (first,) = [step for step in summary_json(telemetry.end())["first_steps"] if step["stage"] == "train"]
    assert first["compile_s"] > 0 and first["other_s"] < 1.0, first  # a tiny model's batch, not the 1.5 s after it


# -- one root cause, one item ------------------------------------------------------------------------
class Encoded(pl.LightningModule):
    """nn.TransformerEncoder breaks inside torch (``_detect_is_causal_mask`` calls ``.item()``); training and
    validation each reach it from a line of their own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1)
        self.mask = torch.nn.Transformer.generate_square_subsequent_mask(5)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.model(x, mask=self.mask, is_causal=None).pow(2).mean()  # TRAINING LINE

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("v", self.model(x, mask=self.mask, is_causal=None).pow(2).mean())  # VALIDATION LINE

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_break_reached_from_two_of_your_lines_is_one_item_naming_both(telemetry: Telemetry) -> None:
    loader = DataLoader(TensorDataset(torch.randn(16, 5, 8)), batch_size=4)
    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs=EAGER)  # the root: self.model
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)[0]
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Encoded(), loader, loader)
    run = telemetry.end()
    source, first = inspect.getsourcelines(Encoded)
    lines = [f"e2e/test_truth.py:{first + n}" for n, text in enumerate(source) if "self.model(x" in text]
    inside = [group for group in summarize(run).breaks if group.owner == "torch"]
    assert len(inside) == 1, inside  # one place in torch: one item
    status, out = said("summary", str(telemetry.path))
    item = out.split("fix first")[1].split("\n   2.")[0].split("\n  expected")[0]
    assert all(line in item for line in lines), (lines, item)
    assert "change how your lines" in flat(item)  # the fix names both as well
    hint = inside[0].hints[0] if inside[0].hints else ""
    assert flat(hint) in out  # torch's hint whole, however long: wrapped, never cut mid-word


def test_a_run_without_a_fallback_keeps_the_no_eager_fallback_gate(telemetry: Telemetry) -> None:
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(16, 8))
    telemetry.end()
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 0 and "within budget" in out


def test_every_fit_ends_naming_its_file_and_the_command_that_reads_it(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(16, 8))
    lines = [record.getMessage() for record in caplog.records if "read it with" in record.getMessage()]
    assert lines == [
        f"telemetry-jit: compile telemetry is in {telemetry.path}; read it with: telemetry-jit summary {telemetry.path}"
    ]


def test_a_second_fit_in_one_process_runs_the_compiled_code_without_a_never_ran_warning(telemetry: Telemetry) -> None:
    """A notebook fits twice: the second runs dynamo's code from the first (the graph broke inside a child, so
    dynamo's code is the child's frame, not the root's) and compiles nothing; that is no reason to warn."""
    from tests.models import Net, loader

    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs=EAGER)
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(16, 4))
    assert not [w for w in caught if "never ran" in str(w.message)]


class LoggedWhole(pl.LightningModule):
    """Lightning's guide: the LightningModule compiled whole, ``self.log`` in its validation step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_recompile_in_lightnings_own_code_names_the_fix_the_user_can_make(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """``trainer.fit(torch.compile(model))`` compiles Lightning's ``self.log`` with the step, and it recompiles on
    Lightning's attributes: the fix is not "hold numbers in tensors" in code the user cannot edit, but to compile
    the network instead. Applied as named, the recompiles and breaks in Lightning's code are gone."""
    storms = telemetry_jit.CompileConsole(storm_recompiles=2)  # said live, too, by the same rule
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=storms)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(
            torch.compile(LoggedWhole(), backend="eager"), data(32, 8), data(16, 8)
        )
    run = telemetry.end()
    (row,) = [row for row in summarize(run).digest.causes.values() if row.cause == "python_value"]
    assert row.owner == "lightning" and all("core/module.py" in frame for frame in row.frames), row
    assert (
        "lightning's code cannot be edited" in row.fix and "JitConfig(module_selector='net', use_torch=True)" in row.fix
    )
    assert "lightning's code cannot be edited" in said("summary", str(telemetry.path))[1]
    (storm,) = [str(w.message) for w in caught if "recompile storm: log (" in str(w.message)]
    assert "Fix: lightning's code cannot be edited" in storm

    fixed = run_after_the_fix(tmp_path)
    hooked(fixed, "net")(max_epochs=2, **TRAINER_DEFAULTS).fit(LoggedWhole(), data(32, 8), data(16, 8))
    fixed.end()
    facts = json.loads(said("diff", str(telemetry.path), str(fixed.path), "--json")[1])
    assert facts["fixed_recompile_causes"].get("python_value in eval") == row.count, facts
    assert facts["new"]["graph_breaks"] == 0 < facts["base"]["graph_breaks"]
    assert said("check", str(fixed.path), "--max-unexpected-recompiles", "0", "--max-graph-breaks", "0")[0] == 0


class WithTargetPass(Regressor):
    """A training_step that also runs the compiled model without gradients (a target or teacher pass)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.no_grad():
            target = self.model(x).detach()
        return torch.nn.functional.mse_loss(self.model(x), (y + target) / 2)


def test_a_frames_first_call_without_gradients_is_the_expected_price_in_a_plain_loop_and_in_training_step(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    # a plain loop's evaluation under no_grad (its stage stays "train": nobody says otherwise)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)), **EAGER)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        for step in range(6):
            recorder.step(step)
            model(torch.randn(8, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 3 == 2:
                with torch.no_grad():
                    model(torch.randn(8, 8))
    loop = telemetry.end()
    # in a Lightning training_step, beside the step with gradients
    fresh_provider_state()
    dynamo_facts.reset_compile_state()
    path = tmp_path / "target.jsonl"
    target = Telemetry(telemetry_jit.configure("target", file=path), path)
    hooked(target)(max_epochs=2, **TRAINER_DEFAULTS).fit(WithTargetPass(), data(32, 8))
    fit = target.end()
    for run, file in ((loop, telemetry.path), (fit, path)):
        rows = [row for row in summarize(run).causes if row.cause == "stage_switch"]
        assert [(row.count, row.unexpected) for row in rows] == [(1, 0)]  # once, for the first call without
        assert "what to fix first" not in telemetry_jit.format_summary(run)
        assert said("check", str(file), "--max-unexpected-recompiles", "0")[0] == 0


class ItemGate(torch.nn.Module):
    """Reads a number with ``.item()`` and branches on it: a graph break with the number on dynamo's stack."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.mean().item() > 10:
            h = h * 0.5
        return self.b(h)


def item_gate_loop(telemetry: Telemetry) -> telemetry_jit.analysis.reader.TelemetryRun:
    model = torch.compile(ItemGate(), **EAGER)
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        for step in range(4):
            recorder.step(step)
            model(torch.randn(8, 8)).pow(2).mean().backward()
    return telemetry.end()


def test_a_compile_that_fails_under_fullgraph_is_said_in_a_line_that_names_the_users_line(telemetry: Telemetry) -> None:
    """torch's error for a graph break under ``fullgraph=True`` runs to thirty lines of hints; every surface says its
    first paragraph and the user's line it was raised at, and the file keeps it whole, once."""
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        hooked(telemetry, fullgraph=True)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(ItemGate()), data(16, 8))
    run = telemetry.end()
    lines, first = inspect.getsourcelines(ItemGate.forward)
    branch = first + next(i for i, line in enumerate(lines) if ".item()" in line)
    where = f"(at {__file__}:{branch} in forward: `if h.mean().item() > 10:`; at train step 0)"
    headline = run_status(run).headline()
    assert where in headline and len(headline) < 800 and "TORCHDYNAMO_VERBOSE" not in headline, headline
    text = flat(telemetry_jit.format_summary(run))
    assert text.count(where) == 1 and "failed compilations: 1, first: " in text
    (failure,) = [span.attributes["compile.failure"] for span in run.find("compilation")]
    assert "from user code:" in failure and "(torch: " not in failure  # whole, and said once


def test_a_number_left_by_a_graph_break_is_named_with_the_break_and_the_breaks_fix_removes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    run = item_gate_loop(telemetry)
    (row,) = [row for row in summarize(run).causes if row.cause != "stage_switch"]
    assert (row.cause, row.count, row.unexpected) == ("break_value", 1, 1)
    assert row.reasons[0].startswith("an intermediate value == ")
    text = flat(telemetry_jit.format_summary(run))
    assert "a number a graph break left behind" in text and "capture_scalar_outputs = True" in text
    # the fix it names, on the same loop
    fixed = run_after_the_fix(tmp_path)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        fixed_run = item_gate_loop(fixed)
    assert not [row for row in summarize(fixed_run).causes if row.cause == "break_value"]
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles: break_value in train: 1" in out
    assert said("check", str(fixed.path), "--max-unexpected-recompiles", "0")[0] == 0
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "0")[0] == 1


def test_a_run_after_another_in_one_process_says_what_was_compiled_before_and_reset_measures_it_afresh(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    # a notebook: fit, read the summary, fit again in the same process (here without any fix)
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(20, 8))
    first = telemetry.end()
    assert summarize(first).compiled_before is None
    assert [row.cause for row in summarize(first).causes] == ["last_batch"]

    def again(name: str) -> tuple[Path, Any]:
        fresh_provider_state()
        path = tmp_path / f"{name}.jsonl"
        run = Telemetry(telemetry_jit.configure(name, file=path), path)
        hooked(run)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(20, 8))
        return path, run.end()

    path, reused = again("reused")
    s = summarize(reused)
    assert s.digest.recompiles == 0  # the smaller batch's code was compiled by the first run
    assert s.compiled_before is not None and s.compiled_before.frames >= 1
    assert "Sequential.forward" in s.compiled_before.names
    text = flat(telemetry_jit.format_summary(reused))
    assert "this run began in a process that had already compiled" in text and "torch._dynamo.reset()" in text
    status, out = said("diff", str(telemetry.path), str(path))
    assert "new: this run began in a process that had already compiled" in out
    assert "no evidence of a change" in out
    status, out = said("check", str(path), "--max-unexpected-recompiles", "0")
    assert status == 0 and "judged on what it compiled itself" in out
    (event,) = [e for e in reused.find("application")[0].events if e.name == "compiled_before_run"]
    (summarized,) = json.loads(said("summary", "--json", str(path))[1])["runs"]
    assert summarized["compiled_before_run"]["names"] == list(s.compiled_before.names)
    diffed = json.loads(said("diff", "--json", str(telemetry.path), str(path))[1])
    assert diffed["base"]["compiled_before_run"] is None
    assert diffed["new"]["compiled_before_run"]["frames"] == event.attributes["compiled_before.frames"] >= 1
    report = tmp_path / "reused.html"
    assert said("report", str(path), "-o", str(report))[0] == 0
    assert "had already compiled" in report.read_text()
    # the fix it names: torch._dynamo.reset() before the attempt, which then meets the recompile again
    torch._dynamo.reset()
    path, afresh = again("afresh")
    assert summarize(afresh).compiled_before is None
    assert [row.cause for row in summarize(afresh).causes] == ["last_batch"]
    assert "already compiled" not in said("diff", str(telemetry.path), str(path))[1]


class Tempered(torch.nn.Module):
    """Divides by a temperature the training sets each epoch: a Python float, or (the fix) a buffer."""

    def __init__(self, in_a_tensor: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        if in_a_tensor:
            self.register_buffer("temperature", torch.tensor(1.0))
        else:
            self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) / self.temperature


class Annealed(Regressor):
    def on_train_epoch_start(self) -> None:
        value = 1.0 / (self.current_epoch + 1)
        if isinstance(self.model.temperature, torch.Tensor):
            self.model.temperature.fill_(value)
        else:
            self.model.temperature = value


def test_what_changed_is_named_where_torch_names_the_grad_mode_of_validations_compile(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    # torch's recompile reason at the second epoch is validation's cache entry's (grad mode); the
    # training entry's says the temperature changed
    hooked(telemetry)(max_epochs=3, **TRAINER_DEFAULTS).fit(Annealed(Tempered(False)), data(32, 8), data(16, 8))
    run = telemetry.end()
    rows = {(row.cause, row.kind): row for row in summarize(run).causes}
    assert rows[("stage_switch", "eval")].count == 1 and not rows[("stage_switch", "eval")].unexpected
    python = [row for (cause, _), row in rows.items() if cause == "python_value"]
    assert python and all(row.unexpected == row.count for row in python)
    assert all(row.reasons[0].startswith("self.temperature == 1.0") for row in python)
    text = flat(telemetry_jit.format_summary(run))
    assert "a Python number or attribute is burned into the graph" in text and "grad mode came back" not in text
    assert "buffer registered in __init__" in text
    (span,) = [
        s
        for s in run.find("compilation")
        if s.attributes.get("train.stage") == "train" and s.attributes.get("compile.recompile_cause") == "python_value"
    ]
    reasons = span.attributes["compile.recompile_reasons"]
    assert "grad_mode" in reasons[0] and "temperature" in reasons[1]  # torch's order: validation's entry first
    # the fix it names, on the same fit: the temperature in a buffer, updated in place
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed)(max_epochs=3, **TRAINER_DEFAULTS).fit(Annealed(Tempered(True)), data(32, 8), data(16, 8))
    fixed_run = fixed.end()
    assert [(row.cause, row.count) for row in summarize(fixed_run).causes] == [("stage_switch", 1)]
    assert "fixed recompiles: python_value" in said("diff", str(telemetry.path), str(fixed.path))[1]
    assert said("check", str(fixed.path), "--max-unexpected-recompiles", "0")[0] == 0
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "0")[0] == 1


class Finetuned(pl.LightningModule):
    """A backbone that Lightning's BackboneFinetuning freezes, then unfreezes at the second epoch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.01)


def test_unfreezing_layers_is_the_expected_price_not_something_to_fix(telemetry: Telemetry) -> None:
    from lightning.pytorch.callbacks import BackboneFinetuning

    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1)
    trainer = hooked(telemetry, "backbone")(max_epochs=3, callbacks=[finetuning], **TRAINER_DEFAULTS)
    trainer.fit(Finetuned(), data(32, 8), data(16, 8))
    run = telemetry.end()
    rows = summarize(run).causes
    assert rows and not [row for row in rows if row.unexpected]
    assert "what to fix first" not in telemetry_jit.format_summary(run)
    unfrozen = [row for row in rows if row.cause == "trainable_params"]
    if torch_compat.VERSION >= (2, 9):  # torch 2.8 does not guard a parameter's requires_grad
        assert sum(row.count for row in unfrozen) == 2  # training's compile and validation's, once each
        assert all("_parameters[" in row.reasons[0] and "requires_grad mismatch" in row.reasons[0] for row in unfrozen)
    else:
        assert not unfrozen
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "0")[0] == 0


class GAN(pl.LightningModule):
    """Manual optimization with two optimizers (each step advances global_step), Lightning's toggle_optimizer,
    and two torch.compile'd Sequentials that share Sequential.forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.generator = torch.compile(
            torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)), **EAGER
        )
        self.discriminator = torch.compile(
            torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)), **EAGER
        )

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, _ = batch
        g, d = self.optimizers()  # type: ignore[misc]
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        self.toggle_optimizer(g)
        fake = self.generator(torch.randn(len(real), 4))
        self.manual_backward(bce(self.discriminator(fake), ones))
        g.step()
        g.zero_grad()
        self.untoggle_optimizer(g)
        self.toggle_optimizer(d)
        self.manual_backward(bce(self.discriminator(real), ones) + bce(self.discriminator(fake.detach()), zeros))
        d.step()
        d.zero_grad()
        self.untoggle_optimizer(d)

    def configure_optimizers(self) -> Any:
        return tuple(torch.optim.SGD(net.parameters(), lr=0.01) for net in (self.generator, self.discriminator))


def test_compiles_within_a_batch_of_two_optimizers_are_that_batchs_step(telemetry: Telemetry) -> None:
    # opt_g.step() moves global_step on within the batch: the discriminator's compile for the real batch is
    # still the frame's first batch, where other callers of one function are the expected price
    telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0](max_epochs=2, **TRAINER_DEFAULTS).fit(
        GAN(), data(32, 8, width=8)
    )
    run = telemetry.end()
    compiles = [s for s in run.find("compilation") if s.attributes.get("compile.trigger") == "dynamo"]
    assert len(compiles) >= 2 and {s.attributes["train.global_step"] for s in compiles} == {0}
    assert not [row for row in summarize(run).causes if row.unexpected]
    assert "what to fix first" not in telemetry_jit.format_summary(run)


class Curriculum(pl.LightningModule):
    """Sequences that grow each epoch (16, 32, 48 long), for training and validation alike: the loaders are
    built again each epoch (``reload_dataloaders_every_n_epochs=1``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def _loader(self) -> DataLoader:
        x = torch.randn(16, 16 * (self.current_epoch + 1), 8, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.mean(dim=(1, 2)).unsqueeze(1)), batch_size=8)

    train_dataloader = val_dataloader = _loader

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x).mean(dim=1), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.model(x).mean(dim=1), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_length_that_grows_for_training_and_validation_alike_is_a_changing_dimension_and_dynamic_fixes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    options = {"max_epochs": 3, "reload_dataloaders_every_n_epochs": 1, **TRAINER_DEFAULTS}
    hooked(telemetry)(**options).fit(Curriculum())
    run = telemetry.end()
    rows = summarize(run).causes
    assert {(row.cause, row.kind, row.count, row.unexpected) for row in rows} == {
        ("stage_switch", "eval", 1, 0),
        ("changing_dim", "train", 1, 1),
        ("changing_dim", "eval", 1, 1),  # validation's compile meets the length training moved to
    }
    assert "shaped unlike training" not in flat(telemetry_jit.format_summary(run))
    # the fix it names: compile for changing shapes
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed, dynamic=True)(**options).fit(Curriculum())
    assert [row.cause for row in summarize(fixed.end()).causes] == ["stage_switch"]
    assert (
        "fixed recompiles: changing_dim in train: 1 changing_dim in eval: 1"
        in said("diff", str(telemetry.path), str(fixed.path))[1]
    )
    assert said("check", str(fixed.path), "--max-unexpected-recompiles", "0")[0] == 0
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "0")[0] == 1


class Blocks(Regressor):
    """Two blocks of one class, compiled one by one (``blocks.*``): the first gets the batch, the second
    activations that need gradients, so their shared ``forward`` has an entry for each kind of call."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(2))
        super().__init__(torch.nn.ModuleDict({"blocks": blocks, "head": torch.nn.Linear(8, 1)}))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        for block in self.model["blocks"]:
            x = block(x)
        return torch.nn.functional.mse_loss(self.model["head"](x), y)


def test_the_last_batch_met_by_two_callers_of_one_forward_is_the_last_batch_and_drop_last_removes_it(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    # torch names the most recent cache entry's reason: the other caller's (requires_grad), not the batch size
    hooked(telemetry, "blocks.*")(max_epochs=1, **TRAINER_DEFAULTS).fit(Blocks(), data(28, 8))
    run = telemetry.end()
    rows = {row.cause: row for row in summarize(run).causes}
    assert set(rows) == {"shared_code", "last_batch"} and rows["shared_code"].unexpected == 0
    assert (rows["last_batch"].count, rows["last_batch"].steps) == (2, [3])  # each caller's entry, the 4th batch
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed, "blocks.*")(max_epochs=1, **TRAINER_DEFAULTS).fit(Blocks(), data(28, 8, drop_last=True))
    assert [row.cause for row in summarize(fixed.end()).causes] == ["shared_code"]
    assert "fixed recompiles: last_batch in train: 2" in said("diff", str(telemetry.path), str(fixed.path))[1]


def test_evaluating_in_eval_mode_without_no_grad_is_the_expected_price_of_the_module_mode(telemetry: Telemetry) -> None:
    # a plain loop whose evaluation calls model.eval() but keeps gradients on: torch names dropout's training flag
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    model = torch.compile(net, **EAGER)
    with telemetry_jit.CompileTelemetry(telemetry.provider) as recorder:
        for step in range(6):
            recorder.step(step)
            net.train()
            model(torch.randn(8, 8)).pow(2).mean().backward()
            if step % 2:
                net.eval()
                model(torch.randn(8, 8))
    run = telemetry.end()
    assert [(row.cause, row.count, row.unexpected) for row in summarize(run).causes] == [("module_mode", 1, 0)]
    text = flat(telemetry_jit.format_summary(run))
    assert "what to fix first" not in text and "when modules switch between train() and eval()" in text
