"""A 2- or 4-rank job (torchrun or SLURM-like, gloo on CPU) whose ranks fall out of step, for
tests/e2e/test_out_of_step.py: every step all-reduces the gradients, so a rank that compiles makes the
others wait.

    python out_of_step_loop.py OUT.jsonl stall|diverge|kill|kill-store [SLOW_S [ADDRESS]]

- ``stall``: the last rank gets a smaller batch at step 4 and recompiles with a backend that takes
  ``SLOW_S`` seconds for that batch size, while the others wait in ``all_reduce``.
- ``diverge``: the last rank's model takes a rank-dependent branch from step 3: a graph no other rank
  compiles.
- ``kill``: the last rank is killed (SIGKILL) at step 5; the others' ``all_reduce`` fails.
- ``kill-store``: rank 0, which hosts the job's store, is killed at step 5.

With ``OUT_OF_STEP_BACKEND=nccl`` each rank trains on its own GPU over NCCL (scripts/nccl_check.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import telemetry_jit

STEPS = 14
STEP_WORK_S = 0.15  # the rest of a training step: the heartbeats see the ranks move


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.branch = False  # set on one rank: dynamo guards on it and compiles the other branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x)
        if self.branch:
            y = torch.sin(y) * 2 + 1
        return y


def slow_for_odd_batches(slow_s: float):  # noqa: ANN201 - a torch.compile backend
    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # noqa: ANN202
        sizes = {t.shape[0] for t in example_inputs if isinstance(t, torch.Tensor) and t.dim() == 2}
        time.sleep(slow_s if 5 in sizes else 0.2)
        return gm.forward

    return backend


def main(out: str, mode: str, slow_s: float) -> None:
    address = sys.argv[4] if len(sys.argv) > 4 else None
    backend = os.environ.get("OUT_OF_STEP_BACKEND", "gloo")
    if address:  # a SLURM-like start: each rank its own process, the rendezvous on the command line
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)
    else:
        dist.init_process_group(backend)
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    telemetry_jit.configure("out-of-step", file=out)
    torch.manual_seed(0)
    model = Net().to(device)
    compiled = torch.compile(model, backend=slow_for_odd_batches(slow_s), dynamic=False)
    with telemetry_jit.CompileTelemetry() as telemetry:
        for step in range(STEPS):
            telemetry.step(step)
            batch = 5 if (mode == "stall" and rank == last and step == 4) else 8
            if mode == "diverge" and rank == last and step == 3:
                model.branch = True
            if (mode == "kill" and rank == last or mode == "kill-store" and rank == 0) and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            compiled(torch.randn(batch, 16, device=device)).pow(2).mean().backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            time.sleep(STEP_WORK_S)
    telemetry_jit.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 9.0)
