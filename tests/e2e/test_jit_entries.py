"""What JitTransform compiles is in place whatever hook Lightning starts from: a fresh fit, a resume at an epoch
boundary or mid-epoch (``ckpt_path=``), and validate, test or predict alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

import telemetry_jit
from telemetry_jit.cli import main as cli
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

JIT = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})


class Predicting(Net):
    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch[0])


def _checkpoint(tmp_path: Path, **options: Any) -> Path:
    """A checkpoint written by a plain fit (no telemetry, no compiling): the job before the resume."""
    saving = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_train_steps=options.pop("every", None))
    settings = {**TRAINER_DEFAULTS, "enable_checkpointing": True, **options}
    pl.Trainer(callbacks=[saving], **settings).fit(Net(), loader(48, 4))
    return max(tmp_path.glob("*.ckpt"), key=lambda path: path.stat().st_mtime_ns)


ENTRIES = ["fit", "resume mid-epoch", "resume at an epoch boundary", "validate", "test", "predict"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_what_jit_transform_compiles_is_in_place_whatever_hook_lightning_starts_from(
    telemetry: Telemetry, tmp_path: Path, entry: str
) -> None:
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT, live=False)
    model = Predicting()
    if entry == "fit":
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(16, 4))
    elif entry == "resume mid-epoch":  # the pretraining shape: one long epoch, counted in steps
        ckpt = _checkpoint(tmp_path, max_steps=4, every=4)
        HookedTrainer(max_steps=12, **TRAINER_DEFAULTS).fit(model, loader(48, 4), ckpt_path=str(ckpt))
    elif entry == "resume at an epoch boundary":
        ckpt = _checkpoint(tmp_path, max_epochs=1)
        HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(48, 4), ckpt_path=str(ckpt))
    elif entry == "validate":
        HookedTrainer(**TRAINER_DEFAULTS).validate(model, loader(8, 4))
    elif entry == "test":
        HookedTrainer(**TRAINER_DEFAULTS).test(model, loader(8, 4))
    else:
        HookedTrainer(**TRAINER_DEFAULTS).predict(model, loader(8, 4))
    assert getattr(model, "_compiled", False) is True, entry
    run = telemetry.end()
    assert run.find("compilation"), f"{entry}: nothing compiled"
    if entry.startswith("resume"):
        assert cli(["check", str(telemetry.path), "--max-graph-breaks", "0", "--no-eager-fallback"]) == 0
