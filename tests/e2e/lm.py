"""The run the answers are tested on: a Lightning run of ``lightning.pytorch.demos.Transformer`` behind a
submodule of the user's with an ``.item()`` branch, compiled through ``JitConfig``; the last training
batch holds 6 of 8 and validation sequences are 24 long instead of 16. Each of its recompiles and graph
breaks has a cause a user meets in practice, and each named fix can be applied to the same run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.analysis.reader import TelemetryRun

VOCAB = 64


class Gated(torch.nn.Module):
    """The compiled submodule: the demo Transformer, then a gate that reads a number with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = Transformer(vocab_size=VOCAB, ninp=32, nhead=2, nhid=32, nlayers=1)

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = self.transformer(inputs, target)  # CALLS THE TRANSFORMER
        if out.mean().item() > 0:  # ITEM: a graph break in the user's code
            out = out * 0.5
        return out


class LanguageModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Gated()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        return torch.nn.functional.nll_loss(self.model(inputs, target), target.view(-1))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        inputs, target = batch
        self.log("val_loss", torch.nn.functional.nll_loss(self.model(inputs, target), target.view(-1)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tokens(samples: int, length: int, batch_size: int, drop_last: bool = False, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (samples, length), generator=generator)
    return DataLoader(TensorDataset(x, x.roll(-1, 1)), batch_size=batch_size, drop_last=drop_last)


@dataclass
class Answers:
    run: TelemetryRun
    path: Path
    recompiles: int  # torch's own count, for the partition
    graph_breaks: int


def line_of(marker: str) -> int:
    """The line of this file that carries ``marker`` (a comment): where the answers must point."""
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, start=1) if marker in line)


def train(
    provider: Any,
    path: Path,
    *,
    drop_last: bool = False,
    validation_length: int = 24,
    torch_kwargs: dict[str, Any] | None = None,
    epochs: int = 2,
) -> Answers:
    """Train the run (each keyword applies one fix) and read back what telemetry-jit recorded."""
    from tests.e2e.dynamo_facts import compiles_recorded_by_torch, total_graph_breaks

    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "aot_eager", **(torch_kwargs or {})})
    hooked, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config, live=False)
    trainer = hooked(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(path.parent),
    )
    # 30 samples in batches of 8: the last holds 6
    trainer.fit(LanguageModel(), tokens(30, 16, 8, drop_last), tokens(16, validation_length, 8, seed=1))
    callback.on_app_end()
    recompiles = sum(
        1 for m in compiles_recorded_by_torch() if not str(m.compile_id).endswith("/0") and m.is_forward is not False
    )
    return Answers(telemetry_jit.read_telemetry(path)[-1], path, recompiles, total_graph_breaks())
