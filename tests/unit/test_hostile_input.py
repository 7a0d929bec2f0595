"""The CLI never crashes on hostile input: numbers out of range are bad lines, counted; a ``trace --with`` input
is read within bounds (its size, its nesting, a device that never ends)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from telemetry_jit import cli
from tests.words import flat

pytestmark = pytest.mark.any_torch  # the CLI on recorded files: no torch version changes it

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = DATA / "answers.jsonl"


def test_a_number_out_of_range_is_a_bad_line_counted_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = RECORDED.read_text().splitlines()
    lines[3] = lines[3].replace('"rank":0', '"rank":1e400')
    path = tmp_path / "overflow.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="1 line.s. could not be read .*line 4, a number out of range"):
        assert cli.main(["summary", str(path)]) == 0
        assert cli.main(["check", str(path), "--max-recompiles", "100"]) == 2  # a record missing: not seen whole
    assert "INCOMPLETE" in capsys.readouterr().out


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


def test_a_storm_of_999_recompiles_says_how_many_steps_it_did_not_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = RECORDED.read_text().splitlines()
    at, recompile = next(
        (i, json.loads(line))
        for i, line in enumerate(lines)
        if '"name":"compilation"' in line and '"compile.is_recompile":true' in line
    )
    storm = []
    for k in range(1, 1000):  # the same frame recompiling at 999 steps more, as a storm writes it
        record = json.loads(json.dumps(recompile))
        record["span_id"] = f"storm-{k}"
        record["attributes"].update({"compile.id": f"1/{k + 1}", "train.global_step": 1000 + k})
        storm.append(json.dumps(record, separators=(",", ":")))
    path = tmp_path / "storm.jsonl"
    path.write_text("\n".join(lines[: at + 1] + storm + lines[at + 1 :]) + "\n")
    assert cli.main(["summary", str(path)]) == 0
    said = re.search(r"at steps 1, 1001, 1002 and (\d+) more", flat(capsys.readouterr().out))
    assert said is not None and int(said.group(1)) == 997  # 1000 steps, 3 listed
