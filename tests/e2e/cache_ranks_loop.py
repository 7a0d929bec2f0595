"""A 2-rank job (torchrun, gloo on CPU) compiling with inductor, each rank against the cache folder its
command line names for it: run by tests/e2e/test_compile_cache.py to give one rank an empty cache.

    python cache_ranks_loop.py OUT.jsonl CACHE_FOR_RANK_0 CACHE_FOR_RANK_1
"""

from __future__ import annotations

import os
import sys

os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[2 + int(os.environ["RANK"])]  # before torch reads it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import telemetry_jit  # noqa: E402


def main(out: str) -> None:
    dist.init_process_group("gloo")
    telemetry_jit.configure("cache-ranks", file=out)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    compiled = torch.compile(model, backend="inductor")
    with telemetry_jit.CompileTelemetry() as telemetry:
        for step in range(3):
            telemetry.step(step)
            loss = compiled(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
    telemetry_jit.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
