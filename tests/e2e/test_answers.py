"""Answers, not only numbers, on real runs with torch as ground truth: every recompile gets one cause (their
counts add up to torch's recompile count), every named fix applied to the same run removes its
recompiles, every graph break says whose code it is in and which of the user's lines led there."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.digest import CauseRow
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.compat import torch as torch_compat
from tests.e2e import dynamo_facts, lm
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS
from tests.words import flat

FIXES: dict[str, dict[str, Any]] = {
    "drop_last": {"drop_last": True},
    "dynamic": {"torch_kwargs": {"dynamic": True}},
    "validation_shaped_like_training": {"validation_length": 16},
}
REMOVES = {
    "drop_last": {"last_batch"},
    "dynamic": {"last_batch"},  # the demo's mask, a module attribute, stays static: eval_shape's recompiles remain
    "validation_shaped_like_training": {"eval_shape"},
}


def causes(answers: lm.Answers) -> dict[str, int]:
    return {row.cause: row.count for row in summarize(answers.run).causes if row.unexpected}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> lm.Answers:
    """The run as the user first wrote it."""
    from tests.e2e.conftest import fresh_provider_state

    fresh_provider_state()
    dynamo_facts.reset_compile_state()
    path = tmp_path_factory.mktemp("base") / "run.jsonl"
    provider = telemetry_jit.configure("answers", file=path)
    answers = lm.train(provider, path)
    telemetry_jit.shutdown()
    fresh_provider_state()
    return answers


def test_the_summary_opens_with_what_to_fix_first(base: lm.Answers) -> None:
    diagnosis = summarize(base.run)
    # the causes partition torch's own recompiles
    assert sum(row.count for row in diagnosis.causes) == base.recompiles > 0
    assert causes(base) == {"last_batch": 4, "eval_shape": 2, "python_value": 1}
    expected = [row for row in diagnosis.causes if not row.unexpected]
    assert [(row.cause, row.count) for row in expected] == [("stage_switch", 4)]  # once per frame
    last_batch = next(row for row in diagnosis.causes if row.cause == "last_batch")
    assert last_batch.steps == [3] and last_batch.compile_ms > 0  # the last of 4 batches

    text = format_summary(base.run).splitlines()
    head = flat("\n".join(text[: text.index("")]))  # what comes before the figures
    assert text[1] == "  what to fix first (each cause explained in docs/fixing.md):"
    # ranked by compile seconds: the last batch's 4 recompiles and evaluation's shape met in validation and
    # again in training (the mask validation left), whichever cost more
    first_two = flat("\n".join(text[2:]).split("\n   3. ")[0])
    assert "4 recompiles" in first_two and "the last batch of an epoch is smaller" in first_two
    assert "2 recompiles" in first_two and "at step 4 in validation, training" in first_two
    assert "drop_last=True" in head and "validation/test batches are shaped unlike training batches" in head
    assert "expected: 4 recompiles" in head and "once per frame, nothing to fix" in head
    item = f"tests/e2e/lm.py:{lm.line_of('ITEM')}"  # lm.py's .item() line, as the summary shortens it
    # as compilers print it: the tests run in a temporary folder (tests/conftest.py), so the path is absolute
    assert f"graph breaks in your code at {lm.__file__}:{lm.line_of('ITEM')}" in head
    assert "capture_scalar_outputs = True" in head
    calls = lm.line_of("CALLS THE TRANSFORMER")
    assert "inside torch (/" in head and "modules/transformer.py:" in head
    assert f"reached from your line {lm.__file__}:{calls}" in head
    assert any(line.startswith("  first train step (step 0): ") and "s compiling" in line for line in text)
    assert item  # the JSON names the whole path


def test_the_json_agrees_with_the_summary_and_with_torch(base: lm.Answers, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["summary", "--json", str(base.path)]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert sum(row["count"] for row in run["recompile_causes"]) == base.recompiles
    assert sum(group["count"] for group in run["graph_breaks"]) >= base.graph_breaks  # torch's counted ones, and more
    assert sum(group["counted_by_torch"] for group in run["graph_breaks"]) == base.graph_breaks
    last_batch = next(row for row in run["recompile_causes"] if row["cause"] == "last_batch")
    assert (last_batch["count"], last_batch["first_step"]) == (4, 3) and "drop_last=True" in last_batch["fix"]
    mine = next(group for group in run["graph_breaks"] if group["owner"] == "user")
    assert (
        mine["location"].endswith(f"tests/e2e/lm.py:{lm.line_of('ITEM')}")
        and [mine["location"]] == mine["user_locations"]
    )
    assert mine["type"].startswith("Unsupported Tensor.item()") and "capture_scalar_outputs" in mine["hints"][0]
    in_torch = next(group for group in run["graph_breaks"] if group["owner"] == "torch")
    assert "torch/nn/modules/transformer.py" in in_torch["location"]
    assert in_torch["user_locations"][0].endswith(f"tests/e2e/lm.py:{lm.line_of('CALLS THE TRANSFORMER')}")
    if "graph_break.doc_url" in torch_compat.UNAVAILABLE:
        assert mine["doc_url"] == "" and "graph_break.doc_url" in run_unavailable(base)
    else:
        assert mine["doc_url"].startswith("https://") and mine["doc_url"].endswith(".html")
    assert [step["stage"] for step in run["first_steps"]][:2] == ["train", "validate"]
    first = run["first_steps"][0]
    assert 0 < first["compile_s"] <= first["wall_s"]


def run_unavailable(answers: lm.Answers) -> set[str]:
    return {
        str(fact) for span in answers.run.find("compilation") for fact in span.attributes.get("compile.unavailable", [])
    }


def test_the_span_and_event_attributes_carry_the_answers(base: lm.Answers) -> None:
    spans = base.run.find("compilation")
    recompiles = [s for s in spans if s.attributes["compile.is_recompile"]]
    assert all(s.attributes["compile.recompile_cause"] for s in recompiles)  # backward graphs carry their forward's
    assert all("compile.recompile_cause" not in s.attributes for s in spans if not s.attributes["compile.is_recompile"])
    breaks = [e.attributes for s in spans for e in s.events if e.name == "graph_break"]
    assert {b["graph_break.owner"] for b in breaks} == {"user", "torch"}
    assert all(
        b["graph_break.user_location"].endswith(".py:" + b["graph_break.user_location"].rsplit(":", 1)[1])
        for b in breaks
    )
    assert all(b["graph_break.stack"][-1] == b["graph_break.location"] for b in breaks)


def test_report_check_and_diff_say_the_same(base: lm.Answers, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    report = tmp_path / "report.html"
    assert cli.main(["report", str(base.path), "-o", str(report)]) == 0
    html = report.read_text()
    first_screen = html.split("<h2>Timeline</h2>")[0]
    assert "What to fix first" in first_screen and "4 recompiles" in first_screen and "drop_last=True" in first_screen
    assert 'id="timeline-legend"' in html
    capsys.readouterr()
    assert cli.main(["check", str(base.path), "--max-unexpected-recompiles", "7"]) == 0
    assert cli.main(["check", str(base.path), "--max-unexpected-recompiles", "6"]) == 1
    out = capsys.readouterr().out
    assert "7 recompilations beyond the expected price (" in out and "last_batch 4" in out
    breaks_in_user_code = sum(g.count for g in summarize(base.run).breaks if g.owner == "user")
    assert cli.main(["check", str(base.path), "--max-graph-breaks", str(breaks_in_user_code), "--user-code-only"]) == 0
    assert cli.main(["check", str(base.path), "--max-graph-breaks", str(breaks_in_user_code)]) == 1


@pytest.mark.parametrize("fix", list(FIXES))
def test_each_named_fix_removes_its_recompiles(fix: str, base: lm.Answers, telemetry: Telemetry, capsys) -> None:
    fixed = lm.train(telemetry.provider, telemetry.path, **FIXES[fix])
    assert sum(row.count for row in summarize(fixed.run).causes) == fixed.recompiles  # still a partition of torch's
    for cause in REMOVES[fix]:
        assert causes(base)[cause] > 0 and cause not in causes(fixed), (fix, causes(fixed))
    capsys.readouterr()
    assert cli.main(["diff", str(base.path), str(telemetry.path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert REMOVES[fix] <= set(result["fixed_recompile_causes"])
    if fix == "dynamic":  # what it does not fix is said to remain, under the cause it has now, never fixed
        assert "eval_shape" not in result["fixed_recompile_causes"]
        assert {(row["base"], row["new"]) for row in result["renamed_recompile_causes"]} == {
            ("eval_shape", "specialized"),
            ("eval_shape", "specialized in eval"),
        }


# -- the causes a small model shows, and their fixes ------------------------------------------------
class Scaled(torch.nn.Module):
    """Reads a number that a schedule changes: as a float attribute, or held in a buffer (the fix)."""

    def __init__(self, in_a_buffer: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.in_a_buffer = in_a_buffer
        if in_a_buffer:
            self.register_buffer("scale", torch.tensor(1.0))
        else:
            self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).tanh() * self.scale

    def set_scale(self, value: float) -> None:
        if self.in_a_buffer:
            self.scale.fill_(value)
        else:
            self.scale = value


class Small(pl.LightningModule):
    def __init__(self, fixed: bool, case: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Scaled(in_a_buffer=fixed and case == "python_value")
        self.offset = torch.nn.Parameter(torch.zeros(()))  # something to train outside the compiled module
        self.fixed, self.case = fixed, case

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        if self.case == "python_value":
            self.model.set_scale(1.0 - 0.1 * batch_idx)  # a schedule
        if self.case == "changing_dim":
            x = x[:, : 4 + 2 * (batch_idx % 3)]  # a changing number of tokens
            if self.fixed:
                torch._dynamo.mark_dynamic(x, 1)
        if self.case == "tensor_property" and batch_idx == 2:
            x = x.double()  # one batch arrives as float64
            if self.fixed:
                x = x.float()
        return (self.model(x).float() - self.offset).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def small_run(telemetry: Telemetry, case: str, fixed: bool) -> dict[str, int]:
    from torch.utils.data import DataLoader, TensorDataset

    shape = (24, 10, 8) if case == "changing_dim" else (24, 8)
    data = DataLoader(TensorDataset(torch.randn(*shape)), batch_size=4)
    model = Small(fixed, case)
    if case == "tensor_property":  # its linear layer would refuse float64: compare elementwise work only
        model.model.linear = torch.nn.Identity()
    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})  # self.model
    hooked, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked(max_epochs=1, **TRAINER_DEFAULTS).fit(model, data)
    run = telemetry.end()
    dynamo_facts.reset_compile_state()
    return {row.cause: row.count for row in summarize(run).causes}


@pytest.mark.parametrize("case", ["python_value", "changing_dim", "tensor_property"])
def test_the_fix_for_a_generic_cause_removes_it(case: str, telemetry: Telemetry, tmp_path: Path) -> None:
    before = small_run(telemetry, case, fixed=False)
    assert before.get(case, 0) >= 1, before
    from tests.e2e.conftest import fresh_provider_state

    fresh_provider_state()
    after_path = tmp_path / "fixed.jsonl"
    provider = telemetry_jit.configure("fixed", file=after_path)
    after = small_run(Telemetry(provider, after_path), case, fixed=True)
    assert case not in after, after


def test_a_compiled_module_that_never_ran_is_named_with_the_selector_that_would(telemetry: Telemetry) -> None:
    class StepCallsASubmodule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # Lightning never calls it here
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (x,) = batch
            return self.net(x).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    from torch.utils.data import DataLoader, TensorDataset

    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})  # the root: the module itself
    hooked, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked(max_epochs=2, **TRAINER_DEFAULTS).fit(
            StepCallsASubmodule(), DataLoader(TensorDataset(torch.randn(8, 8)))
        )
    said = [str(w.message) for w in caught if "never ran" in str(w.message)]
    assert len(said) == 1  # once, at the end of the first epoch
    assert "compiled <root> (StepCallsASubmodule.forward" in said[0]
    assert "Lightning calls training_step" in said[0] and "JitConfig(module_selector='net')" in said[0]


class Masked(torch.nn.Module):
    """Tokens and their mask, whose sizes the code ties (as a transformer's attention mask does)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.linear(tokens) * mask.unsqueeze(-1)


class Tokens(pl.LightningModule):
    def __init__(self, marks: list[tuple[str, int]]) -> None:
        super().__init__()
        self.model, self.marks = Masked(), marks

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        inputs = {"tokens": x[:, : 4 + 2 * (batch_idx % 3)]}  # a changing number of tokens
        inputs["mask"] = torch.ones(inputs["tokens"].shape[:2])
        for name, dim in self.marks:  # the fix, as the summary names it
            torch._dynamo.mark_dynamic(inputs[name], dim)
        return self.model(**inputs).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def tokens_run(telemetry: Telemetry, marks: list[tuple[str, int]]) -> list[CauseRow]:
    from torch.utils.data import DataLoader, TensorDataset

    config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})  # self.model
    hooked, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config, live=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked(max_epochs=1, **TRAINER_DEFAULTS).fit(
            Tokens(marks), DataLoader(TensorDataset(torch.randn(24, 10, 8)), 4)
        )
    run = telemetry.end()
    dynamo_facts.reset_compile_state()
    return summarize(run).causes


def test_a_changing_dimension_two_inputs_share_is_fixed_by_marking_both_as_named(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """A mark on the tensor torch's reason names alone is refused where the code ties its size to another input's:
    the fix names every input torch made dynamic when it recompiled, and marking those, as named, removes the
    recompiles."""
    (row,) = [row for row in tokens_run(telemetry, []) if row.cause == "changing_dim"]
    if "input_shapes" in torch_compat.UNAVAILABLE:
        assert row.marks == [] and "mark_dynamic(tensor, dim)" in row.fix  # the general fix, no inputs named
        pytest.skip(f"torch {torch.__version__} records no compile.input_shapes: the fix names no inputs")
    marks = [(name.split("[")[-1].strip("']"), dim) for name, dim in row.marks]  # kwargs['mask'] is the call's mask
    assert sorted(marks) == [("mask", 1), ("tokens", 1)], row.marks
    assert "mark_dynamic(kwargs['tokens'], 1)" in row.fix or "mark_dynamic(tokens, 1)" in row.fix, row.fix
    from tests.e2e.conftest import fresh_provider_state

    fresh_provider_state()
    provider = telemetry_jit.configure("fixed", file=tmp_path / "fixed.jsonl")
    after = tokens_run(Telemetry(provider, tmp_path / "fixed.jsonl"), marks)
    assert "changing_dim" not in {row.cause for row in after}, after
