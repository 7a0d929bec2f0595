"""``analysis.summary``: a recorded run's summary (causes, breaks, shares, what an old file lacks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from tests.words import flat

DATA = Path(__file__).resolve().parents[2] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


TORCH_RECOMPILES = 11  # torch's own count in both recordings


@pytest.mark.any_torch
def test_causes_partition_torchs_recompiles_in_new_and_old_files() -> None:
    for path, last_batch in ((NEW, "last_batch"), (OLD, "changing_dim")):
        for digest in (False, True):  # read whole, or folded into aggregates as it is read: the same answers
            summary = summarize(read_telemetry(path, digest=digest)[-1])
            assert sum(row.count for row in summary.causes) == summary.digest.recompiles == TORCH_RECOMPILES
            train = {row.cause: row.count for row in summary.causes if row.unexpected and row.kind == "train"}
            assert train[last_batch] == 4
    old = summarize(read_telemetry(OLD)[-1])
    assert len(old.lacks) == 2 and "no batch positions" in old.lacks[0] and "no call stacks" in old.lacks[1]
    assert not summarize(read_telemetry(NEW)[-1]).lacks


@pytest.mark.any_torch
def test_an_old_file_still_tells_whose_code_a_break_is_in() -> None:
    groups = {group.owner: group for group in summarize(read_telemetry(OLD)[-1]).breaks}
    assert set(groups) == {"user", "torch"}
    assert groups["torch"].user_locations == []  # it cannot know the user's line: no stacks
    assert groups["user"].user_locations[0].endswith("lm_scenario.py:32")


@pytest.mark.any_torch
def test_the_share_of_compiling_outside_the_loop_is_that_compiling_over_the_application() -> None:
    """entry-points.jsonl: a fit, then validate(), test() and predict() (aot_eager, torch 2.13)."""
    (run,) = read_telemetry(DATA / "entry-points.jsonl")
    summary = summarize(run)
    line = next(line for line in flat(format_summary(run)).split("\n") if "compiling outside" in line)
    found = re.search(r"outside the training loop: ([\d.]+) s \(.*\); ([\d.]+)% of the application's ([\d.]+) s", line)
    assert found is not None, line
    part, share, whole = (float(value) for value in found.groups())
    assert abs(part - sum(summary.outside_ms.values()) / 1000) < 0.006
    assert abs(whole - summary.application_ms / 1000) < 0.006
    assert abs(share - 100 * part / whole) < 0.6, line  # part over the whole it names
