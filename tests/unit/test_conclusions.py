"""What the analysis concludes from recorded files (issue 54): each share part over the whole it names, budgets
that mean something, the gate for a cause the baseline did not have, the owner of a line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.diff import cause_words
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from tests.words import flat

DATA = Path(__file__).resolve().parents[1] / "data"


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


@pytest.mark.parametrize(
    "budget",
    [
        ("--max-recompiles", "-1"),
        ("--max-graph-breaks", "-3"),
        ("--max-unexpected-recompiles", "-1"),
        ("--max-skew", "nan"),
        ("--max-skew", "-0.5"),
        ("--max-recompiles", "x"),
        ("--max-compile-share", "-5%"),
    ],
)
def test_a_budget_below_zero_or_not_a_number_is_refused_naming_it(
    budget: tuple[str, str], capsys: pytest.CaptureFixture
) -> None:
    try:
        status = cli.main(["check", str(DATA / "entry-points.jsonl"), *budget])
    except SystemExit as exit:  # argparse refuses what is no number at all
        status = exit.code
    said = capsys.readouterr()
    assert status == 2 and budget[0] in said.err and "within budget" not in said.out + said.err
    assert "breaks its compile budget" not in said.out


def test_a_recompile_cause_the_baseline_did_not_have_fails_the_gate_and_diff_says_its_stage(
    capsys: pytest.CaptureFixture,
) -> None:
    """entry-points.jsonl has test()'s smaller last batch (last_batch in eval); entry-points-dynamic.jsonl, the
    same run compiled with dynamic=True, has not."""
    before, after = str(DATA / "entry-points.jsonl"), str(DATA / "entry-points-dynamic.jsonl")
    gate = ["--no-new-recompile-causes"]
    assert cli.main(["check", before, "--baseline", after, *gate]) == 1
    out = flat(capsys.readouterr().out)
    assert "new recompile cause last_batch in eval (1 recompile, not in the baseline): the last batch" in out
    assert cli.main(["check", after, "--baseline", before, *gate]) == 0
    capsys.readouterr()
    assert cli.main(["check", before, *gate]) == 2
    assert "--no-new-recompile-causes compares with a baseline run" in capsys.readouterr().err
    # the same cause in training is said with its stage too, beside evaluation's
    assert (
        cause_words("last_batch") == "last_batch in train" and cause_words("last_batch in eval") == "last_batch in eval"
    )
    assert cause_words("stage_switch (expected)") == "stage_switch (expected)"
