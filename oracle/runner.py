"""Each model of the zoo trained in a child process of its own (``oracle.run``), with torch's structured trace on,
then judged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from oracle.judge import Fact, judge

ROOT = Path(__file__).resolve().parent.parent


def run_one(name: str, backend: str, out: Path, timeout: float) -> list[Fact]:
    """Train ``name`` in a child process and judge what telemetry-jit said about it."""
    failed = train_one(name, backend, out, timeout)
    return [Fact(f"{name} ({backend})", "run", None, "", failed)] if failed else judge(out, ROOT)


def train_one(name: str, backend: str, out: Path, timeout: float, fix: dict[str, Any] | None = None) -> str:
    """Train ``name`` in a child process (with ``fix``'s change: ``oracle.run``); why it failed, or ``""``."""
    env = {
        **os.environ,
        "TORCH_TRACE": str(out / "trace"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "run.log", "w") as log:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "oracle.run", name, backend, str(out), *([json.dumps(fix)] if fix else [])],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return f"did not finish within {timeout:.0f} s"
    if done.returncode or not (out / "truth.json").exists():
        return f"exit {done.returncode}: see {out / 'run.log'}"
    return ""
