"""``analysis.runs``: which run of a file is shown and judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit import cli

pytestmark = pytest.mark.any_torch


DATA = Path(__file__).resolve().parents[2] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


def test_a_file_that_holds_an_empty_run_after_a_real_one_shows_the_last_started_and_the_gate_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "two.jsonl"
    run_id = json.loads(NEW.read_text().splitlines()[0])["run"]
    empty = NEW.read_text().splitlines()[0].replace(run_id, "f" * 32).replace('"pid":', '"pid":9')
    path.write_text(NEW.read_text() + empty + "\n")
    assert cli.main(["summary", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "showing the last started" in err and "TRAINED NOTHING" in out
    # the run the user means is the one just started: never an older, complete one in its place
    assert cli.main(["check", str(path), "--max-recompiles", "100"]) == 3
