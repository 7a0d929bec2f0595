"""A LightningModule compiled whole, as Lightning's guide shows (``trainer.fit(torch.compile(model))``: Lightning
then compiles ``training_step`` itself), with manual optimization, so each backward runs inside the compiled
step and its graph is compiled there, at the first backward, while dynamo's frame hook is still set.
For tests/e2e/test_dynamo_telemetry.py, in a process of its own: were telemetry's callbacks compiled by
dynamo there, the nested compile would wait on torch's callback lock forever.

    python whole_module_fit.py OUT.jsonl|plain

Prints the ids of the frames torch compiled, one line of JSON.
"""

from __future__ import annotations

import json
import sys

import lightning.pytorch as pl
import torch
from dynamo_facts import compiles_recorded_by_torch  # this folder: the script runs from it
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


class TwoOptimizers(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.encoder = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        for optimizer in self.optimizers():
            optimizer.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
        for optimizer in self.optimizers():
            optimizer.step()

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return torch.optim.SGD(self.encoder.parameters(), lr=0.01), torch.optim.SGD(self.head.parameters(), lr=0.01)


def main(out: str) -> None:
    trainer_cls: type[pl.Trainer] = pl.Trainer
    if out != "plain":
        trainer_cls, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry_jit.configure("whole", file=out))
    data = TensorDataset(torch.randn(48, 16, generator=torch.Generator().manual_seed(0)), torch.randn(48, 1))
    trainer = trainer_cls(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(torch.compile(TwoOptimizers(), backend="aot_eager"), DataLoader(data, batch_size=8))
    if out != "plain":
        telemetry_jit.shutdown()
    compiled = compiles_recorded_by_torch()
    print(json.dumps(sorted(f"{m.compile_id}{' backward' if m.is_forward is False else ''}" for m in compiled)))


if __name__ == "__main__":
    main(sys.argv[1])
