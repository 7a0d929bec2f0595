"""What measuring each compile's resources costs (prints figures; not a test): the CPU time of the meter's
readings at each compile's start and end (torch's compile callbacks) and of its sampler thread while compiles
run, as a share of torch's compile time in the same run. Nothing of it runs per training step.

    python benchmarks/compile_resources_cost.py            # a cold inductor fit (an empty cache folder)
    python benchmarks/compile_resources_cost.py aot_eager  # an aot_eager fit: compiles of tens of milliseconds

Each fit runs in a fresh process: ``tests/models.py``'s ``Net`` under ``HookedTrainer``, the meter's ``begin``
and ``end`` timed inside it, the sampler thread's CPU time read from ``/proc/self/task/<tid>/schedstat``
(nanoseconds), the compile time from the run's ``compilation`` spans.
"""

from __future__ import annotations

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
import telemetry_jit
from telemetry_jit.recording.resources import ResourceMeter
from tests.models import TRAINER_DEFAULTS, Net, loader

spent = {{"windows": [], "window_s": 0.0}}
meters = []

def timed(function):
    def wrapper(self, *args):
        started = time.thread_time()
        try:
            return function(self, *args)
        finally:
            cost = time.thread_time() - started
            spent["window_s"] += cost
            if function.__name__ == "begin":
                spent["windows"].append(cost)
            else:
                spent["windows"][-1] += cost
            if self not in meters:
                meters.append(self)
    return wrapper

ResourceMeter.begin = timed(ResourceMeter.begin)
ResourceMeter.end = timed(ResourceMeter.end)
provider = telemetry_jit.configure("cost", file={path!r}, global_batch_size=4)
model = Net(width=64, layers=4)
model.model.compile(backend={backend!r})
HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(40, 4, features=64), loader(8, 4, features=64))
thread = meters[0]._thread
sampler_s = int(open(f"/proc/self/task/{{thread.native_id}}/schedstat").read().split()[0]) / 1e9
telemetry_jit.shutdown()
run = telemetry_jit.read_telemetry({path!r})[-1]
compile_s = sum(s.duration_ms for s in run.find("compilation")) / 1000
processes = sum(name.isdigit() for name in __import__("os").listdir("/proc"))
print(json.dumps(dict(spent, sampler_s=sampler_s, compile_s=compile_s, processes=processes)))
"""


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "inductor"
    with tempfile.TemporaryDirectory() as folder:
        script = CHILD.format(root=str(ROOT), path=f"{folder}/run.jsonl", backend=backend)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor"}
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    windows, compile_s = len(figures["windows"]), figures["compile_s"]
    costs = sorted(figures["windows"])
    measuring = figures["window_s"] + figures["sampler_s"]
    print(f"backend {backend}: {windows} compiles, {compile_s:.3f} s of compiling ({figures['processes']} processes)")
    print(
        f"  readings at start and end (CPU): {costs[len(costs) // 2] * 1e6:.0f} us a compile (median), "
        f"{figures['windows'][0] * 1e6:.0f} us the first (it starts the sampler thread)"
    )
    print(f"  sampler thread: {figures['sampler_s'] * 1000:.1f} ms of CPU")
    print(f"  measuring: {measuring * 1000:.1f} ms = {100 * measuring / compile_s:.2f} % of the compile time")


if __name__ == "__main__":
    main()
