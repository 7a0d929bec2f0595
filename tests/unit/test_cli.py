"""``cli``: the commands, from standard input and on the light install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry_jit.cli import main
from tests.planted import THINGS, as_it_was, planted

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


@pytest.mark.parametrize("command", ["report", "trace"])
@pytest.mark.parametrize("thing", THINGS)
def test_an_output_path_holding_what_telemetry_jit_did_not_write_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, thing: str
) -> None:
    output = tmp_path / "out"
    with planted(output, thing) as words:
        before = as_it_was(output)
        assert main([command, str(NEW), "-o", str(output)]) == 2
        assert as_it_was(output) == before
    said = capsys.readouterr()
    assert f"will not write over '{output}' is {words}" in said.err and "wrote" not in said.out
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


@pytest.mark.parametrize("command", ["report", "trace"])
def test_the_default_output_beside_the_input_is_refused_where_a_users_file_lies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    run = tmp_path / "run.jsonl"
    run.write_bytes(NEW.read_bytes())
    beside = tmp_path / ("run.html" if command == "report" else "run.trace.json")
    beside.write_text("the user's own\n")
    assert main([command, str(run)]) == 2
    assert beside.read_text() == "the user's own\n"
    assert f"will not write over '{beside}' is a file that telemetry-jit did not write" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "trace"])
def test_its_own_earlier_output_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    output = tmp_path / "out"
    assert main([command, str(NEW), "-o", str(output)]) == 0
    first = output.stat().st_ino
    assert main([command, str(NEW), "-o", str(output)]) == 0
    assert output.stat().st_ino != first  # written whole beside it and renamed over its own earlier file
    assert f"wrote {output}" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["report", "trace"])
def test_dash_as_the_output_writes_standard_output(tmp_path: Path, command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "telemetry_jit", command, str(NEW), "-o", "-"],
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []  # no file named "-"
    if command == "report":
        assert result.stdout.startswith(b"<!doctype html>") and result.stdout.endswith(b"</html>")
    else:
        assert json.loads(result.stdout)["otherData"]["producer"] == "telemetry-jit"
    assert b"wrote standard output" in result.stderr
