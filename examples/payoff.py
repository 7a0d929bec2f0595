"""Is compiling worth it? Measure it in the run: compiled against eager steps of the same model.

    python examples/payoff.py [--out runs/payoff.jsonl] [--model fused|tiny] [--steps 60]

``fused``: a chain of elementwise ops that inductor fuses into one kernel (compiling pays);
``tiny``: a tiny layer with a graph break (compiling does not). With ``payoff=True`` the run times
blocks of compiled and eager steps once compiling has settled, then says what compiling bought; the
compile figures also go to the trainer's logger (a CSVLogger here: its metrics.csv gains compile/
columns).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


class Chain(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        for _ in range(4):
            h = torch.sin(h) * 1.01 + torch.cos(h) * 0.5
        return h


class Tiny(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.linear(x))
        print("", end="")  # a graph break
        return h * 2


class Model(pl.LightningModule):
    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.body(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/payoff.jsonl")
    parser.add_argument("--model", choices=("fused", "tiny"), default="fused")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    width, batch, body = (2048, 256, Chain(2048)) if args.model == "fused" else (8, 4, Tiny(8))
    provider = telemetry_jit.configure("payoff", file=args.out)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        provider,
        jit_config=telemetry_jit.JitConfig(use_torch=True, module_selector="body"),
        payoff=True,
    )
    data = DataLoader(TensorDataset(torch.randn(batch * args.steps, width)), batch_size=batch)
    logger = CSVLogger(Path(args.out).parent, name="payoff")
    trainer = HookedTrainer(
        max_steps=args.steps, accelerator="cpu", logger=logger, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(Model(body), data)
    callback.on_app_end()

    print()
    print(telemetry_jit.format_summary(telemetry_jit.read_telemetry(args.out)[-1]))
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        columns = [name for name in csv.DictReader(file).fieldnames or [] if name.startswith("compile/")]
    print(f"\n{Path(logger.log_dir) / 'metrics.csv'} holds {', '.join(columns)}")


if __name__ == "__main__":
    main()
