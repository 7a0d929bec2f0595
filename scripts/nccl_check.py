#!/usr/bin/env python3
"""Check the rank watch on GPUs over NCCL (written for a lent GPU machine; no GPU was lent so far).

    python3 scripts/nccl_check.py [--gpus N]

Runs tests/e2e/out_of_step_loop.py under ``torchrun --nproc_per_node N`` (N GPUs, at least 2) with
``OUT_OF_STEP_BACKEND=nccl``: (a) the last rank recompiles for 9 s at step 4 while the others wait in
NCCL's ``all_reduce``, (b) a rank-dependent branch. Checks that rank 0's file says the stall while the rank
still compiled, naming the rank, the cause and the ranks waiting, and the divergent graph; prints one line
per case and exits 1 on a miss. The heartbeat uses only the job's c10d store, never a collective, so NCCL's
watchdog and timeouts are untouched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import telemetry_jit  # noqa: E402


def said(out: Path) -> list[dict[str, object]]:
    run = telemetry_jit.read_telemetry(out.with_name(f"{out.stem}.rank0{out.suffix}"))[-1]
    return [e.attributes for s in run.spans.values() for e in s.events if e.name == "ranks_out_of_step"]


def run_case(mode: str, gpus: int, folder: Path) -> list[dict[str, object]]:
    out = folder / mode / "t.jsonl"
    out.parent.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(gpus)]
    command += [str(ROOT / "tests" / "e2e" / "out_of_step_loop.py"), str(out), mode, "9"]
    env = {**os.environ, "OUT_OF_STEP_BACKEND": "nccl", "TELEMETRY_JIT_HEARTBEAT_S": "0.5"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)
    if result.returncode != 0:
        raise SystemExit(f"{mode}: the job failed\n{result.stderr[-4000:]}")
    return said(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    args = parser.parse_args()
    if args.gpus < 2:
        print(f"nccl_check: needs at least 2 GPUs, this machine has {torch.cuda.device_count()}")
        return 1
    last, misses = args.gpus - 1, 0
    with tempfile.TemporaryDirectory() as folder:
        events = run_case("stall", args.gpus, Path(folder))
        stall = next((e for e in events if e["ranks.kind"] == "stall"), None)
        ok = (
            stall is not None
            and stall["ranks.ranks"] == [last]
            and stall["ranks.waiting"] == last
            and "size mismatch" in str(stall["ranks.line"])
            and float(str(stall["ranks.duration_s"])) < 9  # said while it still compiled
        )
        misses += not ok
        print(f"stall over NCCL, {args.gpus} GPUs: {'ok' if ok else 'MISSED'}: {stall and stall['ranks.line']}")
        events = run_case("diverge", args.gpus, Path(folder))
        divergent = [e for e in events if e["ranks.kind"] == "divergent_graph"]
        ok = [e["ranks.ranks"] for e in divergent] == [[last]]
        misses += not ok
        print(f"divergent graph over NCCL: {'ok' if ok else 'MISSED'}: {divergent and divergent[0]['ranks.line']}")
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
