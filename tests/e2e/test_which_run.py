"""``check`` judges the run the user means: the last started, never an older complete one in place of a newer
incomplete one, and it says (and refuses to guess) when several processes wrote one file at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from telemetry_jit import read_telemetry
from telemetry_jit.cli import main as cli

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]

FIT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.models import Net, loader, TRAINER_DEFAULTS

    class Die(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            if {how!r} == "killed as its fit starts":
                os.kill(os.getpid(), signal.SIGKILL)

    session = telemetry_jit.configure("which", file={path!r}, global_batch_size=4)
    barrier = Path({barrier!r})
    (barrier / {name!r}).touch()
    deadline = time.monotonic() + 120
    while {wait} and len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both processes have begun writing the file before either trains
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, live=False)
    model = Net(graph_break={graph_break!r})
    model.model.compile(backend="eager")
    HookedTrainer(max_epochs=1, callbacks=[Die()], **TRAINER_DEFAULTS).fit(model, loader(16, 4))
    callback.on_app_end()
    """
)


def _start(tmp_path: Path, path: Path, name: str, how: str = "", graph_break: str | None = None, wait: bool = False):
    barrier = tmp_path / "barrier"
    barrier.mkdir(exist_ok=True)
    script = FIT.format(
        root=str(ROOT), path=str(path), barrier=str(barrier), name=name, how=how, graph_break=graph_break, wait=wait
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


BUDGET = ["--max-graph-breaks", "0", "--max-recompiles", "100"]


def test_a_run_killed_as_its_fit_starts_is_judged_not_the_good_run_before_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert _start(tmp_path, path, "good").wait(timeout=300) == 0
    assert cli(["check", str(path), *BUDGET]) == 0  # the good run alone passes
    _start(tmp_path, path, "killed", how="killed as its fit starts").wait(timeout=300)
    assert cli(["check", str(path), *BUDGET]) == 3  # the run just started was killed: not within budget


def test_two_processes_writing_one_file_at_once_are_said_and_never_guessed_between(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    breaking = _start(tmp_path, path, "breaks", graph_break="print", wait=True)
    time.sleep(0.5)
    clean = _start(tmp_path, path, "clean", wait=True)
    assert breaking.wait(timeout=300) == 0 and clean.wait(timeout=300) == 0
    capsys.readouterr()
    assert cli(["check", str(path), *BUDGET]) == 2
    assert "processes written at the same time" in capsys.readouterr().err
    outcomes = sorted(cli(["check", str(path), *BUDGET, "--run", run.run_id]) for run in read_telemetry(path))
    assert outcomes == [0, 1]  # each judged when named: the graph break is seen
