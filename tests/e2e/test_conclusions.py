"""What the product concludes from the counts, on a user's own kind of run: the loop a compile belongs to, the
advice against the options already on, the cause a guard names, the whole a share is part of, the owner of a
line, the gate's budgets (issue 54)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.causes import CAUSES
from telemetry_jit.recording.console import CompileConsole
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.e2e.test_truth import Regressor, data, hooked, run_after_the_fix, said
from tests.models import TRAINER_DEFAULTS
from tests.words import flat


# -- the stage of a compile is the loop that ran when torch began it ----------------------------------
@torch._dynamo.config.patch(recompile_limit=1)
def test_a_fallback_at_the_training_epochs_last_batch_is_in_training_not_the_validation_that_follows(
    telemetry: Telemetry,
) -> None:
    """The frame hits the limit at the smaller last training batch (torch gives up before its compile callbacks,
    so the compile is seen only when validation's first batch starts): its stage is training's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = hooked(telemetry)(max_epochs=1, num_sanity_val_steps=0, **TRAINER_DEFAULTS)
        trainer.fit(Regressor(), data(44, 8), data(16, 8))  # 5 batches of 8, then 4; validation after
    run = telemetry.end()
    (fallback,) = summarize(run).digest.fallbacks
    assert (fallback.step, fallback.stage) == (5, "train")
    assert summary_json(run)["fell_back_to_eager"][0]["stage"] == "train"
    status, out = said("check", str(telemetry.path), "--no-eager-fallback")
    assert status == 1 and "it hit the recompile limit, in training)" in out, out


# -- the advice knows the options already on, and a guard on a dynamic size is named ---------------------------
class ConvClassifier(torch.nn.Module):
    """The user's kind of model: Conv1d and BatchNorm over (batch, channels, length)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=2))


def sequences(samples: int, batch: int) -> DataLoader:
    x = torch.randn(samples, 4, 10, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(dim=(1, 2)).unsqueeze(1)), batch_size=batch)


@contextlib.contextmanager
def guard_failures() -> Iterator[list[str]]:
    """torch's own record of the guards that failed while the block ran (torch._dynamo.utils.guard_failures: one
    reason per recompile), filled in when the block ends."""
    failures = torch._dynamo.utils.guard_failures
    before = {code: len(reasons) for code, reasons in failures.items()}
    found: list[str] = []
    yield found
    found += [reason for code, reasons in failures.items() for reason in reasons[before.get(code, 0) :]]


def test_with_dynamic_on_a_guard_on_the_batch_size_is_named_and_dynamic_is_never_advised(telemetry: Telemetry) -> None:
    """dynamic=True, the fix the first summary names for a smaller last batch, is on: torch's Conv1d still guards
    the batch size (16 <= x.size()[0]), and the last batch of 12 recompiles. The span says the options it compiled
    with; the cause is the guard on a dynamic size, not "another guard failed", and its fix is not dynamic=True."""
    with guard_failures() as torchs:
        hooked(telemetry, dynamic=True)(max_epochs=1, **TRAINER_DEFAULTS).fit(
            Regressor(ConvClassifier()), sequences(44, 16)
        )
    run = telemetry.end()
    frames = [span.attributes for span in run.find("compilation") if span.attributes["compile.trigger"] == "dynamo"]
    assert {(span["compile.dynamic"], span["compile.fullgraph"]) for span in frames} == {("true", False)}
    # torch's own decisions: the batch and the length dynamic (symbols), the channels fixed by Conv1d's weight; torch
    # 2.8 records no shapes (no CompilationMetrics.graph_node_shapes), and the span says so rather than an empty list
    if "compile.input_shapes" in frames[0] or not torch.__version__.startswith("2.8"):
        assert re.fullmatch(r"x: \[s\d+, 4, s\d+\]", frames[0]["compile.input_shapes"][0]), frames[0]
    else:
        assert "input_shapes" in frames[0]["compile.unavailable"], frames[0]
    rows = [row for row in summarize(run).causes if not row.expected]
    assert all(row.cause == "specialized" and "x.size()[0]" in row.reasons[0] for row in rows), rows
    # torch's record: each recompile a guard on the dynamic batch size that failed, as many as the summary counts
    assert sum(row.count for row in rows) == len(torchs), (rows, torchs)
    assert all(re.search(r"(<|>|Eq\(|Ne\().*\bx'?\]?\.size\(\)\[0\]", reason) for reason in torchs), torchs
    assert rows or not torch.__version__.startswith("2.13"), "torch 2.13's Conv1d guards the batch size (16 <= ...)"
    status, out = said("summary", str(telemetry.path))
    assert "another guard failed" not in out and "compile with dynamic=True" not in out
    # torch 2.8's Conv1d does not guard the batch size: the last batch recompiles nothing, and nothing is advised
    assert ("dynamic=True does not help here" in out) == bool(rows), (rows, out)


def test_a_batch_of_one_under_dynamic_true_is_size_one_as_torchs_own_guard_failure_says(telemetry: Telemetry) -> None:
    """13 samples in batches of 4 with dynamic=True: the last batch holds one sample, and torch's 0/1 specialization
    (a dynamic size is at least 2) recompiles it. torch's own record of each guard that failed
    (torch._dynamo.utils.guard_failures) is the truth: the summary's size_one recompiles are those it records, and
    no other cause is said for them. (A batch of 8 for the 8 features would fail another guard: duck sizing gives
    both dimensions one symbol, which the first Linear's weight fixes at 8.)"""
    with guard_failures() as torchs:
        hooked(telemetry, dynamic=True)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(13, 4))
    run = telemetry.end()
    size_one = [reason for reason in torchs if re.search(r"2 <= .*\.size\(\)\[0\]|\.size\(\)\[0\] >= 2", reason)]
    assert size_one and len(size_one) == len(torchs), torchs
    rows = [row for row in summarize(run).causes if not row.expected]
    assert [(row.cause, row.count) for row in rows] == [("size_one", len(size_one))], (rows, torchs)
    status, out = said("summary", str(telemetry.path))
    assert CAUSES["size_one"].title.split(":")[0] in out and "dynamic=True does not help here" not in out, out


# -- whose code a graph break is in ------------------------------------------------------------------------
EXECUTED = """
def forward(self, x):
    h = self.linear(x)
    print("", end="")  # a graph break, in code the user ran through exec
    return h
"""


def from_a_file_under(folder: Path) -> Any:
    """``mylib/backends/torch/utils.py`` under ``folder``: the user's own package that happens to be named torch."""
    source = folder / "mylib" / "backends" / "torch" / "utils.py"
    source.parent.mkdir(parents=True)
    source.write_text("def shift(h):\n    print('', end='')  # a graph break\n    return h + 1\n")
    spec = importlib.util.spec_from_file_location("mylib_backends_torch_utils", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("where", ["exec", "mylib/backends/torch"])
def test_a_break_in_the_users_exec_d_code_or_their_package_named_torch_is_theirs(
    where: str, telemetry: Telemetry, tmp_path: Path
) -> None:
    namespace: dict[str, Any] = {}
    if where == "exec":
        exec(compile(EXECUTED, "<string>", "exec"), namespace)  # noqa: S102 - the user's way of building code
    else:
        utils = from_a_file_under(tmp_path)
        namespace["forward"] = lambda self, x: utils.shift(self.linear(x))

    class Built(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 1)

        forward = namespace["forward"]

    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(Built()), data(16, 8))
    run = telemetry.end()
    (group,) = summarize(run).breaks
    assert group.owner == "user", group
    status, out = said("check", str(telemetry.path), "--max-graph-breaks", "0", "--user-code-only")
    assert status == 1 and "in your code, more than the 0 allowed" in out, out


# -- a storm of several causes names each, with the fix for its own stage ---------------------------------------
def padded_per_batch(samples: int, batch: int) -> DataLoader:
    """Sequences padded per batch in a collate_fn, as users write it: batch k is 10 + 2k long."""
    x = torch.randn(samples, 4, 32, generator=torch.Generator().manual_seed(0))

    def collate(items: list[tuple[int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = 10 + 2 * (items[0][0] // batch)
        inputs = torch.stack([sample[:, :length] for _, sample in items])
        return inputs, inputs.sum(dim=(1, 2)).unsqueeze(1)

    return DataLoader(list(enumerate(x)), batch_size=batch, collate_fn=collate)


@torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64)
def test_a_recompile_storm_of_several_causes_names_each_with_its_own_fix(telemetry: Telemetry) -> None:
    """Three batches with new lengths (changing_dim), then the smaller last batch (last_batch): four recompiles in
    four steps, a storm of two causes; the warning names both, each with its count and fix."""
    model = Regressor(ConvClassifier())
    model.model.compile(backend="eager")
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, padded_per_batch(36, 8))
    (storm,) = [str(w.message) for w in caught if "recompile storm" in str(w.message)]
    assert "recompiled 4 times within 3 steps: 3 of them: a dimension keeps changing between calls" in storm, storm
    assert "; 1 of them: the last batch of an epoch is smaller than the others" in storm, storm
    assert storm.count("Fix: ") == 2 and "drop_last=True" in storm.split("1 of them: ")[1]


# -- diff never calls a recompile fixed that still happens under another cause's name ----------------------------
def test_a_last_batch_that_still_recompiles_under_dynamic_true_is_not_called_fixed(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    """The first summary names dynamic=True for the smaller last batch; with it on, Conv1d's guard on the batch size
    (16 <= x.size()[0]) recompiles the same batch: diff says the recompile remains, under the cause it has now."""
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(ConvClassifier()), sequences(44, 16))
    telemetry.end()
    assert [row.cause for row in summarize(telemetry.run()).causes] == ["last_batch"]
    fixed = run_after_the_fix(tmp_path)
    hooked(fixed, dynamic=True)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(ConvClassifier()), sequences(44, 16))
    fixed.end()
    if not summarize(fixed.run()).causes:  # a torch whose Conv1d sets no bound on the batch: fixed indeed
        assert "fixed recompiles: last_batch in train: 1" in said("diff", str(telemetry.path), str(fixed.path))[1]
        return
    status, out = said("diff", str(telemetry.path), str(fixed.path))
    assert "fixed recompiles" not in out and "new recompiles" not in out, out
    assert "recompiles that remain under another cause (the same frame, stage, step and batch): " in out
    assert "last_batch in train -> specialized in train: 1" in out, out
    status, out = said("diff", str(telemetry.path), str(fixed.path), "--json")
    facts = json.loads(out)
    assert facts["fixed_recompile_causes"] == {} and facts["renamed_recompile_causes"] == [
        {"base": "last_batch", "new": "specialized", "count": 1}
    ]
    # the gate says what diff says: the recompile the baseline had, under another name, is no new recompile cause
    status, out = said("check", str(fixed.path), "--baseline", str(telemetry.path), "--no-new-recompile-causes")
    assert status == 0 and "within budget" in out, out


class Tested(Regressor):  # noqa: D101 - validates as its test
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)


def slow_backend(graph: torch.fx.GraphModule, inputs: Any) -> Any:
    time.sleep(0.2)  # long enough for the console to announce it
    return graph.forward


# -- one way to write a location, and the reading hint once ------------------------------------------------------
@torch._dynamo.config.patch(recompile_limit=1)
def test_fit_validate_test_predict_say_where_to_read_once_and_write_each_location_one_way(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """The user's sequence: fit, then validate, test and predict. The file and its command are said once; the frame
    that hit the limit is written the same way on the console, in the warning and in the summary."""
    console: list[str] = []
    live = CompileConsole(threshold_s=0.05, print_fn=console.append)  # announces a compile still running
    HookedTrainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=live)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
        model = Tested(ConvClassifier())
        model.model.compile(backend=slow_backend)
        trainer.fit(model, sequences(20, 8))
        trainer.validate(model, sequences(16, 8))
        trainer.test(model, sequences(16, 8))
        trainer.predict(model, sequences(16, 8))
    hints = [record.getMessage() for record in caplog.records if "read it with" in record.getMessage()]
    assert len(hints) == 1, hints
    (limit,) = [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    written = {found for line in [*console, limit] for found in re.findall(r"forward \(([^()]*\.py:\d+)\)", line)}
    status, out = said("summary", str(telemetry.path))
    written |= set(re.findall(r"forward \(([^()]*\.py:\d+)\)", out))
    assert len(written) == 1 and console and limit, (written, console)


def test_a_new_session_writing_the_same_file_says_where_to_read_it_again(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    """A notebook's second attempt (shutdown, configure with the same file, fit again) is a new run: its session
    says where to read it, once, as the first did; what was said belongs to the session, not the process."""
    hooked(telemetry)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(16, 8))
    telemetry.end()
    fresh_provider_state()
    again = Telemetry(telemetry_jit.configure("again", file=telemetry.path), telemetry.path)
    for _ in range(2):
        hooked(again)(max_epochs=1, **TRAINER_DEFAULTS).fit(Regressor(), data(16, 8))
    again.end()
    hints = [record.getMessage() for record in caplog.records if "read it with" in record.getMessage()]
    assert len(hints) == 2 and len(telemetry_jit.read_telemetry(telemetry.path)) == 2, hints


# -- backward graphs: those compiled at a first backward, and those compiled within their frame's compile ---------
def test_the_backward_graphs_torch_compiled_within_a_frame_compile_are_said(telemetry: Telemetry) -> None:
    """Lengths that change per batch (automatic dynamic shapes) and a smaller last batch: the dynamic recompiles
    compile their backward within the frame compile, not at the first backward. torch's backward compiler, counted,
    is the truth: the summary's backward graphs add up to it."""
    backward_compiles: list[int] = []

    def counted_backward(graph: torch.fx.GraphModule, inputs: Any) -> Any:
        backward_compiles.append(1)
        return graph.forward

    backend = aot_autograd(fw_compiler=lambda graph, inputs: graph.forward, bw_compiler=counted_backward)
    model = Regressor(ConvClassifier())
    hooked(telemetry, backend=backend)(max_epochs=1, **TRAINER_DEFAULTS).fit(model, padded_per_batch(36, 8))
    run = telemetry.end()
    digest = summarize(run).digest
    status, out = said("summary", str(telemetry.path))
    if torch.__version__.startswith("2.8"):  # no record of a dynamic frame, nor of a backward compiled within it
        assert digest.backward_within == 0 and 0 < digest.backward_graphs < len(backward_compiles)
        assert digest.backward_within_unknown >= len(backward_compiles) - digest.backward_graphs, digest
        unknown = f"not counted: backward graphs compiled within any of {digest.backward_within_unknown} frame compiles"
        assert unknown in flat(out) and "did not record compile.input_shapes" in flat(out), out
        assert summary_json(run)["backward_graphs_within_frame_compiles"] is None
        return
    assert digest.backward_within > 0 and digest.backward_graphs + digest.backward_within == len(backward_compiles)
    said_graphs = re.search(r"and (\d+) backward graphs? \(and (\d+) more backward graphs? compiled within their", out)
    assert said_graphs is not None, out
    assert sum(int(n) for n in said_graphs.groups()) == len(backward_compiles), (out, len(backward_compiles))
    assert "not counted: backward graphs" not in flat(out)
