"""Resident memory, step time and telemetry file size over a long training run (prints figures; not a test).

    python benchmarks/long_run_memory.py [--steps 100000] [--every 10000]

A compiled 10-20-1 MLP trains for ``--steps`` steps with HookedTrainer and compile telemetry on,
writing to a JSON Lines file; every ``--every`` steps the process's resident memory, the mean
step time over those steps and the file's size are printed. Memory and step time should stay
flat; the file grows only with exported records. Per-iteration spans stay off the exporters
(nv-one-logger's default).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from mlp import MLP, QUIET_TRAINER  # benchmarks/ is on the path when a script here runs
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 2**20


class Report(pl.Callback):
    def __init__(self, every: int, path: Path) -> None:
        self.every = every
        self.path = path
        self.window_start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        step = trainer.global_step
        if step % self.every == 0:
            now = time.perf_counter()
            step_us = (now - self.window_start) / self.every * 1e6
            print(f"{step:>8}  {rss_mib():10.1f}  {step_us:10.1f}  {self.path.stat().st_size / 1024:12.1f}", flush=True)
            self.window_start = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument(
        "--log-every-n", type=int, default=50, help="nv-one-logger's log_every_n_train_iterations (its default: 50)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.jsonl"
        provider = telemetry_jit.configure(
            "long-run", file=path, global_batch_size=8, log_every_n_train_iterations=args.log_every_n
        )
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
        )
        data = DataLoader(TensorDataset(torch.randn(4096, 10), torch.randn(4096, 1)), batch_size=8)
        print(f"{'step':>8}  {'RSS MiB':>10}  {'us/step':>10}  {'file KiB':>12}")
        trainer = HookedTrainer(
            max_steps=args.steps, limit_val_batches=0, callbacks=[Report(args.every, path)], **QUIET_TRAINER
        )
        trainer.fit(MLP(), data)
        callback.on_app_end()
        compiles = trainer.compile_telemetry.last_stats.count
        print(f"compilations recorded: {compiles}; file {path.stat().st_size / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
