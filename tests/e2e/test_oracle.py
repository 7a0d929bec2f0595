"""The truth oracle's fast subset (docs/oracle.md): models no one here wrote, trained as users train them
(bf16-mixed, accumulation, clipping, validation every epoch, smaller last batches, validate/test/predict after fit,
a resume), each in a process of its own with ``TORCH_TRACE`` on; every statement telemetry-jit makes about the run is
checked against torch's own record (``CompilationMetrics``, counters, tlparse). ``scripts/oracle.py`` runs the
whole zoo."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from oracle.judge import judge
from oracle.runner import ROOT, run_one
from oracle.table import table
from oracle.truth import tlparse_program

# the issue's own model (with a resume), and torch's LSTM on packed sequences under a lowered recompile limit (a
# fallback to eager in training on every torch)
MODELS = ["conv1d_bn", "lstm_packed_limit"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if tlparse_program() is None:
        pytest.skip("tlparse is not installed (the test extra installs it on Linux x86-64)")
    folder = tmp_path_factory.mktemp("oracle")
    for name in MODELS:
        facts = run_one(name, "aot_eager", folder / name, timeout=240)
        assert [fact.torch for fact in facts if fact.fact == "run"] == []
    return {name: folder / name for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_every_statement_agrees_with_torch(name: str, runs: dict[str, Path]) -> None:
    facts = judge(runs[name], ROOT)
    names = {fact.fact for fact in facts}
    assert len(names) >= 40  # every kind of statement was read, none left out
    assert {name for *_, caught in TAMPERED.values() for name in caught} <= names  # each check below was made
    assert sum(fact.agree is True for fact in facts) >= 38  # judged, not only stated
    wrong = [fact for fact in facts if fact.agree is False]
    assert not wrong, table(wrong, use_known=False)


def test_a_wrong_statement_is_caught(runs: dict[str, Path], tmp_path: Path) -> None:
    """The oracle can fail: the same run, its file saying a recompile happened a stage and a step off, with a
    reason torch never gave."""
    copy = tmp_path / "tampered"
    shutil.copytree(runs["conv1d_bn"], copy)
    lines = []
    for line in (copy / "run.jsonl").read_text().splitlines():
        record = json.loads(line)
        attributes = record.get("attributes", {})
        if record.get("name") == "compilation" and attributes.get("compile.id") == "0/1":
            attributes.update(
                {"train.stage": "test", "train.global_step": 99, "compile.recompile_reason": "0/0: made up"}
            )
        lines.append(json.dumps(record))
    (copy / "run.jsonl").write_text("\n".join(lines) + "\n")
    wrong = {fact.fact for fact in judge(copy, ROOT) if fact.agree is False}
    assert {"stage of each compile", "batch and step of each compile", "recompile reasons"} <= wrong


def _recompile(stage: str) -> Callable[[dict], bool]:
    """The first recompile torch started in ``stage``, as the run file's span has it."""
    return lambda a: a.get("compile.is_recompile") is True and a.get("train.stage") == stage


# each kind of statement the judge reads, said wrong in a copy of a real run: what changes, and the facts that
# must then disagree (none of them can pass whatever the product writes)
TAMPERED = {
    "a recompile's time": (
        _recompile("train"),
        {"compile.duration_ms": lambda ms: ms + 500},
        {"count and time of each cause", "compile.duration_ms", "compiles measured", "compiling in the loop"},
    ),
    "a recompile's frame": (
        _recompile("train"),
        {"compile.location": lambda where: where.rsplit(":", 1)[0] + ":1"},
        {"frames of each cause"},
    ),
    "a compile that failed": (
        _recompile("train"),
        {"compile.failed": True, "compile.failure": "RuntimeError: made up"},
        {"failed compiles"},
    ),
    "a compile's resources": (
        _recompile("train"),
        {"compile.resources.cpu_time_s": 1e4, "compile.resources.host_rss_bytes": 1e13},
        {"compile CPU time", "compile memory"},
    ),
    "a compile's cache look-ups": (
        _recompile("train"),
        {"compile.cache.fx_graph_local_hits": 3},
        {"cache look-ups", "warm start"},
    ),
    "a compile's options": (_recompile("train"), {"compile.dynamic": "true"}, {"compile options"}),
    "predict's compile time": (
        _recompile("predict"),
        {"compile.duration_ms": lambda ms: ms + 500},
        {"compiling outside the loop"},
    ),
    "the loop's length": (lambda a: False, {}, {"loop time"}),
    "the application's length": (lambda a: False, {}, {"application time"}),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_each_kind_of_wrong_statement_is_caught(case: str, runs: dict[str, Path], tmp_path: Path) -> None:
    """Each of the judge's checks can fail: the product's file, changed where that statement comes from."""
    chosen, changes, expected = TAMPERED[case]
    copy = tmp_path / "tampered"
    shutil.copytree(runs["conv1d_bn"], copy)
    lines, changed = [], 0
    for line in (copy / "run.jsonl").read_text().splitlines():
        record = json.loads(line)
        attributes = record.get("attributes", {})
        if record.get("name") == "compilation" and not changed and chosen(attributes):
            changed += 1
            attributes.update(
                {key: change(attributes[key]) if callable(change) else change for key, change in changes.items()}
            )
        if (
            case == "the loop's length"
            and record.get("kind") == "span"
            and record.get("name") == "training_loop"
            and not changed
        ):
            changed, record["end_unix_ns"] = 1, record["end_unix_ns"] + 100 * 10**9  # 100 s longer than fit ran
        if case == "the application's length" and record.get("kind") == "span" and record.get("name") == "application":
            changed, record["end_unix_ns"] = 1, record["start_unix_ns"] + 10**9  # shorter than the Trainer's calls
        lines.append(json.dumps(record))
    assert changed == 1
    (copy / "run.jsonl").write_text("\n".join(lines) + "\n")
    wrong = {fact.fact for fact in judge(copy, ROOT) if fact.agree is False}
    assert expected <= wrong, wrong


def test_a_first_step_that_does_not_hold_its_batch_is_caught(runs: dict[str, Path], tmp_path: Path) -> None:
    """The first steps' wall time against Lightning's batches: the training's first batch said to have run a second
    longer than the product timed it."""
    copy = tmp_path / "tampered"
    shutil.copytree(runs["conv1d_bn"], copy)
    truth = json.loads((copy / "truth.json").read_text())
    first = next(batch for batch in truth["batches"] if batch["stage"] == "train")
    first["start_us"] -= 10**6
    (copy / "truth.json").write_text(json.dumps(truth))
    wrong = {fact.fact: fact for fact in judge(copy, ROOT) if fact.agree is False}
    assert "first steps' wall time" in wrong and wrong["first steps' wall time"].product.startswith("train at step 0")


def test_a_fallback_cost_over_batches_that_never_ran_is_caught(runs: dict[str, Path], tmp_path: Path) -> None:
    """A frame of torch's LSTM on packed sequences hits the lowered recompile limit and falls back to eager: its cost
    counts the training batches it then ran eagerly in, and a count Lightning never ran is caught."""
    assert next(f for f in judge(runs["lstm_packed_limit"], ROOT) if f.fact == "fallback cost").agree is True
    copy = tmp_path / "tampered"
    shutil.copytree(runs["lstm_packed_limit"], copy)
    lines = []
    for line in (copy / "run.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("name") == "eager_fallback_cost":
            record["attributes"]["fallback.batches_since"] += 5
        lines.append(json.dumps(record))
    (copy / "run.jsonl").write_text("\n".join(lines) + "\n")
    assert next(f for f in judge(copy, ROOT) if f.fact == "fallback cost").agree is False
