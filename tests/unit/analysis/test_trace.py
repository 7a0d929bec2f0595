"""``analysis.trace``: the trace view, and what ``trace --with`` refuses to read."""

from __future__ import annotations

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
