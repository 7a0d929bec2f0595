"""Steady-state cost of compile telemetry per training step (prints figures; not a test).

    python benchmarks/compile_telemetry_overhead.py [--steps 2000] [--repeats 5]

Measured in one process, as ratios against the same run without compile telemetry:

1. ``poll``: the only per-step work compile telemetry adds (checking that torch recorded no new
   compile), timed directly.
2. fit-level: step time of a compiled 10-20-1 MLP trained with a plain Lightning Trainer and with
   HookedTrainer with compile telemetry off and on, runs interleaved so machine noise hits all
   alike. A step's time is the interval between two batches leaving the data loader (its median
   in a fit, then the median over repeats): a fit's setup and teardown are not steps. Hooked
   minus plain is what nv-one-logger's telemetry costs; on minus off is telemetry-jit's compile
   telemetry.
3. the same HookedTrainer with nv-one-logger's per-iteration bookkeeping done by nv-one-logger's
   own methods (``TimeEventCallback(iteration_fast_path=False)``): the per-step cost of the
   iteration spans the fast path leaves out.
4. the same HookedTrainer with nv-one-logger's per-iteration telemetry switched off
   (``is_train_iterations_enabled_or_fn=False``): what is left per step when only loops and
   compiles are recorded.
5. with ``--upstream`` (lightning 2.5 and nv-one-logger-pytorch-lightning-integration installed):
   nv-one-logger's own ``hook_trainer_cls`` on a copy of the Trainer class.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
import timeit
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from mlp import MLP, QUIET_TRAINER  # benchmarks/ is on the path when a script here runs
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.recording.recorder import CompileRecorder


class StampedBatches:
    """The batches of a data loader, each stamped with the time it was handed to the loop."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.stamps.append(time.thread_time_ns())
            yield batch


def step_seconds(trainer_cls: type[pl.Trainer], steps: int) -> float:
    """Median time between two batches of one fit."""
    data = StampedBatches(
        DataLoader(TensorDataset(torch.randn(steps * 8, 10), torch.randn(steps * 8, 1)), batch_size=8)
    )
    model = MLP()
    model.model.compile(backend="eager")
    trainer_cls(max_epochs=1, **QUIET_TRAINER).fit(model, data)
    stamps = data.stamps[10:]  # the first steps compile
    return statistics.median(b - a for a, b in itertools.pairwise(stamps)) / 1e9


def _upstream_hook(provider: object) -> type[pl.Trainer]:
    """nv-one-logger's own hook on a copy of the Trainer class (it patches the class it is given)."""
    from nv_one_logger.training_telemetry.integration.pytorch_lightning import hook_trainer_cls

    copy = type("UpstreamTrainer", (pl.Trainer,), {})
    return hook_trainer_cls(copy, provider)[0]


def still_recording(variant: str) -> None:
    """A figure measured after nv-one-logger stopped recording (an internal error) is not its cost."""
    if not nv_one_logger_compat.telemetry_enabled():
        raise SystemExit(f"nv-one-logger stopped recording during the {variant} runs: the figures are invalid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--upstream", action="store_true", help="also nv-one-logger's own hook (lightning 2.5)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)

    with tempfile.TemporaryDirectory() as folder:
        nv_one_logger_compat.forget_configuration()
        iterations = [True]  # nv-one-logger reads its switch at each loop start, so it can change per fit
        provider = telemetry_jit.configure(
            "benchmark", file=Path(folder) / "t.jsonl", is_train_iterations_enabled_or_fn=lambda: iterations[0]
        )
        with_compile, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
        without_compile, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, compile_telemetry=False)
        slow_iterations = telemetry_jit.TimeEventCallback(provider, call_on_app_start=False, iteration_fast_path=False)
        upstream_path, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, telemetry_callback=slow_iterations)

        recorder = CompileRecorder(provider)
        recorder.start(lambda: (0, "train"))
        calls = 200_000
        poll_ns = min(timeit.repeat(recorder.poll, number=calls, repeat=5)) / calls * 1e9
        recorder.stop()

        step_seconds(with_compile, 50)  # warm up: compile once, import everything
        variants = {
            "HookedTrainer (iteration fast path)": with_compile,
            "HookedTrainer, compile telemetry off": without_compile,
            "HookedTrainer, nv-one-logger's own iteration path": upstream_path,
            "HookedTrainer, iteration telemetry off": with_compile,
        }
        rounds: list[dict[str, float]] = []
        for _ in range(args.repeats):
            times = {"plain": step_seconds(pl.Trainer, args.steps)}
            for name, trainer_cls in variants.items():
                iterations[0] = "iteration telemetry off" not in name
                times[name] = step_seconds(trainer_cls, args.steps)
            rounds.append(times)
        iterations[0] = True
        still_recording("HookedTrainer")
        callback.on_app_end()
        if args.upstream:
            # last, on a configuration of its own: nv-one-logger's own hook starts its own application
            # span (beside ours, nv-one-logger records a telemetry error and stops recording for everyone)
            nv_one_logger_compat.forget_configuration()
            upstream_hook = _upstream_hook(telemetry_jit.configure("benchmark", file=Path(folder) / "upstream.jsonl"))
            for times in rounds:
                times["plain (beside upstream)"] = step_seconds(pl.Trainer, args.steps)
                times["nv-one-logger's own hook_trainer_cls"] = step_seconds(upstream_hook, args.steps)
            still_recording("nv-one-logger's own hook_trainer_cls")
            telemetry_jit.shutdown()  # its application span ends while the file is still there

    print(f"torch {torch.__version__}, lightning {pl.__version__}, {args.steps} steps x {args.repeats} rounds")
    print(f"poll() with nothing new: {poll_ns / 1000:.3f} us a step")
    print(f"plain Lightning Trainer step: {statistics.median(t['plain'] for t in rounds) * 1e6:.1f} us")
    print("per step over plain (median of the rounds' differences, [quartiles]):")

    def over(name: str, base: str = "plain") -> None:
        differences = sorted((t[name] - t[base]) * 1e6 for t in rounds)
        low, _, high = statistics.quantiles(differences, n=4)
        print(f"  {name:52s} {statistics.median(differences):+7.1f} us  [{low:+.1f}, {high:+.1f}]")

    for name in variants:
        over(name)
    if args.upstream:
        over("nv-one-logger's own hook_trainer_cls", base="plain (beside upstream)")
    print("compile telemetry's own share (on - off):")
    over("HookedTrainer (iteration fast path)", base="HookedTrainer, compile telemetry off")


if __name__ == "__main__":
    main()
