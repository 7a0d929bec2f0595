"""Steady-state cost of compile telemetry per training step (prints figures; not a test).

    python benchmarks/compile_telemetry_overhead.py [--steps 2000] [--repeats 5]

Measured in one process, as ratios against the same run without compile telemetry:

1. ``poll``: the only per-step work compile telemetry adds (checking that torch recorded no new
   compile), timed directly.
2. fit-level: median step time of a compiled 10-20-1 MLP trained with a plain Lightning Trainer
   and with HookedTrainer with compile telemetry off and on, runs interleaved so machine noise
   hits all alike. Hooked minus plain is what nv-one-logger's telemetry costs; on minus off is
   telemetry-jit's compile telemetry.
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
import statistics
import tempfile
import time
import timeit
from pathlib import Path

import lightning.pytorch as pl
import torch
from mlp import MLP, QUIET_TRAINER  # benchmarks/ is on the path when a script here runs
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.recording.recorder import CompileRecorder


def fit_seconds(trainer_cls: type[pl.Trainer], steps: int) -> float:
    data = DataLoader(TensorDataset(torch.randn(steps * 8, 10), torch.randn(steps * 8, 1)), batch_size=8)
    model = MLP()
    model.model.compile(backend="eager")
    trainer = trainer_cls(max_epochs=1, **QUIET_TRAINER)
    start = time.perf_counter()
    trainer.fit(model, data)
    return time.perf_counter() - start


def _upstream_hook(provider: object) -> type[pl.Trainer]:
    """nv-one-logger's own hook on a copy of the Trainer class (it patches the class it is given)."""
    from nv_one_logger.training_telemetry.integration.pytorch_lightning import hook_trainer_cls

    copy = type("UpstreamTrainer", (pl.Trainer,), {})
    return hook_trainer_cls(copy, provider)[0]


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

        fit_seconds(with_compile, 50)  # warm up: compile once, import everything
        plain, on, off, no_iterations, own_path, upstream = [], [], [], [], [], []
        for _ in range(args.repeats):
            plain.append(fit_seconds(pl.Trainer, args.steps))
            off.append(fit_seconds(without_compile, args.steps))
            on.append(fit_seconds(with_compile, args.steps))
            own_path.append(fit_seconds(upstream_path, args.steps))
            iterations[0] = False
            no_iterations.append(fit_seconds(with_compile, args.steps))
            iterations[0] = True
        callback.on_app_end()
        # last, with the application span ended: nv-one-logger's own hook starts one of its own (while one
        # runs, nv-one-logger records a telemetry error and stops recording for everyone)
        plain_again = []
        if args.upstream:
            upstream_hook = _upstream_hook(provider)
            for _ in range(args.repeats):
                plain_again.append(fit_seconds(pl.Trainer, args.steps))
                upstream.append(fit_seconds(upstream_hook, args.steps))

    plain_us = statistics.median(plain) / args.steps * 1e6
    on_us = statistics.median(on) / args.steps * 1e6
    off_us = statistics.median(off) / args.steps * 1e6
    lean_us = statistics.median(no_iterations) / args.steps * 1e6
    own_us = statistics.median(own_path) / args.steps * 1e6
    print(f"torch {torch.__version__}, lightning {pl.__version__}, {args.steps} steps x {args.repeats} repeats")
    print(f"poll() with nothing new (per step):            {poll_ns / 1000:8.3f} us")
    print(f"plain Lightning Trainer step:                  {plain_us:8.1f} us")
    print(f"HookedTrainer step, compile telemetry off:     {off_us:8.1f} us  (+{off_us - plain_us:.1f} over plain)")
    print(f"HookedTrainer step, compile telemetry on:      {on_us:8.1f} us  (+{on_us - plain_us:.1f} over plain)")
    print(f"  the same, nv-one-logger's own iteration path: {own_us:8.1f} us  (+{own_us - plain_us:.1f} over plain)")
    if upstream:
        upstream_us = statistics.median(upstream) / args.steps * 1e6
        again_us = statistics.median(plain_again) / args.steps * 1e6
        print(
            f"nv-one-logger's own hook_trainer_cls:          {upstream_us:8.1f} us  "
            f"(+{upstream_us - again_us:.1f} over plain measured beside it, {again_us:.1f} us)"
        )
    print(f"difference (noise included):                   {on_us - off_us:8.1f} us  (ratio {on_us / off_us:.3f})")
    print(
        f"HookedTrainer step, iteration telemetry off:   {lean_us:8.1f} us  "
        f"(+{lean_us - plain_us:.1f} over plain, ratio {lean_us / plain_us:.3f})"
    )


if __name__ == "__main__":
    main()
