"""Does recording make torch compile slower? torch's own compile time with and without telemetry, in
fresh processes (prints figures; not a test).

    python benchmarks/compile_time.py [--rounds 8]

Each round runs the same training twice, each in a fresh process (nothing cached between them, the
order alternating from round to round): a plain Lightning ``Trainer`` with ``JitTransform`` alone, and
``HookedTrainer`` with the same ``JitConfig``, recording everything (spans, causes, graph-break stacks,
first steps) to a file. The model is the one the answers are tested on (``tests/e2e/lm.py``: the demo
Transformer, graph breaks inside torch and in the user's code, 11 recompiles), compiled with
``aot_eager`` so that inductor's cache cannot favour the second process. Reported: the median over rounds
of the ratio hooked / plain of torch's compile time (the sum of its CompilationMetrics durations) and of
the fit's wall time, with quartiles.

``--backend inductor`` measures what recording the compile caches' keys and parts adds (cold: each process
its own empty ``TORCHINDUCTOR_CACHE_DIR``; ``--warm``: one folder filled before the first round, every
graph a hit, where the parts' share of compiling is largest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
import lightning.pytorch as pl, torch
torch.set_num_threads(1)
import telemetry_jit
from tests.e2e.dynamo_facts import compiles_recorded_by_torch
from tests.e2e import lm

config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": {backend!r}}})
arguments = dict(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                 enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
if {hooked!r}:
    provider = telemetry_jit.configure("compile-time", file={path!r})
    trainer_cls, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config, live=False)
    trainer = trainer_cls(**arguments)
else:
    trainer = pl.Trainer(callbacks=[telemetry_jit.JitTransform(config)], **arguments)
started = time.perf_counter()
trainer.fit(lm.LanguageModel(), lm.tokens(30, 16, 8), lm.tokens(16, 24, 8, seed=1))
wall = time.perf_counter() - started
compiles = compiles_recorded_by_torch()
compile_s = sum(m.duration_us for m in compiles) / 1e6
print(json.dumps({{"compile_s": compile_s, "wall_s": wall, "compiles": len(compiles)}}))
"""


def run(hooked: bool, folder: Path, backend: str, cache: Path | None) -> dict[str, float]:
    stamp = time.time_ns()
    script = CHILD.format(root=str(ROOT), hooked=hooked, path=str(folder / f"run-{stamp}.jsonl"), backend=backend)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache or folder / f"cache-{stamp}")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--backend", default="aot_eager", help="aot_eager (default) or inductor")
    parser.add_argument("--warm", action="store_true", help="inductor: every process against one filled cache")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {"compile_s": [], "wall_s": []}
    compiles = set()
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "warm-cache" if args.warm else None
        if cache is not None:
            run(False, Path(folder), args.backend, cache)  # fills it
        for index in range(args.rounds):
            order = [False, True] if index % 2 == 0 else [True, False]
            figures = {hooked: run(hooked, Path(folder), args.backend, cache) for hooked in order}
            compiles.update((figures[False]["compiles"], figures[True]["compiles"]))
            for name in ratios:
                ratios[name].append(figures[True][name] / figures[False][name])
            print(f"  round {index + 1}: plain {figures[False]}, hooked {figures[True]}", flush=True)
    if len(compiles) != 1:
        raise SystemExit(f"the two compiled differently ({sorted(compiles)} compilations): the figures are invalid")
    print(
        f"{args.rounds} paired rounds ({args.backend}{', warm' if args.warm else ''}), {compiles.pop()} compilations "
        "each; hooked / plain (median [quartiles]):"
    )
    for name, values in ratios.items():
        low, _, high = statistics.quantiles(values, n=4)
        print(f"  {name:10s} {statistics.median(values):.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
