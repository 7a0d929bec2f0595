#!/usr/bin/env python3
"""Check the dynamo probe against torch's own accounting on a CUDA GPU.

    python3 scripts/cuda_check.py             # torch only
    python3 scripts/cuda_check.py --sharded   # also Lightning's FSDP and ModelParallel strategies

Compiles a small model on CUDA with inductor in three modes (default, max-autotune with its
runtime autotuning, reduce-overhead with CUDA graphs, whose recording also fires torch's compile
callbacks), with a graph break and a shape change, and checks that the probe's records are exactly
torch's compiles (ids, forward/backward, recompile reasons) and its counted graph breaks. Prints
one line per mode; exits 1 on a mismatch.

``--sharded`` also trains a small model with a graph break under ``HookedTrainer`` with Lightning's
``strategy="fsdp"`` and ``ModelParallelStrategy`` (``fully_shard`` in ``configure_model``), both CUDA
only, on one GPU, and checks that the telemetry file holds exactly torch's compilations and counted
graph breaks. (Written for a lent GPU machine; see docs/distributed.md for where it has run.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from telemetry_jit.probes.dynamo import DynamoProbe  # noqa: E402
from tests.e2e import dynamo_facts  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(64, 256)
        self.head = torch.nn.Linear(256, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.encoder(x))
        torch._dynamo.graph_break()
        return self.head(h)


def check(mode: str) -> bool:
    dynamo_facts.reset_compile_state()
    model = Model().cuda()
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = DynamoProbe()
    probe.attach()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        for batch in (32, 32, 32, 16, 32):  # a shape change: a recompile
            loss = compiled(torch.randn(batch, 64, device="cuda")).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.cuda.synchronize()
    records = probe.poll(final=True)
    probe.detach()
    metrics = dynamo_facts.compiles_recorded_by_torch()
    ours = sorted((r.compile_id, r.trigger == "lazy_backward", r.recompile_reason) for r in records)
    theirs = sorted((str(m.compile_id), m.is_forward is False, m.recompile_reason or "") for m in metrics)
    breaks = sum(1 for r in records for b in r.graph_breaks if b.counted_by_torch)
    backends = {r.backend for r in records if r.trigger == "dynamo"}
    ok = ours == theirs and breaks == dynamo_facts.total_graph_breaks() and backends == {"inductor"}
    recompiles = sum(1 for r in records if r.is_recompile and r.trigger == "dynamo")
    print(
        f"{mode:16} {'ok' if ok else 'MISMATCH'}: {len(records)} compiles (torch {len(metrics)}), "
        f"{recompiles} recompiles, {breaks} graph breaks (torch {dynamo_facts.total_graph_breaks()}), "
        f"backends {sorted(backends)}"
    )
    if not ok:
        print("  ours:  ", ours, "\n  torch: ", theirs)
    return ok


def check_sharded(strategy_name: str) -> bool:
    """A HookedTrainer fit under a sharded Lightning strategy: the file holds torch's compilations."""
    import tempfile

    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.utils.data import DataLoader, TensorDataset

    import telemetry_jit
    from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat

    class Sharded(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Model()

        def configure_model(self) -> None:
            if strategy_name == "model_parallel":
                from torch.distributed.fsdp import fully_shard

                fully_shard(self.model, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.model(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dynamo_facts.reset_compile_state()
    nv_one_logger_compat.forget_configuration()
    strategy: Any = (
        "fsdp" if strategy_name == "fsdp" else ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        provider = telemetry_jit.configure(f"cuda-{strategy_name}", file=path)
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer,
            provider,
            jit_config=telemetry_jit.JitConfig(use_torch=True),  # pl_module.model, as NeMo resolves it
        )
        trainer = HookedTrainer(
            accelerator="cuda",
            devices=1,
            strategy=strategy,
            max_steps=8,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        data = DataLoader(TensorDataset(torch.randn(100, 64)), batch_size=16)  # the last batch holds 4
        trainer.fit(Sharded(), data)
        callback.on_app_end()
        telemetry_jit.shutdown()
        run = telemetry_jit.read_telemetry(path)[-1]
    compiles = run.find("compilation")
    breaks = sum(1 for span in compiles for e in span.events if e.name == "graph_break")
    torch_compiles, torch_breaks = len(dynamo_facts.compiles_recorded_by_torch()), dynamo_facts.total_graph_breaks()
    ok = len(compiles) == torch_compiles > 0 and breaks == torch_breaks > 0
    print(
        f"{strategy_name:16} {'ok' if ok else 'MISMATCH'}: {len(compiles)} compiles (torch {torch_compiles}), "
        f"{breaks} graph breaks (torch {torch_breaks})"
    )
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    results = [check(mode) for mode in ("default", "max-autotune", "reduce-overhead")]
    if "--sharded" in sys.argv[1:]:
        results += [check_sharded(name) for name in ("fsdp", "model_parallel")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
