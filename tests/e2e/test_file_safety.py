"""The run file's safety: the exporter owns its descriptor or holds none, says what it could not write, keeps
one path for the whole run, and refuses a path that is no regular file without opening it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit.cli import main as cli
from telemetry_jit.exporters import FileExporter
from telemetry_jit.exporters.finished import FinishedSpan
from tests.e2e.conftest import fresh_provider_state

pytestmark = pytest.mark.any_torch


def _span(name: str = "compilation") -> FinishedSpan:
    return FinishedSpan(name, None, 1_000, 2_000, {"a": 1})


def test_a_file_that_cannot_be_opened_again_costs_counted_records_never_a_descriptor_it_gave_up(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs" / "t.jsonl"
    exporter = FileExporter(path)
    exporter.initialize()
    exporter.export_finished_span(_span())
    shutil.rmtree(path.parent)
    path.parent.write_text("")  # its folder is now a file: the file cannot be created again there
    with pytest.warns(RuntimeWarning, match=f"cannot create {path} again") as said:
        exporter.export_finished_span(_span())
        exporter.export_finished_span(_span())
    assert exporter.lost_records == 2
    assert len([w for w in said if "cannot create" in str(w.message)]) == 1  # said once, counted after
    user_fd = os.open(tmp_path / "mine.txt", os.O_WRONLY | os.O_CREAT)  # takes the lowest free number
    try:
        path.parent.unlink()  # that file goes: the folder and the file can be created again
        exporter._next_reopen = 0.0  # noqa: SLF001 - the retry's pause, not waited for here
        exporter.export_finished_span(_span())
        exporter.close()
        os.write(user_fd, b"still mine")  # the exporter never closed the number it gave up
    finally:
        os.close(user_fd)
    assert (tmp_path / "mine.txt").read_bytes() == b"still mine"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["kind"] == "run_start" and "continues" in records[0]
    assert [r["count"] for r in records if r["kind"] == "records_lost"] == [2]


def test_losses_never_written_to_the_file_are_said_at_close(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "t.jsonl"
    exporter = FileExporter(path)
    exporter.initialize()
    shutil.rmtree(path.parent)
    path.parent.write_text("")
    with pytest.warns(RuntimeWarning) as said:
        exporter.export_finished_span(_span())
        user_fd = os.open(tmp_path / "mine.txt", os.O_WRONLY | os.O_CREAT)
        exporter.close()
    try:
        os.write(user_fd, b"x")
    finally:
        os.close(user_fd)
    assert any("1 telemetry record(s) could not be written" in str(w.message) for w in said)


def test_a_fifo_as_the_file_is_refused_at_configure_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def build() -> None:
        try:
            FileExporter(fifo)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # it opened the FIFO, which waits for a reader forever: free it
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail("FileExporter opened the FIFO and blocked")
    assert isinstance(outcome[0], ValueError) and "FIFO (named pipe), not a regular file" in str(outcome[0])


def test_the_path_is_resolved_once_so_a_chdir_after_configure_keeps_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exporter = FileExporter("t.jsonl")
    exporter.initialize()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # as Hydra does, after configure
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no false "deleted or moved"
        exporter.export_finished_span(_span())
        exporter.close()
    assert not (tmp_path / "elsewhere" / "t.jsonl").exists()
    (run,) = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")
    assert len(run.find("compilation")) == 1


@pytest.mark.parametrize("how", ["deleted", "moved"])
def test_a_file_recreated_mid_run_is_never_judged_as_a_whole_run(tmp_path: Path, how: str) -> None:
    path = tmp_path / "t.jsonl"
    fresh_provider_state()
    session = telemetry_jit.configure("recreated", file=path)
    exporter = next(e for e in session.exporters if isinstance(e, FileExporter))
    exporter.export_finished_span(_span())
    if how == "deleted":
        path.unlink()
    else:
        shutil.move(path, tmp_path / "moved.jsonl")
    with pytest.warns(RuntimeWarning, match="was deleted or moved"):
        exporter.export_finished_span(_span())
        telemetry_jit.shutdown()
    fresh_provider_state()
    (run,) = telemetry_jit.read_telemetry(path)
    assert "earlier records are not in this file" in run.fragment
    assert cli(["check", str(path), "--max-recompiles", "100"]) == 2  # it holds part of a run: cannot tell
    if how == "moved":
        assert cli(["check", str(tmp_path / "moved.jsonl"), "--max-recompiles", "100"]) == 2  # moved on mid-run


@pytest.mark.parametrize("planted", ["a link to a user's file", "a user's file", "a folder"])
def test_what_is_planted_where_the_file_was_is_left_untouched_and_no_record_is_lost(
    tmp_path: Path, planted: str
) -> None:
    """The file deleted mid-run and something else put at its path: nothing is written through it, and the run's
    later records go to a file of the writer's own beside it, which the warning names."""
    path, victim = tmp_path / "t.jsonl", tmp_path / "notes.md"
    victim.write_text("the user's notes\n")
    fresh_provider_state()
    session = telemetry_jit.configure("planted", file=path)
    exporter = next(e for e in session.exporters if isinstance(e, FileExporter))
    exporter.export_finished_span(_span())
    path.unlink()
    if planted == "a link to a user's file":
        path.symlink_to(victim)
    elif planted == "a user's file":
        path.write_text("the user's own file\n")
    else:
        path.mkdir()
    with pytest.warns(RuntimeWarning, match="nothing is written through it") as said:
        exporter.export_finished_span(_span())
        telemetry_jit.shutdown()
    fresh_provider_state()
    assert victim.read_text() == "the user's notes\n"
    if planted == "a user's file":
        assert path.read_text() == "the user's own file\n"
    (aside,) = set(tmp_path.glob("t.*.jsonl"))
    assert str(aside) in " ".join(str(w.message) for w in said)
    (run,) = telemetry_jit.read_telemetry(aside)
    assert "earlier records are not in this file" in run.fragment
    assert len(run.find("compilation")) == 1 and run.lost_records == 0 and run.health is not None


def test_a_file_that_can_be_opened_again_at_close_gets_the_runs_last_word(tmp_path: Path) -> None:
    """The file came back less than a second before the run ends (the pause between tries to open it again): the
    health record is the record that says the run ended, and it reaches the file, with the count of losses."""
    path = tmp_path / "runs" / "t.jsonl"
    fresh_provider_state()
    session = telemetry_jit.configure("came back", file=path)
    exporter = next(e for e in session.exporters if isinstance(e, FileExporter))
    shutil.rmtree(path.parent)
    path.parent.write_text("")  # its folder is a file for a moment: nothing can be created there
    with pytest.warns(RuntimeWarning, match="cannot create"):
        exporter.export_finished_span(_span())
    path.parent.unlink()
    telemetry_jit.shutdown()
    fresh_provider_state()
    (run,) = telemetry_jit.read_telemetry(path)
    assert run.health is not None  # the run closed: not read as killed
    assert run.lost_records == 1


DDP_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
import telemetry_jit
from tests.models import Net, loader, TRAINER_DEFAULTS

def main():
    provider = telemetry_jit.configure("ddp-link", file={path!r})
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider,
        jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}}),
    )
    trainer = HookedTrainer(max_epochs=1, strategy="ddp", devices=2, **TRAINER_DEFAULTS)
    trainer.fit(Net("print"), loader(16, 4))
    callback.on_app_end()

if __name__ == "__main__":
    main()
"""


def test_a_link_planted_at_rank_zeros_file_in_a_real_ddp_run_is_not_followed_and_no_record_is_lost(
    tmp_path: Path,
) -> None:
    """Rank 0 of a 2-process DDP launch learns its rank at fit and moves to t.rank0.jsonl; a link planted there
    (to the user's file) is refused: the victim is untouched, rank 0's records all stay in t.jsonl, and it says so."""
    path, victim = tmp_path / "t.jsonl", tmp_path / "victim.txt"
    victim.write_text("the user's own\n")
    (tmp_path / "t.rank0.jsonl").symlink_to(victim)
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]), path=str(path)))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert victim.read_text() == "the user's own\n"
    said = f"this rank's records stay in {path}, not in its rank file: {tmp_path / 't.rank0.jsonl'} is a symbolic link"
    assert said in result.stderr, result.stderr[-4000:]
    (rank0,) = telemetry_jit.read_telemetry(path)
    (rank1,) = telemetry_jit.read_telemetry(tmp_path / "t.rank1.jsonl")
    assert (rank0.rank, rank1.rank, rank0.run_id) == (0, 1, rank1.run_id)  # one run, both ranks, each whole
    assert rank0.health is not None and rank0.lost_records == 0
    assert len(rank0.find("compilation")) == len(rank1.find("compilation")) > 0
    assert cli(["check", str(path), str(tmp_path / "t.rank1.jsonl"), "--max-graph-breaks", "10"]) == 0
