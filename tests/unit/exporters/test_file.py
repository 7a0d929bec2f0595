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
