"""Per-call cost of reading thunder.compile_stats for a thunder-compiled module (prints figures).

    python benchmarks/thunder_stats_overhead.py [--calls 2000]

In one run: the median time of a call through telemetry-jit's wrapper (which checks the cache-miss
count after every call) and of the same call with the check skipped, on a small compiled Linear.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from telemetry_jit.compilers import compile_with_thunder


def per_call_us(call, x: torch.Tensor, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        call(x)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    module = torch.nn.Linear(16, 16)
    checked = compile_with_thunder(module, "linear")
    x = torch.randn(8, 16)
    with torch.no_grad():
        checked(x)  # compile
        unchecked = checked.call_thunder  # the same call without the compile-stats check
        rounds = {"checked": [], "unchecked": []}
        for _ in range(5):  # interleaved so machine noise hits both
            rounds["unchecked"].append(per_call_us(unchecked, x, args.calls))
            rounds["checked"].append(per_call_us(checked, x, args.calls))
    checked.function.take_records()
    on, off = statistics.median(rounds["checked"]), statistics.median(rounds["unchecked"])
    print(f"torch {torch.__version__}, {args.calls} calls x 5 rounds, median per call")
    print(f"thunder call without the compile-stats check: {off:8.2f} us")
    print(f"thunder call with the compile-stats check:    {on:8.2f} us")
    print(f"added per compiled module per call:           {on - off:8.2f} us")


if __name__ == "__main__":
    main()
