"""``analysis.trace``: the trace view, and what ``trace --with`` refuses to read."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from telemetry_jit import cli

pytestmark = pytest.mark.any_torch  # the CLI on recorded files: no torch version changes it


DATA = Path(__file__).resolve().parents[2] / "data"


RECORDED = DATA / "answers.jsonl"


def _trace_with(tmp_path: Path, merged: str) -> int:
    return cli.main(["trace", str(RECORDED), "--with", merged, "-o", str(tmp_path / "out.trace.json")])


def test_trace_with_deeply_nested_json_is_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000 + "]" * 200_000)
    assert _trace_with(tmp_path, str(nested)) == 2
    assert "nested too deeply" in capsys.readouterr().err


def test_trace_with_a_device_that_never_ends_is_refused_without_reading_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert _trace_with(tmp_path, "/dev/zero") == 2
    assert time.monotonic() - started < 5
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_trace_with_a_named_pipe_is_refused_without_waiting_for_a_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    outcome: list[int] = []
    merging = threading.Thread(target=lambda: outcome.append(_trace_with(tmp_path, str(fifo))), daemon=True)
    merging.start()
    merging.join(10)
    if merging.is_alive():  # opening it for reading waits for a writer: be one, so the thread ends
        with open(fifo, "wb"):
            pass
        merging.join(5)
        pytest.fail("trace --with a FIFO blocked until a writer came")
    assert outcome == [2]
    assert "not a regular file" in capsys.readouterr().err


def test_trace_with_a_json_list_that_is_no_trace_is_refused_and_nothing_of_it_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps([{"name": "db", "user": "ci", "password": "hunter2-sekrit"}]))
    assert _trace_with(tmp_path, str(config)) == 2
    err = capsys.readouterr().err
    assert "element 0 of its events is no trace event" in err and "Chrome or Perfetto trace" in err, err
    assert not (tmp_path / "out.trace.json").exists()
    assert "hunter2" not in err


def test_trace_with_copies_only_the_fields_of_trace_events(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    event = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1.5, "dur": 2, "pid": 7, "tid": 7, "args": {"n": 1}}
    document = {"traceEvents": [{**event, "password": "hunter2-sekrit"}], "deviceProperties": [{"token": "t0k3n-x"}]}
    profile.write_text(json.dumps(document))
    assert _trace_with(tmp_path, str(profile)) == 0
    written = (tmp_path / "out.trace.json").read_text()
    assert "hunter2" not in written and "t0k3n" not in written and "password" not in written
    (merged,) = [e for e in json.loads(written)["traceEvents"] if e.get("name") == "aten::mm"]
    assert merged == event  # every field the Trace Event Format defines, as it was


def test_trace_with_events_of_no_numeric_time_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps([{"ph": "X", "name": "a", "ts": "soon"}]))
    assert _trace_with(tmp_path, str(odd)) == 2
    assert "'ts' that is no number" in capsys.readouterr().err
