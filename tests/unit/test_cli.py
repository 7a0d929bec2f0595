"""``cli``: the commands, from standard input and on the light install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_torch


DATA = Path(__file__).resolve().parents[1] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


ROOT = Path(__file__).resolve().parents[2]


RECORDED = ROOT / "tests" / "data" / "answers.jsonl"


TRAINING = ("torch", "lightning", "nv_one_logger", "opentelemetry", "thunder", "typing_extensions")


_NOTHING_INSTALLED = """
import sys
sys.path[:0] = [sys.argv[1]]  # the package's own folder; python -S: no site-packages, nothing installed
from telemetry_jit.cli import main
code = main(sys.argv[3:])
loaded = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[2].split(",")))
print("LOADED", loaded, file=sys.stderr)
sys.exit(code)
"""


def test_dash_reads_standard_input() -> None:
    with NEW.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "telemetry_jit", "summary", "-"], stdin=stdin, capture_output=True, text=True
        )
    assert done.returncode == 0 and "recompiles by cause" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["check", str(RECORDED), "--max-graph-breaks", "50", "--max-recompiles", "50"],
        ["summary", str(RECORDED)],
        ["diff", str(RECORDED), str(RECORDED)],
    ],
)
def test_the_gate_runs_with_no_third_party_package_at_all(command: list[str]) -> None:
    ran = subprocess.run(
        [sys.executable, "-S", "-c", _NOTHING_INSTALLED, str(ROOT), ",".join(TRAINING), *command],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "LOADED []" in ran.stderr  # nothing of the training side was imported


def test_the_light_install_is_documented_and_run_in_ci() -> None:
    command = "pip install --no-deps telemetry-jit"
    assert command in (ROOT / "docs" / "ci-gate.md").read_text()
    assert command in (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert '"$work/bare/bin/telemetry-jit" check' in ci  # the console script of a --no-deps install
