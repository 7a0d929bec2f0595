"""Thunder: compile two blocks of a small model with Lightning Thunder and record its compiles.

    python examples/thunder_quickstart.py [--out runs/thunder.jsonl] [--epochs 2]

Each cache miss of thunder (a new input shape, grad mode or dtype) becomes a `compilation` span
with `compile.source = "thunder"` in the JSON Lines file; the summary lists them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.linear(x))


class Model(pl.LightningModule):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.model = torch.nn.ModuleDict({"block0": Block(width), "block1": Block(width)})
        self.head = torch.nn.Linear(width, 1)
        self.inp = torch.nn.Linear(8, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.model.values():
            h = block(h)
        return self.head(h)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/thunder.jsonl")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    provider = telemetry_jit.configure("thunder-quickstart", file=args.out, global_batch_size=32)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_thunder=True, module_selector="block*")
    )
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    train = DataLoader(TensorDataset(x[:250], y[:250]), batch_size=32)  # the last batch has 26 rows
    val = DataLoader(TensorDataset(x[250:], y[250:]), batch_size=50)
    trainer = HookedTrainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(Path(args.out).parent),
    )
    trainer.fit(Model(), train, val)
    callback.on_app_end()
    print()
    print(telemetry_jit.format_summary(telemetry_jit.read_telemetry(args.out)[-1]))


if __name__ == "__main__":
    main()
