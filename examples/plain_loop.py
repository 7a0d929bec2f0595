"""Compile telemetry in a plain PyTorch training loop: no Lightning Trainer.

    python3 examples/plain_loop.py --out runs/plain_loop.jsonl

Trains a small model compiled with torch.compile, whose last batch is shorter (a recompile) and
whose forward has a graph break; then prints telemetry-jit's summary of the file.
"""

from __future__ import annotations

import argparse

import torch

import telemetry_jit


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
    parser.add_argument("--out", default="runs/plain_loop.jsonl")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    telemetry_jit.configure("plain-loop", file=args.out, global_batch_size=8)
    torch.manual_seed(0)
    model = torch.compile(Model(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(60, 16)
    batches = [data[i : i + 8] for i in range(0, len(data), 8)]  # the last batch holds 4

    # given the model and the epoch's length, as the README shows: its recompile at the shorter last batch is
    # named last_batch (with the drop_last fix), and the model's thunder compiles, if any, are recorded
    with telemetry_jit.CompileTelemetry(model=model, batches=len(batches)) as telemetry:
        step = 0
        for _ in range(args.epochs):
            for index, x in enumerate(batches):
                telemetry.step(step, index)
                loss = model(x).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                step += 1
    print(f"{telemetry.stats.count} compilations, {telemetry.stats.recompile_count} recompiles")
    telemetry_jit.shutdown()
    print(telemetry_jit.format_summary(telemetry_jit.read_telemetry(args.out)[-1]))


if __name__ == "__main__":
    main()
