"""The small model the benchmarks train (a compiled 10-20-1 MLP) and the trainer settings they share."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

# no logger, checkpoints, progress bar or summary: only the training loop and telemetry are timed
QUIET_TRAINER = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


class Body(torch.nn.Module):
    """A module of our own: dynamo does not compile torch.nn's own containers as top-level frames."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(10, 20)
        self.out = torch.nn.Linear(20, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


class MLP(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Body()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)
