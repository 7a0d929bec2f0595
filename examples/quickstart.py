"""Quickstart: train a small Lightning model with torch.compile and see where compilation went.

    python examples/quickstart.py [--out runs/quickstart.jsonl] [--backend inductor] [--epochs 3]

The compiled encoder breaks its graph once (``torch._dynamo.graph_break()``, standing for a ``print``
or an ``.item()``), and the last batch of each epoch is smaller than the others, so you will see
compiles, a graph break and recompiles, each with its cause and fix at the top of the summary.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


class Regressor(pl.LightningModule):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.model = torch.nn.ModuleDict(
            {
                "encoder": torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU()),
                "head": torch.nn.Linear(width, 1),
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model["head"](self.model["encoder"](x))

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


class Encoder(torch.nn.Module):
    """The compiled part, with one graph break that torch.compile must split the graph around."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inner(x))
        torch._dynamo.graph_break()  # stands for a print, .item() or an unsupported op
        return h * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/quickstart.jsonl", help="telemetry file (JSON Lines)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    provider = telemetry_jit.configure("quickstart", file=args.out, global_batch_size=32)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        provider,
        jit_config=telemetry_jit.JitConfig(
            use_torch=True, module_selector="encoder", torch_kwargs={"backend": args.backend}
        ),
    )

    callback.on_model_init_start()
    model = Regressor()
    model.model["encoder"] = Encoder(32)
    callback.on_model_init_end()

    callback.on_dataloader_init_start()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    train = DataLoader(TensorDataset(x[:250], y[:250]), batch_size=32)  # 250 = 7 x 32 + 26
    val = DataLoader(TensorDataset(x[250:], y[250:]), batch_size=50)
    callback.on_dataloader_init_end()

    trainer = HookedTrainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(Path(args.out).parent),
    )
    trainer.fit(model, train, val)
    callback.on_app_end()

    print()
    print(telemetry_jit.format_summary(telemetry_jit.read_telemetry(args.out)[-1]))
    print(f"\nTelemetry written to {args.out}; summarize it again with: telemetry-jit summary {args.out}")


if __name__ == "__main__":
    main()
