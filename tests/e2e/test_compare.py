"""``telemetry-jit diff`` and ``telemetry-jit check`` on real runs: a change that brings back a graph
break is named by location and fails the CI gate."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.check import Budget, check
from telemetry_jit.analysis.diff import diff
from telemetry_jit.terminal import counted
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.dynamo_facts import total_graph_breaks
from tests.models import TRAINER_DEFAULTS, Net, loader

MODELS = Path(__file__).parents[1] / "models.py"
PRINT_LINE = next(n for n, line in enumerate(MODELS.read_text().splitlines(), 1) if 'print("", end="")' in line)


def train(path: Path, model: Net) -> None:
    """One run, written to ``path``: the model's body compiled with the eager backend."""
    fresh_provider_state()
    torch._dynamo.reset()
    provider = telemetry_jit.configure("compare", file=path, global_batch_size=4)
    config = telemetry_jit.JitConfig(use_torch=True, module_selector="", torch_kwargs={"backend": "eager"})
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(16, 4), loader(8, 4))
    telemetry_jit.shutdown()
    fresh_provider_state()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("compare")
    paths = {"base": folder / "base.jsonl", "new": folder / "new.jsonl"}
    train(paths["base"], Net())
    train(paths["new"], Net("print"))  # the change under review adds a print: a graph break
    assert total_graph_breaks() > 0
    return paths


def cli_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_check_with_a_baseline_fails_on_the_new_graph_break_and_names_it(runs, capsys) -> None:
    status, out = cli_run(capsys, "check", str(runs["new"]), "--baseline", str(runs["base"]), "--no-new-graph-breaks")
    assert status == 1
    assert f"new graph break at tests/models.py:{PRINT_LINE}" in out
    status, out = cli_run(capsys, "check", str(runs["base"]), "--baseline", str(runs["base"]), "--no-new-graph-breaks")
    assert status == 0 and "within budget" in out


def test_check_budgets_say_which_figure_broke_them(runs, capsys) -> None:
    new = telemetry_jit.read_telemetry(runs["new"])[-1]
    breaks = len([e for s in new.find("compilation") for e in s.events if e.name == "graph_break"])
    assert breaks > 0
    status, out = cli_run(capsys, "check", str(runs["new"]), "--max-graph-breaks", str(breaks - 1))
    assert status == 1 and f"{counted(breaks, 'graph break')}, more than the {breaks - 1} allowed" in out
    assert cli_run(capsys, "check", str(runs["new"]), "--max-graph-breaks", str(breaks))[0] == 0
    status, out = cli_run(capsys, "check", str(runs["new"]), "--max-compile-share", "0")
    assert status == 1 and "% of the training loop's wall time, more than the 0% allowed" in out
    assert check(new, Budget(max_compile_share=1.0)) == []
    status, out = cli_run(capsys, "check", str(runs["new"]), "--no-new-graph-breaks")
    assert status == 2 and "--baseline" in out
    status, out = cli_run(capsys, "check", str(runs["new"]), "--max-compile-share", "150")
    assert status == 2 and "percentage" in out


def test_diff_names_the_new_graph_break_by_location_in_text_and_json(runs, capsys) -> None:
    status, out = cli_run(capsys, "diff", str(runs["base"]), str(runs["new"]))
    assert status == 0
    assert "new graph breaks:" in out and f"tests/models.py:{PRINT_LINE}" in out
    status, out = cli_run(capsys, "diff", str(runs["base"]), str(runs["new"]), "--json")
    result = json.loads(out)
    (added,) = result["new_graph_breaks"]
    assert added["location"] == f"tests/models.py:{PRINT_LINE}" and added["count"] >= 1
    assert result["fixed_graph_breaks"] == []
    assert result["new"]["graph_breaks"] > result["base"]["graph_breaks"] == 0
    assert result["new"]["frame_compiles"] > result["base"]["frame_compiles"]  # the break splits the frame in two
    new_run = telemetry_jit.read_telemetry(runs["new"])[-1]
    per_frame = {frame["frame"]: frame["new"]["compiles"] for frame in result["frames"] if frame["new"]["compiles"]}
    assert sum(per_frame.values()) == len(new_run.find("compilation"))
    assert any(name.startswith("torch_dynamo_resume_in_forward") for name in per_frame)  # only the new run has it
    reverse = diff(telemetry_jit.read_telemetry(runs["new"])[-1], telemetry_jit.read_telemetry(runs["base"])[-1])
    assert list(reverse.base_only.graph_breaks) == [(f"tests/models.py:{PRINT_LINE}", added["reason"])]
