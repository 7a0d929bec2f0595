"""A plain FSDP2 training loop (``fully_shard`` per block, gloo on CPU) under ``torch.compile``,
recorded with ``telemetry_jit.CompileTelemetry``: run by tests/e2e/test_torchrun.py as each rank of a
2-process job, from ``torchrun`` or from a SLURM-like environment.

    python fsdp_loop.py OUT.jsonl [tcp://HOST:PORT]   # the address when no launcher set MASTER_ADDR
"""

from __future__ import annotations

import json
import os
import sys

import dynamo_facts  # this folder: the script runs from it
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import telemetry_jit


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def main(out: str, address: str | None) -> None:
    if address is None:  # torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo")
    else:  # srun: only SLURM's variables
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    telemetry_jit.configure("fsdp2-loop", file=out)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(16, 1))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with telemetry_jit.CompileTelemetry() as telemetry:
        for step in range(4):
            telemetry.step(step)
            batch = 8 if step < 3 else 5  # the last batch is smaller
            loss = compiled(torch.randn(batch, 16)).pow(2).mean()  # LOSS LINE
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    telemetry_jit.shutdown()
    seen_by_torch = {
        "compiles": len(dynamo_facts.compiles_recorded_by_torch()),
        "graph_breaks": dynamo_facts.total_graph_breaks(),
    }
    with open(f"{out}.torch.rank{dist.get_rank()}.json", "w") as file:
        json.dump(seen_by_torch, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
