"""One process, one writer; calls in any order (docs/reliability.md).

A script configures telemetry at module level, as most do; processes that ``multiprocessing`` spawns
(DataLoader workers, pool workers) import that script again, and must not write as if they were the run.
A notebook re-runs its cells: configure after shutdown is a new run, configure twice is said.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest

import telemetry_jit
from telemetry_jit.cli import main as cli
from tests.e2e.conftest import fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]

SPAWNING_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, sys
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader
    import telemetry_jit
    from tests.models import Net, TRAINER_DEFAULTS, loader

    session = telemetry_jit.configure("workers", file={path!r})  # module level: every spawned worker runs it too
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, session, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}})
    )


    def square(x):
        return x * x


    if __name__ == "__main__":
        data = DataLoader(loader(42, 4).dataset, batch_size=4, num_workers=2, multiprocessing_context="spawn")
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), data)
        with multiprocessing.get_context("spawn").Pool(2) as pool:  # any other child that imports the script
            assert pool.map(square, [1, 2, 3]) == [1, 4, 9]
    """
)


def test_spawned_workers_that_import_the_script_write_nothing_and_say_nothing(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "workers.jsonl"
    script = tmp_path / "train.py"
    script.write_text(SPAWNING_SCRIPT.format(root=str(ROOT), path=str(path)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = telemetry_jit.read_telemetry(path)  # one run: the training process's, no worker's
    assert run.find("training_loop") and run.find("compilation")
    assert "not configured" not in result.stderr and "already running" not in result.stderr
    # the gate sees the run that trained: it has a graph break
    assert cli(["check", str(path), "--max-graph-breaks", "0"]) == 1


def test_configure_after_shutdown_is_a_new_run_and_an_old_trainer_says_it_records_nothing(tmp_path: Path) -> None:
    """A notebook re-running its cells."""
    path = tmp_path / "notebook.jsonl"
    jit = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    fresh_provider_state()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(2):
            session = telemetry_jit.configure("notebook", file=path)
            OldTrainer = HookedTrainer if _ else None  # noqa: F821 - the first cell's class, in the second
            HookedTrainer, _callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=jit)
            HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(16, 4))
            telemetry_jit.shutdown()
        assert OldTrainer is not None
        OldTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(16, 4))  # a cell run out of order
    first, second = telemetry_jit.read_telemetry(path)
    assert first.run_id != second.run_id
    assert first.find("compilation") and all(run.find("training_loop") for run in (first, second))
    messages = [str(w.message) for w in said if "telemetry" in str(w.message)]
    assert not any("not configured" in m or "already running" in m for m in messages), messages
    assert len([m for m in messages if "hooked to a telemetry session that has ended" in m]) == 1


def test_a_second_configure_while_one_runs_is_said_at_the_users_line(tmp_path: Path) -> None:
    fresh_provider_state()
    session = telemetry_jit.configure("first", file=tmp_path / "a.jsonl")
    try:
        with pytest.warns(RuntimeWarning, match="already running in this process \\('first'\\)") as said:
            assert telemetry_jit.configure("second", file=tmp_path / "b.jsonl") is session
        assert said[0].filename == __file__
        assert not (tmp_path / "b.jsonl").exists()
    finally:
        telemetry_jit.shutdown()
