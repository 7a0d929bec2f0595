"""``analysis.fleet``: many ranks' files read as one job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit import cli

pytestmark = pytest.mark.any_torch


DATA = Path(__file__).resolve().parents[2] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


def rank_copies(folder: Path, ranks: int, odd: int | None = None, late_ms: float = 0.0) -> list[Path]:
    """``ranks`` rank files of one run made from the recorded run; rank ``odd`` lacks its last compile and
    finishes each compile ``late_ms`` later."""
    lines = NEW.read_text().splitlines()
    paths = []
    for rank in range(ranks):
        records = [json.loads(line) for line in lines]
        if rank == odd:
            last = max(i for i, r in enumerate(records) if r.get("name") == "compilation")
            del records[last]
            for record in records:
                if record.get("name") == "compile_summary":  # the rank's own count says one compile fewer
                    record["attributes"]["compile.count"] -= 1
                if record.get("name") == "compilation":
                    record["end_unix_ns"] += int(late_ms * 1e6)
                    attributes = record.get("attributes", {})
                    if "compile.duration_ms" in attributes:  # the compile's own time, which the summary adds up
                        attributes["compile.duration_ms"] += late_ms
        for record in records:
            record.update(rank=rank, world_size=ranks)
        path = folder / f"run.rank{rank}.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        paths.append(path)
    return paths


def test_a_thousand_ranks_on_one_screen_naming_the_odd_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rank_copies(tmp_path, 1000, odd=511, late_ms=700)
    assert cli.main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = out.split("\n\n")[0].splitlines()
    assert head[0] == "telemetry-jit summary (run a11a11a11a11, 1000 ranks)"
    assert len(head) <= 12  # does not grow with the rank count
    assert "compilations per rank: min 18 (rank 511), median 19, max 19" in out
    assert "compiled alike: 999 of 1000 ranks" in out and "rank 511: 18 compilations" in out
    assert "fewer compiles, from" in out
    assert "rank 511 last" in out and "last to finish most often: rank 511" in out
    assert out.count("what to fix first") == 1  # one representative rank's answers, not a thousand


def test_fleet_budgets_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rank_copies(tmp_path, 4, odd=3, late_ms=2500)
    assert cli.main(["check", str(tmp_path), "--ranks-compile-alike"]) == 1
    assert "ranks compiled differently: 2 groups; ranks 3" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path), "--max-skew", "1"]) == 1
    assert "rank 3 last" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path), "--max-skew", "1000"]) == 0
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path / "run.rank0.jsonl"), "--max-skew", "1"]) == 2  # one rank: cannot tell
    assert "compare ranks" in capsys.readouterr().err
    assert cli.main(["summary", "--json", str(tmp_path)]) == 0
    document = json.loads(capsys.readouterr().out)
    (fleet,) = document["fleets"]
    assert fleet["ranks"] == 4 and [group["ranks"] for group in fleet["compiled_alike"]] == [[0, 1, 2], [3]]
    assert fleet["compile_s"]["max_rank"] == 3 and fleet["skews"][0]["last_rank"] == 3
    assert len(document["runs"]) == 1  # the representative; --per-rank for every rank
    assert cli.main(["summary", "--json", "--per-rank", str(tmp_path)]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 4
    assert cli.main(["summary", "--rank", "3", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("telemetry-jit summary (run a11a11a11a11, rank 3)")


def test_a_fleet_report_shows_every_rank(tmp_path: Path) -> None:
    rank_copies(tmp_path, 16, odd=5, late_ms=500)
    output = tmp_path / "fleet.html"
    assert cli.main(["report", str(tmp_path), "-o", str(output)]) == 0
    html = output.read_text()
    assert html.count('class="rank-compile"') == 15 * 19 + 18 and "rank 5 (slowest)" in html
    assert 'id="diagnosis"' in html  # the representative's answers follow


def test_two_processes_claiming_one_rank_and_a_rank_beyond_the_job_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "a").mkdir()
    first, second = rank_copies(tmp_path / "a", 2)

    def rewritten(source: Path, target: Path, **fields: int) -> Path:
        records = [json.loads(line) for line in source.read_text().splitlines()]
        target.write_text("".join(json.dumps({**record, **fields}) + "\n" for record in records))
        return target

    (tmp_path / "b").mkdir()
    twin = rewritten(second, tmp_path / "b" / "run.rank1.jsonl", pid=4242)  # another process, the same rank
    assert cli.main(["summary", str(first), str(second), str(twin)]) == 0
    assert "rank 1 was written by two processes" in capsys.readouterr().err
    assert cli.main(["check", str(first), str(second), str(twin), "--max-recompiles", "100"]) == 2
    beyond = rewritten(NEW, tmp_path / "beyond.jsonl", rank=5, world_size=2)
    assert cli.main(["summary", str(beyond)]) == 0
    assert "rank 5 is no rank of a job of 2 ranks" in capsys.readouterr().err


def test_every_line_of_the_fleet_view_and_the_notes_fits_a_narrow_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    rank_copies(tmp_path, 4, odd=3, late_ms=2500)
    assert cli.main(["summary", str(tmp_path)]) == 0
    assert cli.main(["check", str(tmp_path / "run.rank0.jsonl"), "--max-skew", "1"]) == 2
    said = capsys.readouterr()
    assert "(rank 0 speaks for its group below" in said.out and "compare ranks" in said.err
    too_wide = [line for line in (said.out + said.err).splitlines() if len(line) > 60]
    assert too_wide == []
    monkeypatch.delenv("COLUMNS")  # a pipe or a file: the note whole on one line, as tools read it
    assert cli.main(["check", str(tmp_path / "run.rank0.jsonl"), "--max-skew", "1"]) == 2
    notes = capsys.readouterr().err.splitlines()
    assert notes[-1].startswith("telemetry-jit: check: cannot tell") and notes[-1].endswith("(or a folder).")
    assert all(note.startswith("telemetry-jit: ") for note in notes)  # each note one line, however long
