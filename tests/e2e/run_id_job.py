"""One rank of a small ``torchrun`` job that configures telemetry at its top, before its process group is up
(as most scripts do): run by tests/e2e/test_torchrun.py, twice at one address, to see two jobs get two ids.

    python run_id_job.py OUT.jsonl OTLP_ENDPOINT
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import telemetry_jit


def main(out: str, endpoint: str) -> None:
    telemetry_jit.configure("run-id-job", file=out, otlp=endpoint)
    dist.init_process_group("gloo")  # joins torchrun's store, which telemetry used before it
    with telemetry_jit.CompileTelemetry() as telemetry:
        telemetry.step(0)
        torch.compile(torch.nn.Linear(2, 2), backend="eager")(torch.ones(1, 2))
        dist.barrier()
    dist.destroy_process_group()
    telemetry_jit.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
