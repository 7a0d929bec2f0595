"""Any text torch hands over survives every command: lone surrogates, control characters, many lines
and megabytes, from a real training run to the CLI's output.

(A source file whose name is not UTF-8 cannot be compiled at all: torch's own C++ traceback fails on it.)"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

import telemetry_jit
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader
from tests.words import flat


def torch_survives_a_lone_surrogate() -> bool:
    """torch 2.8 itself fails on one in a graph-break message when its trace logger is on (as under
    pytest's log capture): ``UnicodeEncodeError`` in ``trace_structured``, with telemetry or without."""

    def broken(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break(msg="\udcff")
        return x + 1

    try:
        torch.compile(broken, backend="eager")(torch.ones(1))
    except UnicodeEncodeError:
        return False
    finally:
        torch._dynamo.reset()
    return True


# a lone surrogate, a terminal escape, a carriage return, a NUL, many lines and a megabyte in torch's reason
SURROGATE = "\udcff" if torch_survives_a_lone_surrogate() else ""
EXPECTED = "bad \ufffd " if SURROGATE else "bad  "  # a surrogate becomes U+FFFD
MESSAGE = f"bad {SURROGATE} \x1b[31mred\r\x00 text\n" + "next line\n" * 50 + "x" * 1_000_000
MODULE = f"""
import torch
from tests.models import Body


class HostileBody(Body):
    def forward(self, x):
        x = self.layer0(x)
        torch._dynamo.graph_break(msg={MESSAGE!r})
        return self.head(x)
"""


def train_with_hostile_text(telemetry: Telemetry, tmp_path: Path) -> Path:
    source = tmp_path / "hostile_model.py"
    source.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("hostile_model", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = Net()
    net.model.__class__ = module.HostileBody
    net.model.compile(backend="eager")
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(net, loader(8, 4))
    callback.on_app_end()
    return source


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "telemetry_jit.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )


def test_hostile_text_survives_the_reader_and_every_command(telemetry: Telemetry, tmp_path: Path) -> None:
    train_with_hostile_text(telemetry, tmp_path)
    (run,) = telemetry_jit.read_telemetry(telemetry.path)
    breaks = [e for s in run.find("compilation") for e in s.events if e.name == "graph_break"]
    assert breaks
    hostile = breaks[0].attributes
    assert "hostile_model.py" in hostile["graph_break.location"]
    # the surrogate, made valid text
    assert EXPECTED in hostile["graph_break.reason_full"]
    assert "x" * 1_000_000 in hostile["graph_break.reason_full"]  # kept whole in the file
    for span in run.spans.values():
        json.dumps(span.attributes, ensure_ascii=False).encode("utf-8")  # every string encodes

    summary = cli("summary", str(telemetry.path))
    assert summary.returncode == 0, summary.stderr[-2000:]
    assert "hostile_" in summary.stdout and "graph breaks:" in summary.stdout
    assert max(len(line) for line in summary.stdout.splitlines()) < 400  # readable, however long the reason
    assert "\x1b" not in summary.stdout and "\r" not in summary.stdout and "\x00" not in summary.stdout

    report = tmp_path / "report.html"
    result = cli("report", str(telemetry.path), "-o", str(report))
    assert result.returncode == 0, result.stderr[-2000:]
    html = report.read_text(encoding="utf-8")
    assert html.rstrip().endswith("</html>") and EXPECTED in html

    trace = tmp_path / "trace.json"
    result = cli("trace", str(telemetry.path), "-o", str(trace))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(trace.read_text(encoding="utf-8"))


def test_a_report_that_cannot_be_written_whole_leaves_the_old_one(telemetry: Telemetry, tmp_path: Path) -> None:
    train_with_hostile_text(telemetry, tmp_path)
    report = tmp_path / "report.html"
    yesterday = (  # yesterday's report of telemetry-jit's own: one of the user's is never replaced at all
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>telemetry-jit report</title></head>'
        "<body>the report of yesterday</body></html>"
    )
    report.write_text(yesterday)

    def small_disk() -> None:  # the process may write files of at most 64 KiB: a short write, then EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    result = subprocess.run(
        [sys.executable, "-m", "telemetry_jit.cli", "report", str(telemetry.path), "-o", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_disk,
    )
    assert result.returncode == 1
    # flat: the note wraps where the environment names a width (readline puts COLUMNS there for child processes)
    assert f"could not write {report}" in flat(result.stderr)
    assert report.read_text() == yesterday
    assert [p.name for p in tmp_path.iterdir() if "report" in p.name] == ["report.html"]
