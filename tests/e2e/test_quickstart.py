"""The README's main job: the quickstart trains with inductor and prints a summary of real telemetry."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.terminal import counted
from tests.e2e.conftest import needs_thunder
from tests.words import flat

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, out: Path, *args: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)} if cache_dir is not None else {}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **cache},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _shape(text: str) -> str:
    """What a summary says, whatever its figures, run id and line wrapping."""
    text = re.sub(r"run [0-9a-f]{8}", "run ID", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return " ".join(text.split())


def readme_sample() -> tuple[str, str]:
    """The README's sample summary, and the torch release it was made with."""
    readme = (ROOT / "README.md").read_text()
    marker = readme.index("<!-- quickstart-summary")
    release = re.match(r"<!-- quickstart-summary \(torch ([\d.]+)\)", readme[marker:])
    assert release, "the sample's marker names the torch it was made with"
    block = readme[marker:].split("```\n", 2)[1]
    return block.removesuffix("  ...\n"), release.group(1)


def test_quickstart_runs_end_to_end_on_inductor_and_prints_the_readmes_sample(tmp_path: Path) -> None:
    """The README's main command, as on a fresh machine (an empty compile cache): its summary says what the
    README shows, word for word but the figures."""
    out = tmp_path / "quickstart.jsonl"
    result = run_example("quickstart.py", out, cache_dir=tmp_path / "inductor-cache")
    # the README runs it from the repository's root, where its locations read examples/quickstart.py:N; here it
    # runs in a temporary folder, where they are absolute
    printed = result.stdout[result.stdout.index("telemetry-jit summary (run") :].replace(f"{ROOT}/", "")
    sample, release = readme_sample()
    if torch.__version__.startswith(release):  # other releases say a little more or less (torch's doc links)
        assert _shape(printed).startswith(_shape(sample)), "re-make the README's sample from the quickstart"
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
        ('{"hello": 1}\n', "is neither a telemetry-jit record"),
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


NV_ONE_LOGGER_RUN = """
import sys
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
from nv_one_logger.api.config import OneLoggerConfig
from nv_one_logger.exporter.file_exporter import FileExporter
from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
import telemetry_jit
from tests.models import TRAINER_DEFAULTS, Net, loader

config = OneLoggerConfig(
    application_name="nv-app", session_tag_or_fn="nv-app", world_size_or_fn=1,
    telemetry_config=TrainingTelemetryConfig(global_batch_size_or_fn=4, perf_tag_or_fn="nv-app"),
)
provider = TrainingTelemetryProvider.instance()
provider.with_base_config(config).with_exporter(FileExporter(file_path={path!r})).configure_provider()
HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
model = Net("print")
model.model.compile(backend="aot_eager")
HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(10, 4))
callback.on_app_end()
"""


def test_files_from_nv_one_loggers_own_file_exporter_read_like_ours(tmp_path: Path) -> None:
    # nv-one-logger's documented drop-in path: its builder API with its own FileExporter
    nv_file = tmp_path / "nv-one-logger.jsonl"
    script = NV_ONE_LOGGER_RUN.format(root=str(ROOT), path=str(nv_file))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(nv_file.read_text().splitlines()[0])["type"] == "start"  # really nv-one-logger's format
    (run,) = telemetry_jit.read_telemetry(nv_file)
    assert run.file_format == "nv-one-logger" and any("parent links" in what for what in run.lacks)
    compiles = run.find("compilation")
    assert compiles and all(
        run.spans[s.parent_id or ""].name == "training_loop" for s in compiles
    )  # inferred from time
    assert run.spans[run.find("training_loop")[0].parent_id or ""].name == "application"
    breaks = [e for s in compiles for e in s.events if e.name == "graph_break"]
    assert breaks and all(e.attributes["graph_break.location"].endswith("tests/models.py:36") for e in breaks)

    text = cli_output("summary", str(nv_file))
    assert "nv-one-logger file" in text and "no parent links" in text
    frames = sum(1 for span in compiles if span.attributes["compile.trigger"] == "dynamo")
    assert f"compiled: {counted(frames, 'frame compile')}" in text
    assert f"; {counted(len(breaks), 'graph break')}" in flat(text)
    assert cli.main(["report", str(nv_file), "-o", str(tmp_path / "report.html")]) == 0
    assert cli.main(["trace", str(nv_file), "-o", str(tmp_path / "trace.json")]) == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert sum(e.get("name") == "compilation" for e in trace["traceEvents"]) == len(compiles)


def cli_output(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "telemetry_jit.cli", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_cli_reads_files_without_importing_torch(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"kind":"run_start","format":"telemetry-jit","format_version":1,"run":"r","rank":0}\n'
        '{"kind":"span","span_id":"a","parent_id":null,"name":"application","start_unix_ns":1,"end_unix_ns":2,'
        '"attributes":{},"run":"r","rank":0}\n'
    )
    script = (
        "import sys\n"
        "from telemetry_jit import cli\n"
        f"for command in (['summary', {str(path)!r}], ['report', {str(path)!r}, '-o', {str(tmp_path / 'r.html')!r}],"
        f" ['trace', {str(path)!r}, '-o', {str(tmp_path / 't.json')!r}]):\n"
        "    assert cli.main(command) == 0\n"
        "heavy = [m for m in ('torch', 'lightning', 'nv_one_logger', 'opentelemetry', 'thunder') if m in sys.modules]\n"
        "print('heavy:', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout  # the analysis side never imports the training side
