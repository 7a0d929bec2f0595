"""A compile killed by the kernel's OOM killer inside a memory-limited cgroup, and telemetry-jit's warning said
before the kill (prints what happened; needs root and a writable memory cgroup, v1 or v2).

    python scripts/compile_oom_in_cgroup.py

It makes a child cgroup of this process's own memory cgroup (never touching the limits above it), starts a
process in it that readies a Lightning fit of a wide model under telemetry-jit, then limits the cgroup to the
memory that process uses now plus 256 MB and lets it fit. The model is compiled with a backend that allocates
host memory (8 MB every 25 ms, touched) for as long as the compile runs, as a compiler's appetite would: the
compile grows until the OOM killer ends the process. Printed: the limit, the cgroup's OOM count, how the process
ended, the warning it wrote to stderr and when, and what its run file holds. The cgroup is removed afterwards.
Exits 0 when the warning was said and the process was killed; 2 where no cgroup could be made (the reason).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADROOM = 256 * 2**20  # the cgroup's limit: what the process uses when the fit starts, plus this

CHILD = """
import sys, time, warnings
sys.path.insert(0, {root!r})
import lightning.pytorch as pl, torch
import torch._inductor.config  # names inductor's compile workers in the warning, as an inductor job would
import telemetry_jit
from tests.models import TRAINER_DEFAULTS, Net, loader

def hungry(gm, example_inputs):
    held = []
    while True:  # a compile that takes memory until the kernel ends it
        held.append(bytearray(b"\\x01") * (8 * 2**20))
        time.sleep(0.025)

def said(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(f"[{{time.time():.3f}}] {{category.__name__}}: {{message}}\\n")
    sys.stderr.flush()

warnings.simplefilter("always")
warnings.showwarning = said
provider = telemetry_jit.configure("oom", file={path!r}, global_batch_size=4)
model = Net(width=1024, layers=4)
model.model.compile(backend=hungry)
HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
trainer = HookedTrainer(max_epochs=1, limit_train_batches=2, **TRAINER_DEFAULTS)
print("ready", flush=True)
sys.stdin.readline()  # the cgroup's limit is set now
print(f"fit starts {{time.time():.3f}}", flush=True)
trainer.fit(model, loader(8, 4, features=1024))
print("fit ended", flush=True)
"""


def own_memory_cgroup() -> tuple[Path, str, str] | str:
    """This process's memory cgroup folder, its limit file and its usage file; or why there is none."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory" + path), "memory.limit_in_bytes", "memory.usage_in_bytes"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            return Path("/sys/fs/cgroup" + path), "memory.max", "memory.current"
    return "no memory cgroup controller in /proc/self/cgroup"


def make_cgroup() -> tuple[Path, str, str] | str:
    """A child cgroup of this process's own memory cgroup, or why none can be made."""
    found = own_memory_cgroup()
    if isinstance(found, str):
        return found
    parent, limit, usage = found
    folder = parent / f"telemetry-jit-oom-{os.getpid()}"
    try:
        folder.mkdir()
    except OSError as error:
        return f"cannot make a cgroup under {parent}: {error}"
    if not (folder / limit).exists():
        folder.rmdir()
        return f"{parent} has no {limit}: the memory controller is not enabled for its children"
    return folder, limit, usage


def main() -> int:
    made = make_cgroup()
    if isinstance(made, str):
        print(f"skipped: {made}")
        return 2
    folder, limit_file, usage_file = made
    process = None
    try:
        with tempfile.TemporaryDirectory() as temporary:
            run_file = f"{temporary}/run.jsonl"
            procs = str(folder / "cgroup.procs")

            def join() -> None:  # in the child, before it runs python: it and all it starts are in the cgroup
                Path(procs).write_text(str(os.getpid()))

            process = subprocess.Popen(
                [sys.executable, "-c", CHILD.format(root=str(ROOT), path=run_file)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=join,
                env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "2"},
            )
            assert process.stdin is not None and process.stdout is not None
            ready = process.stdout.readline().strip()
            if ready != "ready":
                process.wait(60)
                print(f"the process did not get ready: {process.stderr.read()[-3000:] if process.stderr else ''}")
                return 1
            using = int((folder / usage_file).read_text())
            limit = using + HEADROOM
            for name in (limit_file, "memory.memsw.limit_in_bytes", "memory.swap.max"):  # no swap to escape to
                if (folder / name).exists():
                    (folder / name).write_text(str(limit if name != "memory.swap.max" else 0))
            print(f"cgroup {folder}: {using / 2**20:.0f} MB in use, limit set to {limit / 2**20:.0f} MB")
            process.stdin.write("go\n")
            process.stdin.flush()
            out, err = process.communicate(timeout=120)
            ended = time.time()
            code = process.returncode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
            print(f"process ended at {ended:.3f}: {how}")
            oom = folder / "memory.oom_control"
            events = folder / "memory.events"
            for counters in (oom, events):
                if counters.exists():
                    kills = [line for line in counters.read_text().splitlines() if line.startswith("oom_kill")]
                    print(f"{counters.name}: {', '.join(kills) or counters.read_text().strip()}")
            print("its stdout:", *out.strip().splitlines(), sep="\n  ")
            warned = [line for line in err.splitlines() if "telemetry-jit" in line]
            print("its telemetry-jit warnings (stderr):", *warned, sep="\n  ")
            lines = Path(run_file).read_text().splitlines() if Path(run_file).exists() else []
            print(f"its run file: {len(lines)} record(s)", *[line[:300] for line in lines], sep="\n  ")
            near = any("TORCHINDUCTOR_COMPILE_THREADS" in line for line in warned)
            return 0 if near and code == -signal.SIGKILL else 1
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        for _ in range(50):  # a killed process leaves its cgroup a moment after it is reaped
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
