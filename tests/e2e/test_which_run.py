"""``check`` judges the run the user means: the last started, never an older complete one in place of a newer
incomplete one, and it says (and refuses to guess) when several processes wrote one file at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from telemetry_jit import read_telemetry
from telemetry_jit.cli import main as cli

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]

KILLED_AS_ITS_FIT_STARTS = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.models import Net, loader, TRAINER_DEFAULTS

    class Die(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            os.kill(os.getpid(), signal.SIGKILL)

    session = telemetry_jit.configure("which", file={path!r}, global_batch_size=4)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, live=False)
    HookedTrainer(max_epochs=1, callbacks=[Die()], **TRAINER_DEFAULTS).fit(Net(), loader(16, 4))
    """
)

# a process that compiles a function (no Lightning to import: the fact is two writers of one file, not what they ran)
COMPILES = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    import telemetry_jit

    telemetry_jit.configure("which", file={path!r})
    barrier = Path({barrier!r})
    (barrier / {name!r}).touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both processes have begun writing the file before either compiles
    linear = torch.nn.Linear(4, 4)

    def layer(x):
        if {breaks!r}:
            print("", end="")
        return linear(x)

    with telemetry_jit.CompileTelemetry():
        torch.compile(layer, backend="eager")(torch.randn(2, 4))
    telemetry_jit.shutdown()
    """
)


def _start(script: str, env: dict[str, str] | None = None, **values: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", script.format(root=str(ROOT), **values)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else {**os.environ, **env},
    )


def _good_fit(path: Path) -> None:
    """A run that trains and finishes, in this process (only the killed one needs a process of its own)."""
    import lightning.pytorch as pl
    import torch

    import telemetry_jit
    from tests.e2e.conftest import fresh_provider_state
    from tests.models import TRAINER_DEFAULTS, Net, loader

    fresh_provider_state()
    torch._dynamo.reset()
    session = telemetry_jit.configure("which", file=path, global_batch_size=4)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, live=False)
    model = Net()
    model.model.compile(backend="eager")
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(16, 4))
    callback.on_app_end()
    telemetry_jit.shutdown()
    fresh_provider_state()


BUDGET = ["--max-graph-breaks", "0", "--max-recompiles", "100"]


def test_a_run_killed_as_its_fit_starts_is_judged_not_the_good_run_before_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _good_fit(path)
    assert cli(["check", str(path), *BUDGET]) == 0  # the good run alone passes
    _start(KILLED_AS_ITS_FIT_STARTS, path=str(path)).wait(timeout=300)
    assert cli(["check", str(path), *BUDGET]) == 3  # the run just started was killed: not within budget


def test_two_processes_writing_one_file_at_once_are_said_and_never_guessed_between(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, barrier = tmp_path / "t.jsonl", tmp_path / "barrier"
    barrier.mkdir()
    writers = [
        _start(COMPILES, path=str(path), barrier=str(barrier), name=name, breaks=breaks)
        for name, breaks in (("breaks", True), ("clean", False))
    ]
    assert [writer.wait(timeout=300) for writer in writers] == [0, 0]
    capsys.readouterr()
    assert cli(["check", str(path), *BUDGET]) == 2
    assert "processes written at the same time" in capsys.readouterr().err
    outcomes = sorted(cli(["check", str(path), *BUDGET, "--run", run.run_id]) for run in read_telemetry(path))
    assert outcomes == [0, 1]  # each judged when named: the graph break is seen


@pytest.mark.parametrize("at_once", [True, False], ids=["at once", "one after the other"])
def test_run_never_picks_one_of_several_writers_that_share_a_launchers_job_id(
    at_once: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, barrier = tmp_path / "t.jsonl", tmp_path / "barrier"
    barrier.mkdir()
    if not at_once:
        (barrier / "nobody").touch()  # neither waits for the other: the second is a job resumed into the same file
    job = {"SLURM_JOB_ID": "777"}
    writers = []
    for name, breaks in (("breaks", True), ("clean", False)):
        writers.append(_start(COMPILES, job, path=str(path), barrier=str(barrier), name=name, breaks=breaks))
        if not at_once:
            assert writers[-1].wait(timeout=300) == 0
    assert [writer.wait(timeout=300) for writer in writers] == [0, 0]
    assert {run.run_id for run in read_telemetry(path)} == {"slurm-777"}
    capsys.readouterr()
    assert cli(["check", str(path), *BUDGET, "--run", "slurm-777"]) == 2
    said = capsys.readouterr().err
    assert "run slurm-777 is shared by 2 writers (pid " in said and "--all-runs" in said
    assert cli(["summary", str(path), "--run", "slurm"]) == 1  # a prefix names them alike: refused too
    assert "shared by 2 writers" in capsys.readouterr().err


def _rank_of_a_job(monkeypatch: pytest.MonkeyPatch, path: Path, job: str, rank: int, world: int, breaks: bool) -> None:
    """One rank of a job (its rank variables as a launcher sets them) that compiles a layer (with a graph break)."""
    import torch

    import telemetry_jit
    from tests.e2e.conftest import fresh_provider_state

    fresh_provider_state()
    for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("TELEMETRY_JIT_RUN_ID", job)
    telemetry_jit.configure("ranks", file=path)
    torch._dynamo.reset()  # each rank is a process of its own, compiling from nothing
    linear = torch.nn.Linear(4, 4)

    def layer(x: torch.Tensor) -> torch.Tensor:
        if breaks:
            print("", end="")
        return linear(x)

    with telemetry_jit.CompileTelemetry():
        torch.compile(layer, backend="eager")(torch.randn(2, 4))
    telemetry_jit.shutdown()
    fresh_provider_state()


def test_a_second_job_into_the_same_folder_is_judged_without_an_earlier_jobs_rank_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs" / "t.jsonl"
    for rank in range(3):  # the earlier job: three ranks, with a graph break
        _rank_of_a_job(monkeypatch, path, "job-one", rank, 3, breaks=True)
    for rank in range(2):  # this job: two ranks, none
        _rank_of_a_job(monkeypatch, path, "job-two", rank, 2, breaks=False)
    capsys.readouterr()
    assert cli(["check", str(path.parent), "--max-graph-breaks", "0", "--ranks-compile-alike"]) == 0
    assert "t.rank2.jsonl holds no run of job" in capsys.readouterr().err


def test_a_non_ascii_run_id_keeps_rank_zeros_first_records_when_it_learns_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import telemetry_jit
    from tests.e2e.conftest import fresh_provider_state

    path = tmp_path / "t.jsonl"
    fresh_provider_state()
    telemetry_jit.configure("earlier", file=path)  # an earlier run in the file: this run's lines are copied out
    telemetry_jit.shutdown()
    fresh_provider_state()
    monkeypatch.setenv("TELEMETRY_JIT_RUN_ID", "entraînement-é")
    session = telemetry_jit.configure("later", file=path)
    session.start_application()
    session.set_rank(0, 0, 2)  # rank 0 of a DDP launch learns it at fit
    telemetry_jit.shutdown()
    fresh_provider_state()
    (run,) = telemetry_jit.read_telemetry(tmp_path / "t.rank0.jsonl")
    (application,) = run.find("application")
    assert run.run_id == "entraînement-é"
    assert "one_logger_initialization" in [event.name for event in application.events]  # its first records came
