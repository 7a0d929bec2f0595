"""The JSON Lines file: append-only, parent links, readable after a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest

import telemetry_jit
from telemetry_jit.exporters import FileExporter
from tests.conftest import Telemetry, fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_run_appends_instead_of_clobbering(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    for _ in range(2):
        fresh_provider_state()
        provider = telemetry_jit.configure("app", file=path)
        telemetry_jit.hook_trainer_cls(__import__("lightning.pytorch").pytorch.Trainer, provider)[1].on_app_end()
    fresh_provider_state()
    runs = telemetry_jit.read_telemetry(path)
    assert len(runs) == 2 and runs[0].run_id != runs[1].run_id
    assert all(len(run.find("application")) == 1 for run in runs)
    assert all(json.loads(line)["rank"] == 0 for line in path.read_text().splitlines())


def test_each_rank_writes_its_own_file_and_every_record_carries_the_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    fresh_provider_state()
    provider = telemetry_jit.configure("app", file=tmp_path / "t.jsonl")
    telemetry_jit.hook_trainer_cls(__import__("lightning.pytorch").pytorch.Trainer, provider)[1].on_app_end()
    fresh_provider_state()
    assert not (tmp_path / "t.jsonl").exists()
    lines = (tmp_path / "t.rank1.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["rank"] == 1 for line in lines)
    assert oct((tmp_path / "t.rank1.jsonl").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_a_directory_is_rejected_before_training(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        FileExporter(tmp_path)


def test_an_unwritable_location_is_rejected_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="not a writable directory"):
        fresh_provider_state()
        telemetry_jit.configure("app", file=blocker / "telemetry.jsonl")
    fresh_provider_state()


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    fresh_provider_state()
    provider = telemetry_jit.configure("app", file=path)
    telemetry_jit.hook_trainer_cls(__import__("lightning.pytorch").pytorch.Trainer, provider)[1].on_app_end()
    fresh_provider_state()
    with path.open("a") as handle:
        handle.write('{"kind":"span","span_id":"x')
    with pytest.warns(UserWarning, match="truncated"):
        (run,) = telemetry_jit.read_telemetry(path)
    assert run.find("application")[0].end_unix_ns is not None


TRAIN_UNTIL_KILLED = textwrap.dedent(
    """
    import sys, time
    import lightning.pytorch as pl
    import telemetry_jit
    sys.path.insert(0, {root!r})
    from tests.models import Net, loader, TRAINER_DEFAULTS

    class Slow(Net):
        def training_step(self, batch, batch_idx):
            if self.global_step == 6:
                print("READY", flush=True)
                time.sleep(60)
            return super().training_step(batch, batch_idx)

    provider = telemetry_jit.configure("killed", file={path!r})
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}}))
    callback.on_model_init_start()
    model = Slow("print")
    callback.on_model_init_end()
    HookedTrainer(max_epochs=5, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    """
)


def test_sigkill_leaves_every_complete_line_parseable_with_ended_spans(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    script = tmp_path / "train.py"
    script.write_text(TRAIN_UNTIL_KILLED.format(root=str(ROOT), path=str(path)))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.stdout.readline().strip() != "READY":
            pass
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    (run,) = telemetry_jit.read_telemetry(path)
    assert run.find("model_initialization")[0].end_unix_ns is not None
    compiles = run.find("compilation")
    assert compiles and all(span.end_unix_ns is not None for span in compiles)
    assert run.find("training_loop")[0].end_unix_ns is None  # still running when killed


def test_a_record_names_each_span_before_its_events_and_a_compile_span_is_one_record(telemetry: Telemetry) -> None:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, telemetry.provider, jit_config=telemetry_jit.JitConfig(use_torch=True)
    )
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(8, 4))
    callback.on_app_end()
    records = [json.loads(line) for line in telemetry.path.read_text().splitlines()]
    known: set[str] = set()
    for record in records:
        if record["kind"] in ("span_start", "span"):
            known.add(record["span_id"])
        elif record["kind"] in ("event", "error"):
            assert record["span_id"] in known, record  # a reader of the format meets the span first
    compiles = [r for r in records if r.get("name") == "compilation"]
    assert compiles and all(r["kind"] == "span" for r in compiles)
    assert len({r["span_id"] for r in compiles}) == len(compiles)
    assert any(r["kind"] == "event" and r["name"] == "graph_break" for r in records)
