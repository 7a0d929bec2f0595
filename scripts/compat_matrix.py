#!/usr/bin/env python3
"""Run the test suite on every supported torch (and lightning) release and write docs/compatibility.md.

One virtual environment per torch version, isolated from this Python's packages: torch from the
package index (a CUDA build where no CPU wheel is on disk: it imports and runs on CPU), then this
package with its thunder and test extras. The suite runs once per lightning release in it. A
cell's result, the exact versions it ran and what its skipped tests say it lacks go into the table.

    python3 scripts/compat_matrix.py                        # every cell (about 10 minutes a torch)
    python3 scripts/compat_matrix.py --torch 2.8.0 2.15.0   # some of them; the table keeps the rest
    python3 scripts/compat_matrix.py --torch 2.15.0 --lightning 2.6.6 --keep -- -k thunder
    python3 scripts/compat_matrix.py --python 3.10 3.13 --torch 2.8.0 2.15.0   # the Python axis

pip on some machines caps torch with a constraints file; each environment passes its own
(``PIP_CONSTRAINT`` naming ``torch==X``) so any release can be installed. Environments live under
``--envs`` (default ``.matrix/``) and are deleted after their cell unless ``--keep``: each holds
about 7 GB with its CUDA libraries.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH_RELEASES = ("2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
LIGHTNING_RELEASES = ("2.5.6", "2.6.6")
RESULTS = ROOT / "docs" / "compatibility.json"
TABLE = ROOT / "docs" / "compatibility.md"
TRACEBACK_CHARS = 3000  # of each failed test's, printed: CI keeps the printout, not the environment
PACKAGES = (
    "torch",
    "lightning",
    "lightning-thunder",
    "nv-one-logger-training-telemetry",
    "opentelemetry-sdk",
    "pytest",
)


def run(command: list[str], log: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> int:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        try:
            return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"timed out after {timeout} s\n")
            return 124


def interpreter(version: str) -> str:
    """The Python ``version`` (``3.10``): this one, one on PATH, or one pyenv holds."""
    if version == platform.python_version() or platform.python_version().startswith(f"{version}."):
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}"))
    if candidates:
        return str(candidates[-1])
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found:  # a pyenv shim runs only where that version is selected
        return found
    raise SystemExit(f"no Python {version} found (looked in {pyenv} and on PATH)")


def build_environment(python_exe: str, torch_version: str, env_dir: Path, log: Path) -> dict[str, str] | None:
    """A fresh environment of ``python_exe`` holding torch ``torch_version`` and this package; ``None`` if
    it failed."""
    python = env_dir / "bin" / "python"
    pin = env_dir.parent / f"constraints-{torch_version}.txt"
    env = {**os.environ, "PIP_CONSTRAINT": str(pin), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    pin.write_text(f"torch=={torch_version}\n")
    steps = [[str(python), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[otlp,thunder,test]"]]
    if not (python.exists() and installed_versions(python).get("torch", "").split("+")[0] == torch_version):
        shutil.rmtree(env_dir, ignore_errors=True)  # not one kept from an earlier run (--keep)
        steps[:0] = [
            [python_exe, "-m", "venv", str(env_dir)],
            [str(python), "-m", "pip", "install", "--quiet", f"torch=={torch_version}"],
        ]
    for step in steps:
        if run(step, log, env) != 0:
            return None
    return env


def installed_versions(python: Path) -> dict[str, str]:
    script = (
        "import json, importlib.metadata as m\n"
        f"names = {list(PACKAGES)!r}\n"
        "found = {}\n"
        "for name in names:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: pass\n"
        "import torch; found['torch'] = torch.__version__\n"
        "import platform; found['python'] = platform.python_version()\n"
        "print(json.dumps(found))\n"
    )
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def thunder_status(python: Path) -> str:
    """``"imports"`` or the error ``import_thunder`` gives on this torch."""
    script = "from telemetry_jit.compat.thunder import import_thunder\nimport_thunder()\n"
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=ROOT)
    if result.returncode == 0:
        return "imports"
    lines = [line for line in result.stderr.strip().splitlines() if "Error" in line]
    return lines[-1] if lines else result.stderr.strip()[-300:]


def run_suite(python: Path, env: dict[str, str], report: Path, log: Path, pytest_args: list[str]) -> dict:
    started = time.monotonic()
    command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *pytest_args]
    with log.open("a") as out:
        returncode = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return {
        **parse_junit(report),
        "returncode": returncode,
        "minutes": round((time.monotonic() - started) / 60, 1),
    }


def parse_junit(report: Path) -> dict:
    """Counts, failed test names (with the end of each one's traceback) and skip reasons from pytest's JUnit XML
    report."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failed, skipped, tracebacks = [], {}, {}
    if report.exists():
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                counts["failed" if problem.tag == "failure" else "errors"] += 1
                failed.append(name)
                tracebacks[name] = (problem.text or problem.get("message") or "")[-TRACEBACK_CHARS:]
            elif (skip := case.find("skipped")) is not None:
                counts["skipped"] += 1
                reason = (skip.get("message") or "").removeprefix("Skipped: ")
                skipped[reason] = skipped.get(reason, 0) + 1
            else:
                counts["passed"] += 1
    return {**counts, "failed_tests": failed, "skip_reasons": skipped, "tracebacks": tracebacks}


def run_cell(
    python_version: str, torch_version: str, lightnings: list[str], envs: Path, keep: bool, pytest_args: list[str]
) -> list[dict]:
    name = f"py{python_version}-torch-{torch_version}"
    env_dir = envs / name
    log = envs / f"{name}.log"
    log.unlink(missing_ok=True)
    label = f"Python {python_version}, torch {torch_version}"
    print(f"{label}: building {env_dir} (log: {log})", flush=True)
    env = build_environment(interpreter(python_version), torch_version, env_dir, log)
    results = []
    if env is None:
        print(f"{label}: could not build the environment, see {log}", flush=True)
        return [
            {"python": python_version, "torch": torch_version, "lightning": lightning, "error": "install failed"}
            for lightning in lightnings
        ]
    python = env_dir / "bin" / "python"
    for lightning in lightnings:
        pins = [f"lightning=={lightning}", f"pytorch-lightning=={lightning}"]
        if run([str(python), "-m", "pip", "install", "--quiet", *pins], log, env) != 0:
            results.append(
                {
                    "python": python_version,
                    "torch": torch_version,
                    "lightning": lightning,
                    "error": "lightning install failed",
                }
            )
            continue
        versions = installed_versions(python)
        thunder = thunder_status(python)
        print(f"{label} + lightning {lightning}: running the suite", flush=True)
        outcome = run_suite(python, env, envs / f"{name}-lightning-{lightning}.xml", log, pytest_args)
        tracebacks = outcome.pop("tracebacks")
        if outcome["failed_tests"]:
            print(f"{label} + lightning {lightning}: failed: {', '.join(outcome['failed_tests'])}", flush=True)
            # the environment and its log are gone when CI reads this: the end of each traceback is all it keeps
            for name, traceback in tracebacks.items():
                print(f"--- {name}\n{traceback}", flush=True)
        print(
            f"{label} + lightning {lightning}: {outcome['passed']} passed, {outcome['failed']} failed, "
            f"{outcome['errors']} errors, {outcome['skipped']} skipped ({outcome['minutes']} min)",
            flush=True,
        )
        results.append(
            {
                "python": versions.get("python", python_version),
                "torch": torch_version,
                "lightning": lightning,
                "versions": versions,
                "thunder": thunder,
                "date": datetime.date.today().isoformat(),
                "commit": git_commit(),
                "pytest_args": pytest_args,
                **outcome,
            }
        )
    if not keep:
        shutil.rmtree(env_dir, ignore_errors=True)
    return results


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(  # the table this script writes is no change to what it tests
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/compatibility.*"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return result.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def write_table(cells: list[dict]) -> None:
    def order(cell: dict) -> tuple:
        release = tuple(int(p) for p in python_of(cell).split(".")[:2])
        return tuple(int(p) for p in cell["torch"].split(".")), cell["lightning"], release

    lines = [
        "# Compatibility",
        "",
        "Written by `python3 scripts/compat_matrix.py` (do not edit by hand): the full test suite in a fresh",
        "virtual environment per Python and torch release, once per lightning release. torch comes from the",
        f"package index (CUDA builds run on this CPU-only machine, {platform.machine()}). A cell holds what ran at",
        "the commit it names; a cell from an older commit says so in that column.",
        "",
        "Everything telemetry-jit reads beyond a package's public API goes through one adapter per package:",
        "`telemetry_jit/compat/torch.py` (compile callbacks, CompilationMetrics fields, dynamo's counters,",
        "the log records that name graph-break locations and DDPOptimizer buckets, the frame of a compile in",
        "progress), `telemetry_jit/compat/nv_one_logger.py` and `telemetry_jit/compat/thunder.py`. A fact a",
        "torch release does not expose is listed by `telemetry_jit.compat.torch.UNAVAILABLE`, warned about",
        "once and named on every compilation span as `compile.unavailable`. To support a new torch release:",
        "add it to `TORCH_RELEASES` in `scripts/compat_matrix.py`, run the script for it, and fix what fails",
        "in the torch adapter.",
        "",
        "| Python | torch | lightning | thunder | passed | failed | skipped | ran | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in sorted(cells, key=order):
        if "error" in cell:
            lines.append(f"| {python_of(cell)} | {cell['torch']} | {cell['lightning']} | | | {cell['error']} | | | |")
            continue
        versions = cell["versions"]
        thunder = versions.get("lightning-thunder", "-") if cell["thunder"] == "imports" else "does not import"
        lines.append(
            f"| {python_of(cell)} | {versions.get('torch', cell['torch'])} "
            f"| {versions.get('lightning', cell['lightning'])} | {thunder} "
            f"| {cell['passed']} | {cell['failed'] + cell['errors']} | {cell['skipped']} | {cell['date']} "
            f"| {cell['commit']} |"
        )
    lines += ["", "## What each cell lacks", ""]
    for cell in sorted(cells, key=order):
        if "error" in cell:
            continue
        notes = [f"{count} skipped: {reason}" for reason, count in sorted(cell["skip_reasons"].items())]
        notes += [f"failed: {name}" for name in cell["failed_tests"]]
        if cell["thunder"] != "imports":
            notes.insert(0, f"thunder: {cell['thunder']}")
        if cell.get("note"):
            notes.insert(0, cell["note"])
        if cell.get("pytest_args"):
            notes.insert(0, f"ran with pytest arguments {' '.join(cell['pytest_args'])}")
        lines.append(
            f"- Python {python_of(cell)}, torch {cell['torch']}, lightning {cell['lightning']}: "
            + ("; ".join(notes) or "nothing")
        )
    shown = ("python", "torch", "lightning")
    other = sorted({name for cell in cells for name in cell.get("versions", {}) if name not in shown})
    lines += ["", "Other packages, as installed (newest that pip resolved):", ""]
    for name in other:
        seen = sorted({cell["versions"][name] for cell in cells if name in cell.get("versions", {})})
        lines.append(f"- {name}: {', '.join(seen)}")
    TABLE.write_text("\n".join(lines) + "\n")


def python_of(cell: dict) -> str:
    """The cell's Python; cells recorded before the Python axis ran on this image's 3.11.7."""
    return cell.get("python") or cell.get("versions", {}).get("python") or "3.11.7"


def cell_key(cell: dict) -> tuple[str, str, str]:
    return ".".join(python_of(cell).split(".")[:2]), cell["torch"], cell["lightning"]


def record(result: dict) -> None:
    """Put one cell's result into docs/compatibility.json and rewrite the table (several runs of
    this script may record at once: each cell is merged into the file under a lock)."""
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cells = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        cells = [c for c in cells if cell_key(c) != cell_key(result)]
        RESULTS.write_text(json.dumps([*cells, result], indent=1) + "\n")
        write_table([*cells, result])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", nargs="+", default=[".".join(platform.python_version_tuple()[:2])], metavar="VERSION"
    )
    parser.add_argument("--torch", nargs="+", default=list(TORCH_RELEASES), metavar="VERSION")
    parser.add_argument("--lightning", nargs="+", default=list(LIGHTNING_RELEASES), metavar="VERSION")
    parser.add_argument("--envs", type=Path, default=ROOT / ".matrix", help="where the environments are built")
    parser.add_argument("--keep", action="store_true", help="keep each environment (about 7 GB) for a rerun")
    parser.add_argument(
        "--no-record", action="store_true", help="leave docs/compatibility.* alone (CI: only the exit status counts)"
    )
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args(argv)
    failed = False
    for python_version in args.python:
        for torch_version in args.torch:
            cells = run_cell(
                python_version, torch_version, args.lightning, args.envs.resolve(), args.keep, args.pytest_args
            )
            for result in cells:
                failed |= "error" in result or result["failed"] + result["errors"] > 0 or result["passed"] == 0
                if not args.no_record:
                    record(result)
    if not args.no_record:
        print(f"wrote {TABLE.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
