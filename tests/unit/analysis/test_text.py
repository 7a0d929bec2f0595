"""``analysis.text``: the summary as text, in the user's words and the terminal's width."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from tests.words import flat

DATA = Path(__file__).resolve().parents[2] / "data"


RECORDED = DATA / "answers.jsonl"


ANSWERS = Path(__file__).resolve().parents[2] / "data" / "answers.jsonl"


def _words(text: str) -> set[str]:
    # a table is laid out anew on a narrow terminal (cells wrapped, or one field a line): the words stay, except
    # a word longer than a column, which is split over lines
    # (a header becomes "header:"); the separators are the table's own
    return {word.rstrip(":") for word in text.split() if len(word) <= 16 and set(word) != {"-"}}


@pytest.mark.any_torch
def test_counts_of_one_are_said_in_the_singular() -> None:
    """Recorded by a fit, then validate(), test() and predict() of one compiled module (aot_eager, torch 2.13):
    one backward graph, no graph break."""
    (run,) = read_telemetry(DATA / "entry-points.jsonl")
    text = flat(format_summary(run))
    assert "compiled: 4 frame compiles (3 of them recompiles) and 1 backward graph, " in text
    assert "; 0 graph breaks" in text
    assert "1 recompile, " in text and "1 recompiles" not in text
    # fit's last validation and validate() after it ran at one step: named apart
    assert "first validation step (step 4): " in text and "first validate() step (step 8): " in text


@pytest.mark.any_torch
def test_what_validate_compiled_is_named_validate_everywhere_and_fits_validation_stays_validation() -> None:
    """The same file: fit's validation recompiled for grad mode, validate() for inference mode. Each table row
    and the compile time outside the loop name the stage as the live console does (a validate() run's items
    said "in validation")."""
    (run,) = read_telemetry(DATA / "entry-points.jsonl")
    text = flat(format_summary(run))
    assert "(test() 0.12 s, validate() 0.06 s)" in text
    causes = {row.cause: row.stages for row in summarize(run).causes}
    assert causes["stage_switch"] == ["validate"] and causes["inference_mode"] == ["validate()"]
    assert re.search(r"stage_switch \(expected\) +validation ", text)
    assert re.search(r"inference_mode \(expected\) +validate\(\) ", text)


@pytest.mark.any_torch
def test_fits_of_one_application_are_said_as_the_loops_they_are(capsys: pytest.CaptureFixture) -> None:
    """Recorded by a fit, a second fit of the same trainer to continue (max_epochs raised) and a new trainer's
    fit, in one process (aot_eager, torch 2.13): one application, three training loops, said together."""
    path = str(DATA / "three-fits.jsonl")
    (run,) = read_telemetry(path)
    text = flat(format_summary(run))
    assert "the 3 training loops: " in text and "of the 3 training loops' " in text
    assert "the training loop" not in text
    assert cli.main(["check", path, "--max-compile-share", "1%"]) == 1
    assert "% of the 3 training loops' wall time, more than the 1% allowed" in flat(capsys.readouterr().out)


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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
