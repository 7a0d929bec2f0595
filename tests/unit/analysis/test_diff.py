"""``analysis.diff``: two runs compared, the caches' part told apart from the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit import cli
from tests.words import flat

pytestmark = pytest.mark.any_torch


DATA = Path(__file__).resolve().parents[2] / "data"


def test_diff_of_a_cold_and_a_warm_run_says_the_caches_did_it(capsys: pytest.CaptureFixture) -> None:
    # the quickstart twice with one TORCHINDUCTOR_CACHE_DIR (torch 2.13, inductor): cold it compiles 8 graphs,
    # warm 6, as the caches serve backward graphs a cold run compiles lazily
    cold, warm = str(DATA / "cache-cold.jsonl"), str(DATA / "cache-warm.jsonl")
    assert cli.main(["diff", cold, warm]) == 0
    out = capsys.readouterr().out
    # one unit per line: the same frames compiled; the warm run loaded its backward graphs
    assert "frame compiles             6  ->  6" in out and "backward graphs            2  ->  0" in out
    assert "this is the caches' doing, not a code change" in out
    assert cli.main(["diff", cold, warm, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache_effect_only"] is True


def test_a_code_change_is_not_put_down_to_the_caches(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["diff", str(DATA / "cache-warm.jsonl"), str(DATA / "answers.jsonl")]) == 0
    assert "the caches' doing" not in capsys.readouterr().out


def test_a_fix_measured_against_a_cold_run_says_the_caches_took_part(capsys: pytest.CaptureFixture) -> None:
    # the quickstart (torch 2.13, inductor, one epoch) with an empty compile cache, then with the fix it names
    # (drop_last=True) and the cache the first run filled: compile time fell for both reasons
    cold, fixed = str(DATA / "quickstart-cold-before-fix.jsonl"), str(DATA / "quickstart-warm-after-fix.jsonl")
    assert cli.main(["diff", cold, fixed]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the compile caches were not in the same state (hit rate 0% -> 100%)" in out
    assert "Recompiles and graph breaks are the change's" in out and "last_batch in train: 2" in out
    assert "this is the caches' doing" not in out  # the code changed too
    assert cli.main(["diff", cold, fixed, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["caches_differ"], said["cache_effect_only"]) == (True, False)
    for base, new in ((cold, cold), (str(DATA / "cache-cold.jsonl"), str(DATA / "cache-warm.jsonl"))):
        assert cli.main(["diff", base, new]) == 0
        assert "not in the same state" not in capsys.readouterr().out  # the same run; the caches' doing alone


def test_a_fix_that_makes_the_batch_dynamic_is_told_fixed_and_its_missing_backward_graph_explained(
    capsys: pytest.CaptureFixture,
) -> None:
    """The runs of test_counts_of_one_are_said_in_the_singular, before and after the fix the summary named for
    test()'s smaller last batch (torch.compile(dynamic=True)), recorded on torch 2.13."""
    before, after = str(DATA / "entry-points.jsonl"), str(DATA / "entry-points-dynamic.jsonl")
    assert cli.main(["diff", before, after]) == 0
    out = flat(capsys.readouterr().out)
    assert "fixed recompiles: last_batch in eval: 1" in out
    assert "backward graphs 1 -> 0" in out and "has its backward compiled within its frame's compile" in out
    assert cli.main(["check", before, "--max-unexpected-recompiles", "0"]) == 1
    assert "1 recompilation beyond the expected price (last_batch in eval 1)" in flat(capsys.readouterr().out)
    assert cli.main(["check", after, "--baseline", before, "--max-unexpected-recompiles", "0"]) == 0
    assert cli.main(["diff", after, before]) == 0
    assert "has its backward compiled within" not in flat(capsys.readouterr().out)  # more backward graphs: no note


def _retold(path: Path, out: Path, change: dict[str, str], twice: bool = False) -> str:
    """``path`` with its last-batch recompile (test()'s, compile 0/3) told under ``change``'s cause; ``twice``: the
    base run's second attempt at the same batch beside it, refused at the recompile limit."""
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        attributes = record.get("attributes", {})
        if attributes.get("compile.recompile_cause") == "last_batch":
            if twice:
                again = json.loads(line)
                again["span_id"] += "-again"
                again["attributes"].update({"compile.id": "0/4", "compile.recompile_cause": "recompile_limit"})
                lines.append(json.dumps(again))
            attributes.update(change)
        lines.append(json.dumps(record))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_one_new_recompile_is_matched_to_one_old_one(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """Issue 63: a single recompile of the new run was said renamed from two of the base run's at its batch
    ("last_batch -> specialized: 1" and "recompile_limit -> specialized: 1"); the second is fixed instead."""
    base = _retold(DATA / "entry-points.jsonl", tmp_path / "base.jsonl", {}, twice=True)
    new = _retold(DATA / "entry-points.jsonl", tmp_path / "new.jsonl", {"compile.recompile_cause": "specialized"})
    assert cli.main(["diff", base, new, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    renamed = [(entry["base"], entry["new"], entry["count"]) for entry in facts["renamed_recompile_causes"]]
    assert renamed == [("last_batch in eval", "specialized in eval", 1)], renamed
    assert facts["fixed_recompile_causes"] == {"recompile_limit in eval": 1}
    assert facts["new_recompile_causes"] == {}


def _with_option(path: Path, out: Path, dynamic: str) -> str:
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("name") == "compilation":
            record["attributes"]["compile.dynamic"] = dynamic
        lines.append(json.dumps(record))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def test_a_miss_where_only_dynamic_changed_names_the_option_not_a_change_of_the_model(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """Issue 63: "nothing to fix if you changed the model on purpose" where only dynamic=True changed."""
    base = _with_option(DATA / "quickstart-warm-after-fix.jsonl", tmp_path / "base.jsonl", "auto")
    new = _with_option(DATA / "quickstart-cold-before-fix.jsonl", tmp_path / "new.jsonl", "true")
    assert cli.main(["diff", base, new]) == 0
    out = flat(capsys.readouterr().out)
    assert "torch.compile options changed: dynamic: auto -> true" in out
    assert "the torch.compile option dynamic: auto -> true changed between the runs" in out
    assert "nothing to fix if the code or the data changed on purpose" not in out
    facts = json.loads((cli.main(["diff", base, new, "--json"]), capsys.readouterr().out)[1])
    assert facts["new"]["compile_s"] >= facts["cache_misses_explained"]["compile_s"]
    assert facts["changed_compile_options"] == ["dynamic: auto -> true"]
