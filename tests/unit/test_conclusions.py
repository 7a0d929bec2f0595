"""What the analysis concludes from recorded files (issue 54): each share part over the whole it names, budgets
that mean something, the gate for a cause the baseline did not have, the owner of a line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.diff import cause_words
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.causes import CAUSES, RecompileClassifier
from tests.words import flat

DATA = Path(__file__).resolve().parents[1] / "data"
pytestmark = pytest.mark.any_torch  # recorded files and the rules applied to them


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


def test_a_size_that_changed_under_dynamic_true_is_torchs_specialization_never_advised_dynamic() -> None:
    """With dynamic=True on (compile.dynamic), torch fixed the length (set_replacement s53 = 47
    (range_refined_to_singleton)) and its guard fails: the fix is not the option already on."""
    classifier = RecompileClassifier()
    classifier.observe("0", "train", batch_index=0, batches=10, step=0, dynamic="true")
    reason = "0/0: tensor 'x' size mismatch at index 2. expected 47, actual 39"
    found = classifier.observe(
        "0", "train", reason=reason, is_recompile=True, batch_index=3, batches=10, step=3, dynamic="true"
    )
    assert found is not None and found.cause == "specialized"
    assert "dynamic=True" not in CAUSES[found.cause].fix.replace("dynamic=True does not help", "")
    # the same reason without the option: torch's automatic dynamic shapes make it dynamic next time
    classifier = RecompileClassifier()
    classifier.observe("0", "train", batch_index=0, batches=10, step=0, dynamic="auto")
    found = classifier.observe(
        "0", "train", reason=reason, is_recompile=True, batch_index=3, batches=10, step=3, dynamic="auto"
    )
    assert found is not None and found.cause == "changing_dim"


def test_a_property_that_alternates_between_callers_is_classified_by_the_size_its_other_entries_name() -> None:
    """bf16-mixed: entries made for float32 and bfloat16 inputs alternate; at the last batch torch's telling reason
    is a dtype mismatch already seen, and the other entries name the size that changed."""
    classifier = RecompileClassifier()
    classifier.observe("0", "train", batch_index=0, batches=10, step=0)
    dtype = "0/0: tensor 'x' dtype mismatch. expected BFloat16, actual Float"
    assert (
        classifier.observe("0", "train", reason=dtype, is_recompile=True, batch_index=2, batches=10, step=2).cause
        == "tensor_property"
    )
    found = classifier.observe(
        "0",
        "train",
        reason="0/1: tensor 'x' dtype mismatch. expected Float, actual BFloat16",
        is_recompile=True,
        batch_index=9,
        batches=10,
        step=9,
        reasons=[
            "0/1: tensor 'x' dtype mismatch. expected Float, actual BFloat16",
            "0/0: tensor 'x' size mismatch at index 0. expected 32, actual 12",
        ],
    )
    assert found is not None and (found.cause, found.subject) == (
        "last_batch",
        "tensor 'x' size mismatch at index 0. expected 32, actual 12",
    )


def test_a_guard_on_a_dynamic_size_is_named_not_other() -> None:
    classifier = RecompileClassifier()
    classifier.observe("0", "train", batch_index=0, batches=3, step=0)
    for guard in (
        "0/0: 16 <= L['x'].size()[0]  # return F.conv1d(",
        "0/1: L['x'].size()[1] <= 64",
        "0/2: Eq(L['x'].size()[2], 47)",
    ):
        found = classifier.observe("0", "train", reason=guard, is_recompile=True, batch_index=2, batches=3, step=2)
        assert found is not None and found.cause == "specialized", guard


def test_a_batch_of_one_is_torchs_size_one_specialization_and_predict_keeps_every_sample() -> None:
    """torch assumes a dynamic size is at least 2 (its 0/1 specialization): predict's last batch of one fails the
    guard '2 <= x.size()[0]' (the oracle's conv1d_bn, gpt2, bert). It is named so, with a fix that never drops
    predictions."""
    classifier = RecompileClassifier()
    classifier.observe("0", "predict", batch_index=0, batches=2, step=6)
    found = classifier.observe(
        "0",
        "predict",
        reason="0/4: 2 <= L['features'].size()[0]  # hidden = self.conv(features)",
        is_recompile=True,
        batch_index=1,
        batches=2,
        step=6,
    )
    assert found is not None and found.cause == "size_one"
    # after a graph break the sized value is the resume function's (torch 2.15's text, from the oracle's lstm_packed)
    classifier.observe("1", "predict", batch_index=0, batches=2, step=6)
    found = classifier.observe(
        "1",
        "predict",
        reason="1/4: 2 <= ___stack0[2].size()[0]  # _, (hidden, _) = self.rnn(packed)  # zoo.py:255 in "
        "torch_dynamo_resume_in_forward_at_254 (user code shown is first use of this value--the guard itself is not "
        "due user code but due to 0/1 specialization in the framework; to avoid specialization try "
        "torch._dynamo.decorators.mark_unbacked(tensor, dim))",
        is_recompile=True,
        batch_index=1,
        batches=2,
        step=6,
    )
    assert found is not None and found.cause == "size_one", found
    assert "drop_last" not in CAUSES["size_one"].fix_for("predict")
    assert "pad such a batch to two" in CAUSES["size_one"].fix_for("predict")


def test_a_smaller_last_batch_of_a_loop_not_known_to_train_is_never_advised_drop_last(tmp_path: Path) -> None:
    """drop_last=True drops predictions (and evaluation's samples): it is advised only where the stage is known to
    train. A loop whose stage the file does not name (quickstart-cold-before-fix.jsonl with train.stage taken out:
    a plain loop that named none) gets the fix that keeps every sample."""
    assert "drop_last=True)" in CAUSES["last_batch"].fix_for("train")
    for stage in ("", "unknown", "inference", "predict", "validate()"):
        assert "DataLoader(..., drop_last=True)" not in CAUSES["last_batch"].fix_for(stage), stage
    records = [json.loads(line) for line in (DATA / "quickstart-cold-before-fix.jsonl").read_text().splitlines()]
    for record in records:
        record.get("attributes", {}).pop("train.stage", None)
    path = tmp_path / "no-stage.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    (run,) = read_telemetry(path)
    (row,) = [row for row in summarize(run).causes if row.cause == "last_batch"]
    assert "DataLoader(..., drop_last=True)" not in row.fix and "dynamic" in row.fix, row.fix


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


@pytest.mark.parametrize(
    ("recording", "backward_graphs"),
    [
        ("gpt2-backward-graphs.jsonl", (2, 4, 0)),
        ("lstm-packed-backward-graphs.jsonl", (0, 0, 0)),
        ("conv1d-bn-inductor-warm-backward-graphs.jsonl", (0, 0, 6)),
        ("conv1d-bn-inductor-torch215-backward-built.jsonl", (1, 5, 0)),
    ],
    ids=["gpt2", "lstm_packed", "conv1d_bn-inductor-warm-cache", "conv1d_bn-inductor-torch-2.15"],
)
def test_only_frames_that_need_a_backward_compile_one_within(
    recording: str, backward_graphs: tuple[int, int, int]
) -> None:
    """The oracle's recordings (compilation spans, pared to the attributes read here), tlparse's aot_backward_graph
    artifacts the truth. GPT-2: transformers' wrappers break at a logging call before any op, so their dynamic
    recompiles hold an empty graph and no backward; tlparse found 6 (2 lazy, 4 within the network's and the loss's
    recompiles) where the summary said 12. The LSTM over packed sequences: its compiled frame reads only the lengths
    (no gradients), compiled static with no backward, then dynamic: none either, where the summary said 1. Issue
    54's Conv1d model on inductor with a warm compile cache: each training compile loaded its backward graph with its
    forward (two FX graphs hit), so none compiled at a first backward; tlparse found 6 where the summary said 0. The
    same model on torch 2.15's inductor: its static recompiles built their backward with the forward (inductor looked
    up two FX graphs in each), where torch 2.13 compiled it at the first backward; tlparse found 6 (0/0's at its first
    backward, and within 0/1, 0/2, 0/3, 0/4, 0/6) where the summary said 3."""
    (run,) = read_telemetry(DATA / recording)
    digest = summarize(run).digest
    assert (digest.backward_graphs, digest.backward_within, digest.backward_loaded) == backward_graphs
