"""What HookedTrainer costs a training step, as the user waits for it (prints figures; not a test).

    python benchmarks/step_cost.py [--steps 1500] [--rounds 15] [--profile-steps 20000]

Three measurements of the same thing, because this machine's noise swamps tens of microseconds in a
difference of whole fits:

1. **Whole fits, paired.** Each round trains a compiled 10-20-1 MLP (batch 8, one torch thread) once
   with a plain Lightning ``Trainer`` and once with each variant of ``HookedTrainer``, in an order
   that alternates from round to round. A fit's wall time (``Trainer.fit`` called to returned: every
   thread, setup and teardown included) is split at the first and last batch into setup, steps and
   teardown. Reported: the median over rounds of each variant's difference to the plain fit of the
   same round, per step (whole fit / steps) and for the steps alone, with quartiles; setup plus
   teardown in milliseconds per fit, apart, since a long run pays it once.
2. **Sampling share** (needs ``py-spy``, which is not a dependency: ``pip install py-spy``). One long
   hooked fit runs under ``py-spy record --threads``; the share of its samples inside ``Trainer.fit``
   whose stack holds telemetry code (telemetry_jit, its exporters, nv-one-logger, OpenTelemetry), plus
   every sample another thread spends in that code, times the measured step time, is the per-step cost
   at a resolution whole fits cannot give. Where those samples went is listed by function.
3. **Hooks timed in place.** One long hooked fit with telemetry's per-step hooks (the one callback's
   ``on_train_batch_start`` and ``on_train_batch_end``) wrapped in a clock, beside a callback of no-op
   hooks wrapped alike (the clock's own cost, subtracted): microseconds a step on the training thread,
   with Python's caches as cold as torch's kernels leave them. Steadier than sampling, blind to other
   threads (the file exporter has none).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from mlp import MLP, QUIET_TRAINER  # benchmarks/ is on the path when a script here runs
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.lightning.trainer import _Telemetry

TELEMETRY_PACKAGES = {"telemetry_jit", "exporters", "nv_one_logger", "opentelemetry"}
# HookedTrainer's fit (validate, test, predict: trainer.py's ``recorded``) only wraps Trainer's own: the training
# under it is not telemetry's
ENTRY_POINT = re.compile(r"_recorded\.<locals>\.recorded$")
FRAME = re.compile(r"(?P<function>.*) \((?P<path>[^():]*)(?::\d+)?\)$")


class StampedBatches:
    """The batches of a data loader, each stamped (wall clock) when handed to the loop."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.stamps: list[float] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.stamps.append(time.perf_counter())
            yield batch


def timed_fit(trainer_cls: type[pl.Trainer], steps: int) -> dict[str, float]:
    """Wall time of one fit, split into setup (to the first batch), steps, and teardown (after the last)."""
    data = StampedBatches(
        DataLoader(TensorDataset(torch.randn(steps * 8, 10), torch.randn(steps * 8, 1)), batch_size=8)
    )
    model = MLP()
    model.model.compile(backend="eager")
    trainer = trainer_cls(max_epochs=1, **QUIET_TRAINER)
    started = time.perf_counter()
    trainer.fit(model, data)
    ended = time.perf_counter()
    first, last = data.stamps[0], data.stamps[-1]
    return {"fit": ended - started, "setup": first - started, "steps": last - first, "teardown": ended - last}


def still_recording(variant: str) -> None:
    """A figure measured after nv-one-logger stopped recording (an internal error) is not its cost."""
    if not nv_one_logger_compat.telemetry_enabled():
        raise SystemExit(f"nv-one-logger stopped recording during the {variant} runs: the figures are invalid")


def paired_fits(args: argparse.Namespace, folder: Path) -> None:
    nv_one_logger_compat.forget_configuration()
    iterations = [True]  # nv-one-logger reads its switch at each loop start, so it can change per fit
    provider = telemetry_jit.configure(
        "benchmark", file=folder / "t.jsonl", is_train_iterations_enabled_or_fn=lambda: iterations[0]
    )
    hooked, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
    no_compile, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, compile_telemetry=False)
    variants = {
        "HookedTrainer": (hooked, True),
        "HookedTrainer, compile telemetry off": (no_compile, True),
        "HookedTrainer, iteration telemetry off": (hooked, False),
    }
    timed_fit(hooked, 50)  # warm up: compile once, import everything
    timed_fit(pl.Trainer, 50)
    rounds = []
    for index in range(args.rounds):
        order = ["plain", *variants]
        if index % 2:
            order.reverse()
        times = {}
        for name in order:
            if name == "plain":
                times[name] = timed_fit(pl.Trainer, args.steps)
            else:
                trainer_cls, iterations[0] = variants[name]
                times[name] = timed_fit(trainer_cls, args.steps)
        rounds.append(times)
    iterations[0] = True
    still_recording("HookedTrainer")
    callback.on_app_end()

    steps = args.steps
    plain_step = statistics.median(t["plain"]["fit"] / steps for t in rounds)
    print(f"whole fits: {args.rounds} paired rounds of {steps} steps; plain Trainer {plain_step * 1e6:.1f} us a step")
    print(f"  {'variant':40s} {'per step, whole fit':>26s} {'steps alone':>26s} {'setup+teardown':>16s}")

    def quartiles(values: list[float]) -> str:
        low, middle, high = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        return f"{statistics.median(values):+7.1f} [{low:+6.1f}, {high:+6.1f}]"

    for name in variants:
        whole = [(t[name]["fit"] - t["plain"]["fit"]) / steps * 1e6 for t in rounds]
        alone = [(t[name]["steps"] - t["plain"]["steps"]) / (steps - 1) * 1e6 for t in rounds]
        edges = [
            (t[name]["setup"] + t[name]["teardown"] - t["plain"]["setup"] - t["plain"]["teardown"]) * 1e3
            for t in rounds
        ]
        print(f"  {name:40s} {quartiles(whole):>26s} {quartiles(alone):>26s} {statistics.median(edges):+12.1f} ms")


def child(variant: str, steps: int, out: Path) -> None:
    """One long fit of ``variant`` (run under py-spy): its step time goes to ``out``."""
    trainer_cls: type[pl.Trainer] = pl.Trainer
    if variant == "hooked":
        nv_one_logger_compat.forget_configuration()
        provider = telemetry_jit.configure("benchmark", file=out.with_suffix(".jsonl"))
        trainer_cls, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
    timed_fit(trainer_cls, 50)
    times = timed_fit(trainer_cls, steps)
    if variant == "hooked":
        still_recording("HookedTrainer")
        callback.on_app_end()
    out.write_text(str(times["steps"] / (steps - 1)))


class Profile:
    """What py-spy saw of one long fit: samples in ``Trainer.fit``, in telemetry code (any thread), and
    in Lightning's dispatch of callback hooks outside the callbacks themselves."""

    def __init__(self, raw: Path, step_s: float) -> None:
        self.step_s = step_s
        self.in_fit = self.in_telemetry = self.in_dispatch = 0
        self.where: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            _, _, frames_text = stack.partition(": ")
            frames = [match.groupdict() for frame in frames_text.split(";") if (match := FRAME.match(frame))]
            count = int(count_text)
            fit = any(f["function"] == "Trainer.fit" for f in frames)
            ours = [
                i
                for i, f in enumerate(frames)
                if TELEMETRY_PACKAGES & set(f["path"].split("/")[:-1]) and not ENTRY_POINT.search(f["function"])
            ]
            self.in_fit += count if fit else 0
            if ours and (fit or not frames_text.startswith("MainThread")):  # another thread's telemetry counts too
                self.in_telemetry += count
                entry, leaf = frames[ours[0]], frames[ours[-1]]
                self.where[f"{entry['function']} -> {leaf['function']} ({leaf['path']})"] += count
            elif fit and any(f["function"] == "_call_callback_hooks" for f in frames):
                self.in_dispatch += count

    def share(self, samples: int) -> str:
        fraction = samples / self.in_fit
        return f"{100 * fraction:.2f}% = {fraction * self.step_s * 1e6:.1f} us a step"

    def interval(self, samples: int) -> str:
        """The share's 95 % interval from counting alone (a count of n samples is off by about sqrt(n)):
        the resolution of the figure, before any of the machine's noise."""
        low, high = ((samples + sign * 1.96 * math.sqrt(samples)) / self.in_fit for sign in (-1, 1))
        return f"{samples} of {self.in_fit} samples, {100 * low:.2f}-{100 * high:.2f}% from counting alone"


def sampling_share(args: argparse.Namespace, folder: Path) -> None:
    spy = shutil.which("py-spy")
    if spy is None:
        print("sampling share: skipped (py-spy is not installed: pip install py-spy)")
        return
    profiles = {}
    for variant in ("plain", "hooked"):
        raw, step_file = folder / f"{variant}.txt", folder / f"{variant}.step"
        command = [spy, "record", "-r", "200", "--threads", "-f", "raw", "-o", str(raw), "--", sys.executable]
        command += [__file__, "--child", variant, str(step_file), "--profile-steps", str(args.profile_steps)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        profiles[variant] = Profile(raw, float(step_file.read_text()))
    plain, hooked = profiles["plain"], profiles["hooked"]
    print(
        f"sampling share, {args.profile_steps}-step fits (plain {plain.step_s * 1e6:.1f} us a step, hooked "
        f"{hooked.step_s * 1e6:.1f} us), of the samples in Trainer.fit:"
    )
    print(f"  telemetry code, every thread:            {hooked.share(hooked.in_telemetry)}")
    print(f"                                           ({hooked.interval(hooked.in_telemetry)})")
    dispatch = hooked.in_dispatch / hooked.in_fit - plain.in_dispatch / plain.in_fit
    print(
        f"  Lightning's dispatch of callback hooks:  hooked {hooked.share(hooked.in_dispatch)}, plain "
        f"{plain.share(plain.in_dispatch)}: {100 * dispatch:+.2f}% = {dispatch * hooked.step_s * 1e6:+.1f} us a step"
    )
    for function, count in hooked.where.most_common(args.top):
        print(f"    {100 * count / hooked.in_fit:5.2f}%  {function}")


class TimedHooks:
    """Time spent in ``hooks`` of ``callback`` (instance attributes, replaced by timed ones)."""

    HOOKS = ("on_train_batch_start", "on_train_batch_end")

    def __init__(self, callback: Any) -> None:
        self.ns = dict.fromkeys(self.HOOKS, 0)
        for name in self.HOOKS:
            setattr(callback, name, self._timed(name, getattr(callback, name)))

    def _timed(self, name: str, hook: Any) -> Any:
        clock, ns = time.perf_counter_ns, self.ns

        def timed(*args: Any) -> None:
            started = clock()
            hook(*args)
            ns[name] += clock() - started

        return timed

    def reset(self) -> None:
        self.ns.update(dict.fromkeys(self.HOOKS, 0))


class NoOpHooks(pl.Callback):
    def on_train_batch_start(self, *args: Any) -> None:
        pass

    def on_train_batch_end(self, *args: Any) -> None:
        pass


def hooks_timed(args: argparse.Namespace, folder: Path) -> None:
    nv_one_logger_compat.forget_configuration()
    provider = telemetry_jit.configure("benchmark", file=folder / "hooks.jsonl")
    hooked, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
    telemetry = next(cb for cb in hooked(**QUIET_TRAINER).callbacks if isinstance(cb, _Telemetry))
    empty = NoOpHooks()
    ours, clock = TimedHooks(telemetry), TimedHooks(empty)

    class Timed(hooked):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(callbacks=[empty], **kwargs)

    timed_fit(Timed, 50)
    ours.reset()
    clock.reset()
    times = timed_fit(Timed, args.profile_steps)
    still_recording("HookedTrainer")
    callback.on_app_end()
    step_us = times["steps"] / (args.profile_steps - 1) * 1e6
    print(f"hooks timed in place, one {args.profile_steps}-step fit ({step_us:.1f} us a step, hooked):")
    total = 0.0
    for name in TimedHooks.HOOKS:
        us, own = (ours.ns[name] - clock.ns[name]) / args.profile_steps / 1e3, clock.ns[name] / args.profile_steps / 1e3
        total += us
        print(f"  {name:24s} {us:6.2f} us a step (the clock's own {own:.2f} us taken off)")
    print(f"  both: {total:.2f} us a step = {100 * total / step_us:.2f}% of the step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile-steps", type=int, default=20_000)
    parser.add_argument("--skip-fits", action="store_true", help="only the sampling share")
    parser.add_argument("--top", type=int, default=12, help="functions listed under the sampling share")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    with tempfile.TemporaryDirectory() as folder:
        if args.child is not None:
            child(args.child[0], args.profile_steps, Path(args.child[1]))
            return
        print(f"torch {torch.__version__}, lightning {pl.__version__}, pid {os.getpid()}")
        if not args.skip_fits:
            paired_fits(args, Path(folder))
        sampling_share(args, Path(folder))
        hooks_timed(args, Path(folder))


if __name__ == "__main__":
    main()
