#!/usr/bin/env python3
"""Check the dynamo probe against torch's own accounting on a CUDA GPU (needs torch only).

    python3 scripts/cuda_check.py

Compiles a small model on CUDA with inductor in three modes (default, max-autotune with its
runtime autotuning, reduce-overhead with CUDA graphs, whose recording also fires torch's compile
callbacks), with a graph break and a shape change, and checks that the probe's records are exactly
torch's compiles (ids, forward/backward, recompile reasons) and its counted graph breaks. Prints
one line per mode; exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from telemetry_jit.compat import torch as torch_compat  # noqa: E402
from telemetry_jit.probes.dynamo import DynamoProbe  # noqa: E402


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
    torch_compat.reset_compile_state()
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
    metrics = torch_compat.compiles_recorded_by_torch()
    ours = sorted((r.compile_id, r.trigger == "lazy_backward", r.recompile_reason) for r in records)
    theirs = sorted((str(m.compile_id), m.is_forward is False, m.recompile_reason or "") for m in metrics)
    breaks = sum(1 for r in records for b in r.graph_breaks if b.counted_by_torch)
    backends = {r.backend for r in records if r.trigger == "dynamo"}
    ok = ours == theirs and breaks == torch_compat.total_graph_breaks() and backends == {"inductor"}
    recompiles = sum(1 for r in records if r.is_recompile and r.trigger == "dynamo")
    print(
        f"{mode:16} {'ok' if ok else 'MISMATCH'}: {len(records)} compiles (torch {len(metrics)}), "
        f"{recompiles} recompiles, {breaks} graph breaks (torch {torch_compat.total_graph_breaks()}), "
        f"backends {sorted(backends)}"
    )
    if not ok:
        print("  ours:  ", ours, "\n  torch: ", theirs)
    return ok


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    results = [check(mode) for mode in ("default", "max-autotune", "reduce-overhead")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
