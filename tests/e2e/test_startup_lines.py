"""What telemetry-jit prints as a fit starts and ends: text from code is escaped, and a forked child does not
print its parent's "where to read it" line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit.terminal import clean
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, loader

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]


class _Step(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_modules_class_name_reaches_the_start_up_line_escaped(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = type("Net\x1b[2J\x1b]0;owned\x07", (_Step,), {})  # a class name is any text code gives it
    jit = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=jit, live=False)
    with caplog.at_level(logging.INFO):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(hostile(), loader(8, 4))
    started = [record.getMessage() for record in caplog.records if "torch.compile(" in record.getMessage()]
    assert started and all("\x1b" not in line and "\x07" not in line for line in started), started
    assert all(clean(hostile.__name__) in line for line in started), started  # the name is said, made safe


FORK = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.models import Net, loader, TRAINER_DEFAULTS

    session = telemetry_jit.configure("fork", file={path!r})
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, live=False)
    child = os.fork()
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    callback.on_app_end()
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_print_its_parents_where_to_read_it_line(tmp_path: Path) -> None:
    script = FORK.format(root=str(ROOT), path=str(tmp_path / "t.jsonl"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    said = (result.stdout + result.stderr).count("compile telemetry is in")
    assert said == 1, result.stdout + result.stderr  # the parent's, once
