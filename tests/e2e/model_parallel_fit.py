"""A HookedTrainer fit with Lightning's ModelParallelStrategy (FSDP2's ``fully_shard`` in
``configure_model``) on 2 CPU processes (gloo): run by tests/e2e/test_torchrun.py.

    python model_parallel_fit.py OUT.jsonl
"""

from __future__ import annotations

import json
import sys

import dynamo_facts  # this folder: the script runs from it
import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.relu(self.linear(x))
        print("", end="")  # a graph break in the user's code
        return h


class Sharded(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Sequential(Block(), torch.nn.Linear(16, 1))

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.model[0], mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def training_step(self, batch, batch_idx):
        return self.model(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(out: str) -> None:
    provider = telemetry_jit.configure("model-parallel", file=out)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "aot_eager"})
    )
    trainer = HookedTrainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Sharded(), DataLoader(TensorDataset(torch.randn(72, 16)), batch_size=8))
    callback.on_app_end()
    seen_by_torch = {
        "compiles": len(dynamo_facts.compiles_recorded_by_torch()),
        "graph_breaks": dynamo_facts.total_graph_breaks(),
    }
    with open(f"{out}.torch.rank{trainer.global_rank}.json", "w") as file:
        json.dump(seen_by_torch, file)


if __name__ == "__main__":
    main(sys.argv[1])
