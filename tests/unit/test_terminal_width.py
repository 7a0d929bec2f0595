"""The text summary within the terminal's width (``COLUMNS``, a real terminal's own), wrapped, never cut; the
output to a pipe or a file as wide as before (the README shows it)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.text import format_summary

pytestmark = pytest.mark.any_torch

ANSWERS = Path(__file__).resolve().parents[1] / "data" / "answers.jsonl"


def _words(text: str) -> set[str]:
    # a table is laid out anew on a narrow terminal (cells wrapped, or one field a line): the words stay, except
    # a word longer than a column, which is split over lines
    # (a header becomes "header:"); the separators are the table's own
    return {word.rstrip(":") for word in text.split() if len(word) <= 16 and set(word) != {"-"}}


@pytest.mark.parametrize("columns", [60, 90])
def test_the_summary_fits_the_width_columns_gives_and_loses_nothing(
    columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = read_telemetry(ANSWERS)[-1]
    monkeypatch.delenv("COLUMNS", raising=False)
    wide = format_summary(run)
    assert max(len(line) for line in wide.splitlines()) > 130  # to a pipe: the tables keep their width
    monkeypatch.setenv("COLUMNS", str(columns))
    narrow = format_summary(run)
    assert max(len(line) for line in narrow.splitlines()) <= columns
    assert _words(wide) - {word.rstrip(":") for word in narrow.split()} == set()


def test_a_real_terminal_is_read_for_its_width(tmp_path: Path) -> None:
    """The CLI in a pseudo-terminal of 70 columns, no COLUMNS set: every line within 70."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 70, 0, 0))
    environment = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    process = subprocess.Popen(
        [sys.executable, "-m", "telemetry_jit", "summary", str(ANSWERS)],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=environment,
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0
    lines = output.decode().replace("\r\n", "\n").splitlines()
    assert len(lines) > 20 and max(len(line) for line in lines) <= 70, max(lines, key=len)


@pytest.mark.any_torch
def test_a_location_is_written_so_that_it_opens_where_the_command_runs(tmp_path: Path) -> None:
    """Issue 54 item 10: as compilers print them, relative to the working directory where the file lies under it,
    else absolute (another package's file): each opens from there, where 'folder/file.py:N' did not."""
    from telemetry_jit.terminal import shown

    mine = tmp_path / "project" / "models" / "net.py"
    mine.parent.mkdir(parents=True)
    mine.write_text("x = 1\n")
    elsewhere = Path(os.__file__).resolve()  # the standard library's: not under the working directory
    os.chdir(tmp_path / "project")  # tests/conftest.py gives each test a working directory of its own
    assert shown(f"{mine}:1") == "models/net.py:1"
    assert shown(f"{elsewhere}:3") == f"{elsewhere}:3"
    for location in (shown(f"{mine}:1"), shown(f"{elsewhere}:3")):
        assert Path(location.rsplit(":", 1)[0]).is_file()
    assert shown("<string>:4") == "<string>:4" and shown("models/net.py:1") == "models/net.py:1"
