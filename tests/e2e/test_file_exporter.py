"""The JSON Lines file: append-only, parent links, readable after a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter
from torch.utils.data import DataLoader
from typing_extensions import override

import telemetry_jit
from telemetry_jit.exporters import FileExporter
from telemetry_jit.exporters.finished import FinishedEvent, FinishedSpan
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader
from tests.words import flat

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where access() says yes to root")
def test_a_folder_that_refuses_new_files_is_named_before_training_and_the_next_configure_works(tmp_path: Path) -> None:
    fresh_provider_state()
    refused = r"FileExporter cannot create '/proc/telemetry.jsonl': .*Choose a path in a folder"
    with pytest.raises(OSError, match=refused):
        telemetry_jit.configure("app", file="/proc/telemetry.jsonl")
    # as a notebook retries with a good path: nv-one-logger's one configuration a process was not used up
    session = telemetry_jit.configure("app", file=tmp_path / "t.jsonl")
    assert session.recording
    telemetry_jit.shutdown()
    assert len(telemetry_jit.read_telemetry(tmp_path / "t.jsonl")) == 1  # its file, with its run
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


def test_a_finished_span_as_nv_one_logger_objects_keeps_exact_milliseconds() -> None:
    start = 1795384998159872805  # float seconds make this 5 ms span 4.9999 ms
    span = FinishedSpan("compilation", None, start, start + 5_000_000, {"a": 1}, (FinishedEvent("e", start, {}),))
    nv_span, (event,) = span.as_nv_one_logger()
    assert nv_span.attributes.to_json() == span.exported_attributes() == {"a": 1, "duration_msec": 5}
    assert event.attributes.to_json() == span.events[0].exported_attributes() == {"timestamp_msec": start // 1_000_000}


def _clocks_apart(record: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    clocks = [record[key] for key in ("start_unix_ns", "end_unix_ns", "time_unix_ns") if key in record]
    return {key: value for key, value in record.items() if not key.endswith("_unix_ns")}, clocks


class SpanCallsOnly(BaseExporter):
    """Any other nv-one-logger exporter: it takes nv-one-logger's span calls only (here, into a file)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.file = FileExporter(path)

    @override
    def initialize(self) -> None:
        super().initialize()
        self.file.initialize()

    @override
    def export_start(self, span: Span) -> None:
        self.file.export_start(span)

    @override
    def export_stop(self, span: Span) -> None:
        self.file.export_stop(span)

    @override
    def export_event(self, event: Event, span: Span) -> None:
        self.file.export_event(event, span)

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        self.file.export_error(event, span)

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        self.file.export_telemetry_data_error(error)

    @override
    def close(self) -> None:
        self.file.close()
        super().close()


@torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False)
def test_an_exporter_without_whole_spans_gets_the_same_compile_records_through_span_calls(tmp_path: Path) -> None:
    fresh_provider_state()
    whole, calls = tmp_path / "whole.jsonl", tmp_path / "calls.jsonl"
    provider = telemetry_jit.configure("both", file=whole, exporters=[SpanCallsOnly(calls)])
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    sizes = [(torch.randn(n, 8), torch.randn(n, 1)) for n in (1, 2, 3, 4, 5)]  # past the recompile limit
    with pytest.warns(RuntimeWarning, match="recompile_limit"):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), DataLoader(sizes, batch_size=None))
    callback.on_app_end()
    telemetry_jit.shutdown()
    fresh_provider_state()
    records = [[json.loads(line) for line in path.read_text().splitlines()] for path in (whole, calls)]
    ends = [file.pop() for file in records]  # each writer's closing count of what it wrote
    assert records[0].pop()["kind"] == "health"  # the session's own file ends with its account
    assert len(records[0]) == len(records[1])
    assert ends[0]["written"] == {**ends[1]["written"], "health": 1} and ends[0]["records"] == ends[1]["records"] + 1
    for mine, theirs in zip(*records, strict=True):
        (fields, clocks), (their_fields, their_clocks) = _clocks_apart(mine), _clocks_apart(theirs)
        assert fields.pop("writer") != their_fields.pop("writer")  # each file its own writer, numbered alike
        assert fields == their_fields
        # nv-one-logger keeps times as float seconds: within a microsecond of the exact nanoseconds
        assert all(abs(a - b) < 1000 for a, b in zip(clocks, their_clocks, strict=True))
    compiles = {r["span_id"] for r in records[0] if r.get("name") == "compilation"}
    events = [r for r in records[0] if r["kind"] in ("event", "error") and r["span_id"] in compiles]
    assert {r["kind"] for r in events} == {"event", "error"}  # graph breaks, and the recompile limit's error


DISK_FULL_SCRIPT = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    sys.path.insert(0, {root!r})
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.models import Net, loader, TRAINER_DEFAULTS

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the size limit a write fails with EFBIG instead
    path = {path!r}

    class DiskFullForAMoment(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:  # the disk fills: the next record fits only in part
                limit = os.path.getsize(path) + {room}
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            if trainer.global_step == 8 and {recover}:  # and has room again
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    provider = telemetry_jit.configure("disk-full", file=path, global_batch_size=4, log_every_n_train_iterations=1)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
    model = Net()
    model.model.compile(backend="eager")
    HookedTrainer(max_epochs=1, callbacks=[DiskFullForAMoment()], **TRAINER_DEFAULTS).fit(model, loader(48, 4))
    callback.on_app_end()
    print(json.dumps({{"steps": len(model.losses)}}))
    """
)


@pytest.mark.parametrize("room", [0, 100], ids=["failed-writes", "short-writes"])
def test_a_full_disk_leaves_whole_lines_and_counts_what_it_lost(tmp_path: Path, room: int) -> None:
    path = tmp_path / "t.jsonl"
    script = DISK_FULL_SCRIPT.format(root=str(ROOT), path=str(path), room=room, recover=True)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"steps": 12}  # training unchanged
    lines = path.read_bytes().split(b"\n")
    assert lines.pop() == b""
    records = [json.loads(line) for line in lines]  # every line whole, every line parses
    lost = [r["count"] for r in records if r["kind"] == "records_lost"]
    assert len(lost) == 1 and lost[0] > 0
    assert result.stderr.count("could not write to") == 1  # said once, not per record
    (run,) = telemetry_jit.read_telemetry(path)
    assert run.lost_records == lost[0]
    (loop,) = run.find("training_loop")  # what came after the disk had room again is there
    assert loop.end_unix_ns is not None and run.find("application")[0].end_unix_ns is not None
    updates = [e for e in loop.events if e.name == "training_metrics_update"]
    assert 0 < len(updates) < 12  # some steps' updates were lost, the later ones kept
    assert f"{lost[0]} telemetry record(s) could not be written" in cli_summary(path)


def test_a_file_cut_by_a_disk_that_stays_full_says_so_and_what_it_still_knows(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    script = DISK_FULL_SCRIPT.format(root=str(ROOT), path=str(path), room=0, recover=False)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"steps": 12}  # training unchanged
    summary = cli_summary(path)
    assert "this run KILLED: its application, training_loop never ended" in flat(summary) and "disk filled" in summary
    wall = float(summary.split("the training loop: ")[1].split(" s")[0])
    assert wall > 0  # up to the last record the file holds, not 0.00 s
    from telemetry_jit.cli import main as cli

    assert cli(["check", str(path), "--max-recompiles", "100"]) == 3
    assert cli(["check", str(path), "--max-recompiles", "100", "--allow-incomplete"]) == 0


def cli_summary(path: Path) -> str:
    from telemetry_jit.analysis.text import format_summary

    return format_summary(telemetry_jit.read_telemetry(path)[-1])


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_file_deleted_mid_run_is_said_once_and_what_follows_is_kept(tmp_path: Path, what: str) -> None:
    path = tmp_path / "runs" / "t.jsonl"
    fresh_provider_state()
    provider = telemetry_jit.configure("deleted", file=path, global_batch_size=4)

    class Delete(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
            if trainer.global_step == 2:
                path.unlink() if what == "file" else shutil.rmtree(path.parent)

    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider)
    model = Net()
    model.model.compile(backend="eager")
    with pytest.warns(RuntimeWarning, match="was deleted or moved") as caught:
        HookedTrainer(max_epochs=2, callbacks=[Delete()], **TRAINER_DEFAULTS).fit(model, loader(16, 4))
        callback.on_app_end()
    fresh_provider_state()
    assert len([w for w in caught if "was deleted or moved" in str(w.message)]) == 1
    (run,) = telemetry_jit.read_telemetry(path)
    (loop,) = run.find("training_loop")  # started before the deletion, ended after it: its record is kept
    assert loop.end_unix_ns is not None
    assert [e.name for e in loop.events if e.name == "compile_summary"] == ["compile_summary"]
    assert run.find("application")[0].end_unix_ns is not None


def test_a_file_from_a_newer_telemetry_jit_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "future.jsonl"
    path.write_text('{"kind":"run_start","format":"telemetry-jit","format_version":99,"run":"r","rank":0}\n')
    with pytest.raises(
        telemetry_jit.analysis.reader.TelemetryFileError, match="format 99, newer than .* upgrade telemetry-jit"
    ):
        telemetry_jit.read_telemetry(path)
