"""Small Lightning models and data for the tests: each exercises one compile behaviour."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def loader(samples: int = 20, batch_size: int = 4, features: int = 8, dtype: torch.dtype = torch.float32) -> DataLoader:
    generator = torch.Generator().manual_seed(samples * 31 + batch_size)
    x = torch.randn(samples, features, generator=generator).to(dtype)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=False)


class Block(torch.nn.Module):
    def __init__(self, width: int = 8, graph_break: str | None = None) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.linear(x))
        if self.graph_break == "print":
            print("", end="")
        elif self.graph_break == "item":
            h = h * float(h.sum().item() > -1e9)
        elif self.graph_break == "branch" and h.sum() > 0:  # data-dependent control flow
            h = h * 1.0
        elif self.graph_break == "histc":  # no graph break for dynamo; thunder has no histc of its own
            h = h + torch.histc(h, bins=4).sum() * 0.0
        return h


class Body(torch.nn.Module):
    """``layer0``, ``layer1``, ... (Blocks) then ``head``."""

    def __init__(self, graph_break: str | None, width: int, layers: int) -> None:
        super().__init__()
        for index in range(layers):
            self.add_module(f"layer{index}", Block(width, graph_break if index == 0 else None))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, module in self.named_children():
            if name != "head":
                x = module(x)
        return self.head(x)


class Net(pl.LightningModule):
    """A LightningModule whose ``model`` is a :class:`Body`; training losses are recorded."""

    def __init__(self, graph_break: str | None = None, width: int = 8, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Body(graph_break, width, layers)
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x.float()), y.float())
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x.float()), y.float()))

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)
