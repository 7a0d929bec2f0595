"""Compile telemetry in a Lightning Fabric loop, through Fabric's callbacks.

    python3 examples/fabric_loop.py --out runs/fabric.jsonl               # one process
    python3 examples/fabric_loop.py --out runs/fabric.jsonl --devices 2   # two CPU processes (DDP)

Each rank writes its own file (``fabric.rank<R>.jsonl`` with several processes); then rank 0 prints
telemetry-jit's summary of its file.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch

import telemetry_jit
from telemetry_jit.cli import main as cli


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        torch._dynamo.graph_break()  # stands for a print, .item() or an unsupported op
        return self.head(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/fabric.jsonl")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    telemetry_jit.configure("fabric-loop", file=args.out, global_batch_size=8 * args.devices)
    telemetry = telemetry_jit.FabricCompileTelemetry()
    strategy = "ddp" if args.devices > 1 else "auto"
    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy=strategy, callbacks=[telemetry])
    fabric.launch()
    torch.manual_seed(0)
    model = torch.compile(Model(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.randn(60, 16)
    batches = [data[i : i + 8] for i in range(0, len(data), 8)]  # the last batch holds 4

    fabric.call("on_train_start", fabric)
    step = 0
    for _ in range(args.epochs):
        for x in batches:
            fabric.call("on_train_batch_start", step)
            loss = model(x).pow(2).mean()
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    fabric.call("on_train_end")
    telemetry_jit.shutdown()
    if fabric.global_rank == 0:
        path = args.out if args.devices == 1 else args.out.replace(".jsonl", ".rank0.jsonl")
        cli(["summary", path])


if __name__ == "__main__":
    main()
