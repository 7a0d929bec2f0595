"""What recording the compile caches' keys and parts costs torch's compiling, as a share measured in one run
(prints figures; not a test). Paired whole runs cannot resolve it: cold inductor compile times of one fit
vary by ±10 % between processes on a shared machine.

    python benchmarks/cache_parts_cost.py          # cold: an empty TORCHINDUCTOR_CACHE_DIR
    python benchmarks/cache_parts_cost.py --warm   # the same folder after a first run: every graph a hit

The answers' model (``tests/e2e/lm.py``) with inductor under ``HookedTrainer``; timed inside it: the parts
AOTAutograd computes because telemetry-jit opened its logger to DEBUG (torch 2.13 and later), and
telemetry-jit's reading of every look-up; the share is of torch's own compile time in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
import lightning.pytorch as pl, torch
torch.set_num_threads(1)
import torch._functorch._aot_autograd.autograd_cache as aot_cache
import telemetry_jit
from telemetry_jit.compat import compile_cache
from tests.e2e.dynamo_facts import compiles_recorded_by_torch
from tests.e2e import lm

spent = {{"aot_autograd_parts_s": 0.0, "reading_s": 0.0}}

def timed(name, function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
    return wrapper

if hasattr(aot_cache, "_get_debug_lines_for_cache_key"):  # torch 2.13+; torch 2.8 computes them always
    aot_cache._get_debug_lines_for_cache_key = timed("aot_autograd_parts_s", aot_cache._get_debug_lines_for_cache_key)
compile_cache._tell = timed("reading_s", compile_cache._tell)
config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "inductor"}})
provider = telemetry_jit.configure("cache-parts-cost", file={path!r})
trainer_cls, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config, live=False)
trainer = trainer_cls(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(lm.LanguageModel(), lm.tokens(30, 16, 8), lm.tokens(16, 24, 8, seed=1))
compile_s = sum(m.duration_us for m in compiles_recorded_by_torch()) / 1e6
print(json.dumps({{**spent, "compile_s": compile_s, "share": sum(spent.values()) / compile_s}}))
"""


def run(folder: Path, cache: Path) -> dict[str, float]:
    script = CHILD.format(root=str(ROOT), path=str(folder / "run.jsonl"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", action="store_true", help="measure a second run against the first one's cache")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "cache"
        figures = run(Path(folder), cache)
        if args.warm:
            figures = run(Path(folder), cache)
    print(
        f"{'warm' if args.warm else 'cold'}: torch compiled for {figures['compile_s']:.2f} s; AOTAutograd's parts "
        f"{figures['aot_autograd_parts_s'] * 1000:.0f} ms, reading the look-ups {figures['reading_s'] * 1000:.0f} ms: "
        f"{100 * figures['share']:.2f} % of compiling"
    )


if __name__ == "__main__":
    main()
