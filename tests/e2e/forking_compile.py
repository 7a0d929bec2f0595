"""A fresh training process whose compile forks as inductor's does, with psutil's summed PSS of its process tree
sampled alongside (tests/e2e/test_compile_resources.py runs it and compares). ``python forking_compile.py OUT
START``: START is inductor's worker start method, ``fork`` (workers forked from this process) or ``subprocess``
(a pool process started, its workers forked from it). Fresh: the first child a process reaps is where the
kernel's figure for reaped children (``RUSAGE_CHILDREN``) starts from this whole process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning.pytorch as pl
import psutil

import telemetry_jit
from telemetry_jit import hook_trainer_cls, read_telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader

HOLD_MB = 96  # what the compile itself holds while it runs


def tree_memory() -> tuple[int, int]:
    """psutil's summed PSS of this process and its children, and of that the anonymous pages' (``Pss_Anon``)."""
    me = psutil.Process()
    pss = anon = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            pss += process.memory_full_info().pss
            rollup = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except (psutil.Error, OSError):
            continue
        anon += sum(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Pss_Anon:"))
    return pss, anon


def forking_backend(graph, inputs):
    """A compile that forks as inductor's does: its worker pool started (forked from this process, or from a
    pool process), memory of its own held, and a compiler run and reaped while it compiles."""
    from torch._inductor import config
    from torch._inductor.async_compile import AsyncCompile

    with config.patch(worker_start_method=sys.argv[2], compile_threads=2):
        AsyncCompile.wait_pool_ready()
    held = bytearray(HOLD_MB << 20)
    for index in range(0, len(held), 4096):
        held[index] = 1
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    time.sleep(1.5)  # sampled, by both
    del held
    return graph.forward


def main() -> None:
    samples: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.time_ns(), *tree_memory()))
            time.sleep(0.03)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = Path(sys.argv[1])
    provider = telemetry_jit.configure("forking-compile", file=out / "t.jsonl", global_batch_size=4)
    model = Net()
    model.model.compile(backend=forking_backend)
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, provider)
    HookedTrainer(max_epochs=1, limit_train_batches=1, **TRAINER_DEFAULTS).fit(model, loader(8, 4))
    telemetry_jit.shutdown()
    time.sleep(0.1)
    stop.set()
    sampler.join()
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
    (run,) = read_telemetry(out / "t.jsonl")
    compiles = [
        {"start": s.start_unix_ns, "end": s.end_unix_ns, **s.attributes}
        for s in run.find("compilation")
        if s.attributes["compile.trigger"] == "dynamo"
    ]
    (out / "figures.json").write_text(json.dumps({"compiles": compiles, "samples": samples}))


if __name__ == "__main__":
    main()
