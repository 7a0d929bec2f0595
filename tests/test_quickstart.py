"""The README's main job: the quickstart trains with inductor and prints a summary of real telemetry."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit import cli
from tests.conftest import needs_thunder

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_quickstart_runs_end_to_end_on_inductor(tmp_path: Path) -> None:
    out = tmp_path / "quickstart.jsonl"
    result = run_example("quickstart.py", out, "--epochs", "2")
    assert "telemetry-jit summary" in result.stdout
    assert "graph breaks:" in result.stdout and "quickstart.py" in result.stdout

    (run,) = telemetry_jit.read_telemetry(out)
    compiles = run.find("compilation")
    assert compiles and all(s.attributes["compile.backend"] == "inductor" for s in compiles)
    forward = [s for s in compiles if s.attributes["compile.trigger"] == "dynamo"]
    assert all("compile.time.backend_s" in s.attributes for s in forward)  # inductor_s only on a cache miss
    assert any(s.attributes["compile.is_recompile"] for s in compiles)  # the short last batch
    breaks = [e for s in compiles for e in s.events if e.name == "graph_break"]
    assert breaks and all("quickstart.py" in e.attributes["graph_break.location"] for e in breaks)
    (app,) = run.find("application")
    assert app.end_unix_ns is not None


@needs_thunder
def test_thunder_example_writes_thunder_compile_spans(tmp_path: Path) -> None:
    out = tmp_path / "thunder.jsonl"
    result = run_example("thunder_quickstart.py", out, "--epochs", "1")
    assert "thunder cache:" in result.stdout
    (run,) = telemetry_jit.read_telemetry(out)
    spans = run.find("compilation")
    assert {s.attributes["compile.frame"] for s in spans} == {"block0", "block1"}
    assert all(s.attributes["compile.source"] == "thunder" for s in spans)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No telemetry file"),
        ("", "is empty"),
        ('{"hello": 1}\n', "not a telemetry-jit file"),
        ('{"kind": "span", "run": "r"}\n', "line 1: malformed 'span' record"),
    ],
    ids=["missing", "empty", "foreign", "malformed"],
)
def test_cli_summary_says_what_is_wrong_with_a_file(content: str | None, message: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "telemetry.jsonl"
    if content is not None:
        path.write_text(content)
    assert cli.main(["summary", str(path)]) == 1
    assert message in capsys.readouterr().err
