"""The run's status is a fact the gate reads first: a crash anywhere inside ``fit`` is ``failed``, a fit that
trained nothing is ``empty``, and ``check`` passes neither."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.analysis.runs import run_status
from telemetry_jit.cli import main as cli
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Body, Net, loader
from tests.words import flat

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]
BUDGET = ["--max-graph-breaks", "0", "--max-recompiles", "2", "--max-compile-share", "30"]


class Crashing(Net):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def setup(self, stage: str) -> None:
        if self.where == "setup":
            raise RuntimeError("boom in setup")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.where == "configure_optimizers":
            raise RuntimeError("boom in configure_optimizers")
        return super().configure_optimizers()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.where == "sanity check":
            raise RuntimeError("boom in the sanity check")
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize("where", ["setup", "configure_optimizers", "sanity check", "warning as error"])
def test_a_crash_anywhere_inside_fit_is_a_failed_run_the_gate_refuses(telemetry: Telemetry, where: str) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    with warnings.catch_warnings(), pytest.raises((RuntimeError, PossibleUserWarning)) as raised:
        if where == "warning as error":  # python -W error: Lightning's own warning ends the fit
            warnings.simplefilter("error", PossibleUserWarning)
        val = loader(8, 4) if where == "sanity check" else None
        trainer.fit(Crashing(where), loader(16, 4), val)
    status = run_status(telemetry.end())
    assert status.state == "failed", status
    # the error that ended the fit, named as it was raised (a warning made an error names Lightning's own)
    assert f"{type(raised.value).__name__}: {str(raised.value).splitlines()[0]}" in status.detail, status.detail
    assert cli(["check", str(telemetry.path), *BUDGET]) == 3


class FailsAfterFit(Net):
    """Trains well, then its validate/test/predict step raises (the oracle's conv1d_bn_predict_bug)."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.training:  # validate() after fit
            raise ValueError("a bug in validation_step")
        super().validation_step(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        raise ValueError("a bug in test_step")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        raise ValueError("a bug in predict_step")


@pytest.mark.parametrize("call", ["validate", "test", "predict"])
def test_an_entry_point_that_raises_after_a_good_fit_fails_the_run(telemetry: Telemetry, call: str) -> None:
    """Every Trainer entry point, not fit alone: a run whose predict() raised is failed, and check says exit 3."""
    jit = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=jit, live=False)
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    model = FailsAfterFit()
    trainer.fit(model, loader(16, 4))
    with pytest.raises(ValueError, match=f"a bug in {call.replace('validate', 'validation')}"):
        getattr(trainer, call)(model, loader(8, 4))
    status = run_status(telemetry.end())
    assert status.state == "failed" and "a bug in" in status.detail, status
    assert cli(["check", str(telemetry.path), "--max-recompiles", "100"]) == 3


def _empty_loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(0, 8), torch.zeros(0, 1)), batch_size=4)


@pytest.mark.parametrize(
    ("how", "options", "reason"),
    [
        ("empty dataset", {}, "training dataloader is empty"),
        ("max_steps=0", {"max_steps": 0}, "max_steps=0"),
        ("limit_train_batches=0", {"limit_train_batches": 0}, "limit_train_batches=0"),
        ("max_epochs=0", {"max_epochs": 0}, "max_epochs=0"),
        ("no fit", None, "no training, validation or test loop"),
    ],
)
def test_a_fit_that_trained_nothing_is_said_so_and_never_passes(
    telemetry: Telemetry, how: str, options: dict[str, Any] | None, reason: str
) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
        pl.Trainer, telemetry.provider, live=False, jit_config=telemetry_jit.JitConfig(use_torch=True)
    )
    if options is not None:
        settings = {"max_epochs": 1, **TRAINER_DEFAULTS, **options}
        HookedTrainer(**settings).fit(Net(), _empty_loader() if how == "empty dataset" else loader(16, 4))
    status = run_status(telemetry.end())
    assert status.state == "empty" and reason in status.detail, status
    assert "TRAINED NOTHING" in status.headline()
    assert cli(["check", str(telemetry.path), *BUDGET]) == 3
    assert cli(["check", str(telemetry.path), *BUDGET, "--allow-incomplete"]) == 3


def test_a_run_with_no_loop_is_not_judged_on_a_compile_share_it_cannot_compute(tmp_path: Path) -> None:
    # a run that compiled (so not empty) in no loop of any wall time: its share of a loop is no number
    path = tmp_path / "noloop.jsonl"
    ids = ',"run":"r1","rank":0,"pid":1}'
    path.write_text(
        '{"kind":"run_start","format":"telemetry-jit","format_version":1' + ids + "\n"
        '{"kind":"span","span_id":"a","parent_id":null,"name":"application","start_unix_ns":1000,"end_unix_ns":1000,'
        '"attributes":{}' + ids + "\n"
        '{"kind":"span","span_id":"c","parent_id":"a","name":"compilation","start_unix_ns":1000,"end_unix_ns":1000,'
        '"attributes":{"compile.id":"0/0"}' + ids + "\n"
        '{"kind":"health","failed_calls":{},"exporters":{}' + ids + "\n"
    )
    assert cli(["check", str(path), "--max-recompiles", "2"]) == 0  # it compiled: there is something to judge
    assert cli(["check", str(path), "--max-compile-share", "30"]) == 2


def test_a_fit_resumed_from_a_finished_checkpoint_says_it_trained_nothing_and_why(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """The job's last resume, after its last step: the loop states restored say it is done, Lightning trains
    nothing, and the status names that, not the causes of a fresh fit that trains nothing."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    pl.Trainer(callbacks=[saving], **{**TRAINER_DEFAULTS, "enable_checkpointing": True, "max_steps": 2}).fit(
        Net(), loader(16, 4)
    )
    (checkpoint,) = (tmp_path / "ckpt").glob("*.ckpt")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    HookedTrainer(max_steps=2, **TRAINER_DEFAULTS).fit(Net(), loader(16, 4), ckpt_path=str(checkpoint))
    status = run_status(telemetry.end())
    assert status.state == "empty" and "reached max_steps=2 already" in status.detail, status


# -- records that prove a run whole: a file that lost part of its run never reads as whole --------------------------

JIT = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})


class CopyTruncate(pl.Callback):
    """logrotate's ``copytruncate`` at ``step``: the file copied aside, then cut to nothing in place (the writer,
    same inode, notices nothing and goes on appending)."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.path.with_suffix(".jsonl.1").write_bytes(self.path.read_bytes())
            os.truncate(self.path, 0)


def _compiled_fit(telemetry: Telemetry, callbacks: list[pl.Callback] | None = None, **options: Any) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False, jit_config=JIT)
    settings = {"max_epochs": 1, **TRAINER_DEFAULTS, **options}
    HookedTrainer(callbacks=callbacks or [], **settings).fit(Net(), loader(50, 4), loader(8, 4))


def _check(path: Path, capsys: pytest.CaptureFixture, *budget: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli(["check", str(path), *(budget or ("--max-recompiles", "100", "--max-graph-breaks", "0"))])
    said = capsys.readouterr()
    return code, said.out + said.err


def test_a_whole_run_proves_itself_whole(telemetry: Telemetry, capsys: pytest.CaptureFixture) -> None:
    _compiled_fit(telemetry)
    status = run_status(telemetry.end())
    assert status.finished and status.whole is True and not status.unproven, status
    assert _check(telemetry.path, capsys) == (0, f"telemetry-jit check: {telemetry.path} is within budget.\n")


def test_a_file_cut_in_place_by_copytruncate_is_missing_its_head(
    telemetry: Telemetry, capsys: pytest.CaptureFixture
) -> None:
    _compiled_fit(telemetry, [CopyTruncate(telemetry.path, step=9)])
    status = run_status(telemetry.end())
    assert status.state == "incomplete" and status.missing[0].startswith("the head (records 0 to "), status
    assert "copytruncate" in status.missing[0]
    code, said = _check(telemetry.path, capsys, "--max-recompiles", "2", "--max-graph-breaks", "0")
    assert code == 3 and "the head (records 0 to" in said, said
    # the rotated copy holds the head and no closing record: not whole either
    rotated = telemetry.path.with_suffix(".jsonl.1")
    code, said = _check(rotated, capsys, "--max-recompiles", "2")
    assert code == 3 and "killed" in said and "no closing record" in said, said


@pytest.mark.parametrize("cut", ["first 20 lines", "a middle line", "the health line", "lines of another run"])
def test_a_file_missing_any_of_its_lines_names_what_is_missing(
    telemetry: Telemetry, capsys: pytest.CaptureFixture, cut: str
) -> None:
    _compiled_fit(telemetry)
    telemetry.end()
    lines = telemetry.path.read_text().splitlines(keepends=True)
    health = next(i for i, line in enumerate(lines) if line.startswith('{"kind":"health"'))
    if cut == "first 20 lines":
        kept, named = lines[20:], "the head (records 0 to 19"
    elif cut == "a middle line":
        kept, named = lines[:10] + lines[11:], "record 10"
    elif cut == "the health line":
        kept, named = lines[:health] + lines[health + 1 :], "1 health record"
    else:  # a spliced file: the same run's lines 10 to 20 copied in again at its end
        kept, named = lines + lines[10:20], "10 records read twice"
    telemetry.path.write_text("".join(kept))
    code, said = _check(telemetry.path, capsys)
    assert code == 3 and named in said, said


def test_compile_spans_that_failed_to_export_make_the_run_incomplete(
    telemetry: Telemetry, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telemetry_jit.recording import compile_spans

    exported = []

    def failing_twice(*args: Any) -> Any:  # the 1st and 2nd compile span cannot be built: never exported
        exported.append(args)
        if len(exported) in (1, 2):
            raise OSError("the exporter failed")
        return original(*args)

    original = compile_spans.record_attributes
    monkeypatch.setattr(compile_spans, "record_attributes", failing_twice)
    _compiled_fit(telemetry)
    run = telemetry.end()
    assert len(exported) >= 3 and len(run.find("compilation")) == len(exported) - 2
    status = run_status(run)
    assert status.state == "incomplete", status
    assert status.missing == (
        "2 compile spans that failed to export (its health record counts them, at nv_one_logger.export)",
    ), status
    code, said = _check(telemetry.path, capsys, "--max-recompiles", "100")
    assert code == 3 and "2 compile spans that failed to export" in said, said


KILLED_AS_TELEMETRY_CLOSES = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from telemetry_jit.exporters import FileExporter
    from tests.models import Net, loader, TRAINER_DEFAULTS

    FileExporter.close = lambda self: os.kill(os.getpid(), signal.SIGKILL)  # in on_app_end, every loop ended
    session = telemetry_jit.configure("killed", file={path!r})
    jit = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}})
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, live=False, jit_config=jit)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(50, 4), loader(8, 4))
    callback.on_app_end()
    """
)


def test_a_run_killed_while_telemetry_closed_after_every_loop_ended_is_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "killed.jsonl"
    script = KILLED_AS_TELEMETRY_CLOSES.format(root=str(ROOT), path=str(path))
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert process.returncode == -signal.SIGKILL, process.stderr
    run = telemetry_jit.read_telemetry(path)[-1]
    assert run.find("training_loop") and all(span.end_unix_ns is not None for span in run.find("training_loop"))
    status = run_status(run)
    assert status.state == "killed" and "no closing record (run_end)" in status.detail, status
    code, said = _check(path, capsys)
    assert code == 3 and "killed" in said, said


# -- facts the gate needs, written as records ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["TORCH_COMPILE_DISABLE=1", "torch._dynamo.config.disable = True"])
def test_compiling_switched_off_is_a_record_the_eager_fallback_budget_fails(
    telemetry: Telemetry, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how.startswith("TORCH_COMPILE_DISABLE"):  # torch reads it at import, as its config's default
        monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    net = Net()
    with torch._dynamo.config.patch(disable=True):
        _compiled_fit_of(telemetry, net)
    run = telemetry.end()
    said = [{k: v for k, v in e.attributes.items() if k.startswith("not_run.")} for e in run.events("compile_not_run")]
    assert {"not_run.reason": "disabled", "not_run.module": "", "not_run.detail": how} in said, said
    # and JitTransform's module, whose compiled code never ran
    assert any(e["not_run.reason"] == "never_ran" and e["not_run.module"] == type(net.model).__name__ for e in said)
    code, words = _check(telemetry.path, capsys, "--no-eager-fallback")
    assert code == 1 and f"compiling was switched off ({how})" in flat(words) and "never ran" in words, words
    assert cli(["check", str(telemetry.path), "--max-recompiles", "100"]) == 0  # said only where it is asked
    capsys.readouterr()
    assert cli(["summary", "--json", str(telemetry.path)]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["compiled_code_not_run"][0].startswith("compiling was")


class DisabledBody(Body):
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


@pytest.mark.parametrize("how", ["decorated", "wrapped", "compiled by the user", "compiled in place by the user"])
def test_a_compiled_module_whose_forward_is_disabled_is_a_record_the_eager_fallback_budget_fails(
    telemetry: Telemetry, capsys: pytest.CaptureFixture, how: str
) -> None:
    net, module = Net(), "DisabledBody"
    if how == "decorated":  # @torch.compiler.disable on the class's forward, JitTransform compiling it
        net.model = DisabledBody(None, 8, 2)
    elif how == "wrapped":  # the instance's forward wrapped
        net.model.forward = torch.compiler.disable(net.model.forward)
        module = "Body"
    if how.startswith("compiled"):  # torch.compile(module), or module.compile(), of the decorated forward
        net.model = DisabledBody(None, 8, 2)
        if how == "compiled by the user":
            net.model = torch.compile(net.model, backend="eager")
        else:
            net.model.compile(backend="eager")
        module = "model (DisabledBody)"
        HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(net, loader(48, 4))
    else:
        _compiled_fit_of(telemetry, net)
    run = telemetry.end()
    said = [{k: v for k, v in e.attributes.items() if k.startswith("not_run.")} for e in run.events("compile_not_run")]
    assert [(e["not_run.reason"], e["not_run.module"]) for e in said] == [("never_ran", module)], said
    assert "torch.compiler.disable" in said[0]["not_run.detail"], said
    assert list(run.events("module_not_compiled")) == []  # not blamed on torch's Module.compile() of its layers
    code, words = _check(telemetry.path, capsys, "--no-eager-fallback")
    assert code == 1 and "never ran" in words, words


class DisabledNet(Net):
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_a_lightning_module_compiled_whole_whose_forward_is_disabled_breaks_at_the_users_line(
    telemetry: Telemetry, capsys: pytest.CaptureFixture
) -> None:
    """``trainer.fit(torch.compile(model))``: Lightning compiles ``training_step``, which runs; the disabled forward
    it calls is a graph break said at the user's line, which the break budget refuses."""
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(torch.compile(DisabledNet(), backend="eager"), loader(48, 4))
    run = telemetry.end()
    assert list(run.events("compile_not_run")) == []  # compiled code ran: training_step's
    reasons = [e.attributes.get("graph_break.reason", "") for e in run.events("graph_break")]
    assert any("torch.compiler.disable" in reason for reason in reasons), reasons
    code, words = _check(telemetry.path, capsys, "--max-graph-breaks", "0", "--max-recompiles", "100")
    assert code == 1 and "graph breaks, more than the 0 allowed" in flat(words), words


def _compiled_fit_of(telemetry: Telemetry, net: pl.LightningModule, **options: Any) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False, jit_config=JIT)
    HookedTrainer(**{"max_epochs": 1, **TRAINER_DEFAULTS, **options}).fit(net, loader(48, 4))


class StopAt(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 3:
            trainer.should_stop = True


class Slow(pl.Callback):
    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(0.4)


@pytest.mark.parametrize(
    ("how", "options", "words"),
    [
        (
            "should_stop",
            {"callbacks": [StopAt()]},
            "trainer.should_stop (EarlyStopping, or the model) ended training at step 3",
        ),
        ("max_time", {"callbacks": [Slow()], "max_time": {"seconds": 1}}, "max_time ran out at step"),
        ("fast_dev_run", {"fast_dev_run": 2}, "fast_dev_run=2 (a smoke test) ended training at step 2"),
        (
            "limit_train_batches",
            {"limit_train_batches": 3},
            "limit_train_batches=3: each epoch ran 3 of its 12 batches",
        ),
    ],
)
def test_a_run_stopped_early_says_so_and_a_budget_can_refuse_it(
    telemetry: Telemetry, capsys: pytest.CaptureFixture, how: str, options: dict[str, Any], words: str
) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    HookedTrainer(**{"max_epochs": 1, **TRAINER_DEFAULTS, **options}).fit(Net(), loader(48, 4))
    status = run_status(telemetry.end())
    assert status.finished and words in status.stopped_early, status
    capsys.readouterr()
    assert cli(["summary", str(telemetry.path)]) == 0
    assert f"this run STOPPED EARLY: {words}" in flat(capsys.readouterr().out)
    assert cli(["summary", "--json", str(telemetry.path)]) == 0
    assert words in json.loads(capsys.readouterr().out)["runs"][0]["status"]["stopped_early"]
    code, said = _check(telemetry.path, capsys, "--max-recompiles", "100", "--no-early-stop")
    assert code == 1 and f"the run stopped early: {words}" in flat(said), said
    assert _check(telemetry.path, capsys, "--max-recompiles", "100")[0] == 0


def test_a_run_that_ran_its_length_did_not_stop_early(telemetry: Telemetry, capsys: pytest.CaptureFixture) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    HookedTrainer(**{"max_steps": 3, **TRAINER_DEFAULTS}).fit(Net(), loader(48, 4))  # max_steps is its length
    assert run_status(telemetry.end()).stopped_early == ""
    assert _check(telemetry.path, capsys, "--no-early-stop")[0] == 0
