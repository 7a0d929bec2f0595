"""``analysis.check``: the CI gate's budgets and verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.diff import cause_words
from tests.words import flat

pytestmark = pytest.mark.any_torch  # recorded files and the rules applied to them


DATA = Path(__file__).resolve().parents[2] / "data"


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


def test_the_ci_gate_docs_show_what_diff_and_check_print_now(capsys: pytest.CaptureFixture) -> None:
    """docs/ci-gate.md's samples, run on the recorded files they name (runs/*.jsonl there): the same lines."""
    docs = (DATA.parents[1] / "docs" / "ci-gate.md").read_text()
    samples = re.findall(r"```text\n\$ (telemetry-jit [^\n]+)\n(.*?)```", docs, re.S)
    files = {
        "diff": {
            "runs/before.jsonl": "quickstart-cold-before-fix.jsonl",
            "runs/after.jsonl": "quickstart-warm-after-fix.jsonl",
        },
        "check": {"runs/pr.jsonl": "entry-points.jsonl", "ci/compile-baseline.jsonl": "entry-points-dynamic.jsonl"},
    }
    assert {command.split()[1] for command, _ in samples} >= {"diff", "check"}
    for command, printed in samples:
        renamed = files[command.split()[1]]
        argv = [str(DATA / renamed[word]) if word in renamed else word for word in command.split()[1:]]
        cli.main(argv)
        out = capsys.readouterr().out
        for path, name in renamed.items():
            out = out.replace(str(DATA / name), path)
        assert out == printed, (command, out)


def test_the_readmes_ci_line_gates_unexpected_recompiles_not_the_expected_price(capsys: pytest.CaptureFixture) -> None:
    """Issue 63: the README's CI line said --max-recompiles 2, which counts the expected recompiles too (the
    quickstart has 4, 2 of them expected). Run as written on the quickstart's runs, each its own baseline: the fixed
    run (its 2 recompiles the expected price) passes, the unfixed fails on its 2 last-batch recompiles alone."""
    readme = (DATA.parents[1] / "README.md").read_text()
    (line,) = re.findall(r"In CI, `(telemetry-jit check [^`]+)`", readme)
    argv = flat(line).split()[1:]
    assert "--max-unexpected-recompiles" in argv and "--max-recompiles" not in argv
    for name, status in (("quickstart-warm-after-fix.jsonl", 0), ("quickstart-cold-before-fix.jsonl", 1)):
        files = {"run.jsonl": str(DATA / name), "baseline.jsonl": str(DATA / name)}
        assert cli.main([files.get(word, word) for word in argv]) == status
        out = flat(capsys.readouterr().out)
    assert "2 recompilations beyond the expected price (last_batch 2), more than the 0 allowed" in out, out
    assert "4 recompilations" not in out
