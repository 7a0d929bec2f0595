"""The file exporter appends only to its own files: never through a link, never into a user's file."""

from __future__ import annotations

from pathlib import Path

import pytest

from telemetry_jit.exporters import FileExporter


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
