"""The file exporter appends only to its own files: never through a link, never into a user's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit.exporters import FileExporter
from telemetry_jit.exporters.finished import FinishedSpan
from telemetry_jit.identity import IdentityTracker
from tests.planted import THINGS, as_it_was, planted


def test_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    link = tmp_path / "t.jsonl"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="is a symbolic link"):
        FileExporter(link)
    assert target.read_text() == "mine\n"


def test_a_file_telemetry_jit_did_not_write_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "data.jsonl"
    mine.write_text('{"user": "data"}\n')
    with pytest.raises(ValueError, match="telemetry-jit did not write"):
        FileExporter(mine)
    assert mine.read_text() == '{"user": "data"}\n'


def test_its_own_file_and_an_empty_file_are_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    for _ in range(2):  # a second run appends to the first's file
        exporter = FileExporter(path)
        exporter.initialize()
        exporter.close()
    assert path.read_text().count('"kind":"run_start"') == 2
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    FileExporter(empty).initialize()
    assert '"kind":"run_start"' in empty.read_text()


def test_a_folder_on_the_way_may_be_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "real")
    exporter = FileExporter(tmp_path / "runs" / "t.jsonl")
    exporter.initialize()
    exporter.close()
    assert (tmp_path / "real" / "t.jsonl").exists()


def _records(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_record_is_numbered_by_its_writer_and_run_end_counts_them_by_kind(tmp_path: Path) -> None:
    from telemetry_jit.exporters.finished import FinishedEvent, FinishedSpan

    path = tmp_path / "t.jsonl"
    exporter = FileExporter(path)
    exporter.health = lambda: {"failed_calls": {}}
    exporter.initialize()
    event = FinishedEvent("graph_break", 2, {})
    exporter.export_finished_span(FinishedSpan("compilation", None, 1, 3, {}, (event,)))
    exporter.close()
    records = _records(path)
    assert [r["kind"] for r in records] == ["run_start", "span", "event", "health", "run_end"]
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert {r["writer"] for r in records} == {exporter.writer_id}
    assert records[-1]["records"] == 4
    assert records[-1]["written"] == {"run_start": 1, "span": 1, "event": 1, "health": 1}
    # a second writer appending to the file numbers its own records from 0, under its own id
    second = FileExporter(path)
    second.initialize()
    second.close()
    again = _records(path)[len(records) :]
    assert [(r["kind"], r["seq"]) for r in again] == [("run_start", 0), ("run_end", 1)]
    assert {r["writer"] for r in again} == {second.writer_id} != {exporter.writer_id}


def test_a_record_that_could_not_be_written_leaves_a_gap_in_the_numbers_and_is_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from telemetry_jit.exporters.finished import FinishedSpan

    path = tmp_path / "t.jsonl"
    exporter = FileExporter(path)
    exporter.initialize()
    append = FileExporter._append
    failing = iter([True])  # the first record after run_start fails, as a full disk would

    def full_once(self: FileExporter, line: bytes, *kinds: str) -> bool:
        return False if next(failing, False) else append(self, line, *kinds)

    monkeypatch.setattr(FileExporter, "_append", full_once)
    exporter.export_finished_span(FinishedSpan("compilation", None, 1, 3, {}))
    exporter.export_finished_span(FinishedSpan("compilation", None, 4, 5, {}))
    exporter.close()
    records = _records(path)
    assert [(r["kind"], r["seq"]) for r in records] == [
        ("run_start", 0),
        ("records_lost", 2),
        ("span", 3),
        ("run_end", 4),
    ]
    assert records[-1]["written"] == {"run_start": 1, "records_lost": 1, "span": 1}


def test_a_users_file_whose_first_line_is_blank_is_refused_untouched(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("\n# my notes\nsome text\n")
    with pytest.raises(ValueError, match="telemetry-jit did not write"):
        FileExporter(notes)
    assert notes.read_text() == "\n# my notes\nsome text\n"


def _span(name: str = "compilation") -> FinishedSpan:
    return FinishedSpan(name, None, 1_000, 2_000, {"a": 1})


def _rank_zero_learning_its_rank(path: Path, run_id: str = "the-run") -> FileExporter:
    """Rank 0 of a DDP launch: it writes ``path`` until it learns its rank at fit, then moves to its rank file."""
    identity = IdentityTracker()
    identity.update(0, 0, 1)
    exporter = FileExporter(path, run_id=run_id, identity=identity)
    exporter.initialize()
    exporter.export_finished_span(_span("before"))
    identity.update(0, 0, 2)
    exporter.export_finished_span(_span("after"))
    exporter.close()
    return exporter


def _names(path: Path) -> list[str]:
    """The names of the records a run wrote, its closing count aside (``None``: a run's start)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [record.get("name") for record in records if record.get("kind") != "run_end"]


def test_rank_zero_moves_its_records_to_its_rank_file(tmp_path: Path) -> None:
    exporter = _rank_zero_learning_its_rank(tmp_path / "t.jsonl")
    assert exporter.path == tmp_path / "t.rank0.jsonl"
    assert _names(tmp_path / "t.rank0.jsonl")[1:] == ["before", "after"]
    assert not (tmp_path / "t.jsonl").exists()  # it created it, and held this run alone


def test_rank_zero_appends_to_its_own_earlier_rank_file_and_keeps_an_earlier_runs_file(tmp_path: Path) -> None:
    earlier = FileExporter(tmp_path / "t.jsonl", run_id="earlier")
    earlier.initialize()
    earlier.close()
    _rank_zero_learning_its_rank(tmp_path / "t.jsonl", run_id="job-one")
    _rank_zero_learning_its_rank(tmp_path / "t.jsonl", run_id="job-two")  # its rank 0 file is there, its own
    rank_file = tmp_path / "t.rank0.jsonl"
    assert _names(rank_file)[1:] == ["before", "after", None, "before", "after"]
    earlier_runs = [
        r for r in map(json.loads, (tmp_path / "t.jsonl").read_text().splitlines()) if r["run"] == "earlier"
    ]
    assert [r["kind"] for r in earlier_runs] == ["run_start", "run_end"]  # the earlier run's file stays


@pytest.mark.parametrize("thing", THINGS)
def test_a_thing_planted_at_the_rank_file_is_untouched_and_no_record_is_lost(tmp_path: Path, thing: str) -> None:
    rank_file = tmp_path / "t.rank0.jsonl"
    with planted(rank_file, thing) as words, pytest.warns(RuntimeWarning) as said:
        before = as_it_was(rank_file)
        exporter = _rank_zero_learning_its_rank(tmp_path / "t.jsonl")
        assert as_it_was(rank_file) == before
    # every record stays in the file it was writing, and the warning names both files and what lies there
    assert exporter.path == tmp_path / "t.jsonl" and exporter.lost_records == 0
    assert _names(tmp_path / "t.jsonl")[1:3] == ["before", "after"]
    (warning,) = [str(w.message) for w in said if "stay" in str(w.message)]
    assert str(tmp_path / "t.jsonl") in warning and str(rank_file) in warning and words in warning
