"""What reading torch's shape decisions costs a compile: the ShapeEnv's INFO lines (create_symbol, set_replacement)
that :func:`telemetry_jit.probes.log_taps.shape_decision_log` opens and reads, against the whole compile, both timed
by one profiler inside one process (compile times of one model vary by more than the share between processes).

    python benchmarks/shape_decisions_cost.py [--backend aot_eager] [--rounds 2]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch
from lightning.pytorch.demos import Transformer

from telemetry_jit.probes.log_taps import shape_decision_log


def compile_once(model: torch.nn.Module, x: torch.Tensor, backend: str, tap: bool) -> tuple[float, float]:
    """(the profiled compile's seconds, of which in logging's record path), compiled dynamic from an empty cache."""
    torch._dynamo.reset()
    log = shape_decision_log()
    if tap:
        log.install()
    profile = cProfile.Profile()
    profile.enable()
    torch.compile(model, backend=backend, dynamic=True)(x, x).sum().backward()
    profile.disable()
    if tap:
        log.uninstall()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in stats.values())
    logging_s = sum(row[3] for key, row in stats.items() if key[2] == "_log" and "logging" in key[0])
    return total, logging_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Transformer(vocab_size=100, ninp=64, nhead=4, nhid=128, nlayers=2)
    x = torch.randint(0, 100, (8, 24))
    compile_once(model, x, args.backend, tap=False)  # imports and first-use costs out of the rounds
    for _ in range(args.rounds):
        for tap in (False, True):
            total, logging_s = compile_once(model, x, args.backend, tap)
            print(f"tap={tap}: compile {total:.2f} s, logging {logging_s * 1000:.0f} ms ({logging_s / total:.2%})")


if __name__ == "__main__":
    main()
