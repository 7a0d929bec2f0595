# ruff: noqa: E501 - torch's messages are quoted verbatim
"""``causes``: the rules behind the answers, a recompile's cause from torch's own reasons."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.breaks import break_fix, owner_of, parse_break, recompile_owner, user_location
from telemetry_jit.causes import CAUSES, EXPECTED_CAUSES, RecompileClassifier, normalize_reason, telling_reason

DATA = Path(__file__).resolve().parents[1] / "data"


# a Lightning run of lightning.pytorch.demos.Transformer behind a submodule with an .item() branch: the last
# training batch holds 6 of 8, validation sequences are 24 long instead of 16 (torch 2.13 and 2.8 alike, but
# for the attribute torch 2.8 names first)
RUN = [  # (frame, stage, batch index, batches, torch's reason or "" for a first compile, cause, expected)
    ("0", "train", 0, 4, "", None, False),
    ("1", "train", 0, 4, "", None, False),
    ("2", "train", 0, 4, "", None, False),
    ("3", "train", 0, 4, "", None, False),
    (
        "1",
        "train",
        1,
        4,
        "1/0: self.src_mask is None    # if self.src_mask is None or self.src_mask.size(0) != t: "
        "# lightning/pytorch/demos/transformer.py:69 in forward\nUser stack trace:\n  File ...",
        "python_value",
        False,
    ),
    ("0", "train", 3, 4, "0/0: tensor 'inputs' size mismatch at index 0. expected 8, actual 6", "last_batch", False),
    ("1", "train", 3, 4, "1/1: tensor 'inputs' size mismatch at index 0. expected 8, actual 6", "last_batch", False),
    ("2", "train", 3, 4, "2/0: tensor '___stack0' size mismatch at index 0. expected 8, actual 6", "last_batch", False),
    (
        "3",
        "train",
        3,
        4,
        "3/0: tensor '___stack0' size mismatch at index 0. expected 128, actual 96",
        "last_batch",
        False,
    ),
    ("0", "validate", 0, 2, "0/1: GLOBAL_STATE changed: grad_mode ", "stage_switch", True),
    ("1", "validate", 0, 2, "1/2: GLOBAL_STATE changed: grad_mode ", "stage_switch", True),
    ("2", "validate", 0, 2, "2/1: GLOBAL_STATE changed: grad_mode ", "stage_switch", True),
    ("3", "validate", 0, 2, "3/1: GLOBAL_STATE changed: grad_mode ", "stage_switch", True),
    (
        "1",
        "validate",
        1,
        2,
        "1/3: tensor 'self.src_mask' size mismatch at index 0. expected 16, actual 24",
        "eval_shape",
        False,
    ),
    ("1", "train", 0, 4, "1/4: GLOBAL_STATE changed: grad_mode ", "stage_switch", False),  # back to training
]


# torch's guard_failures for one frame (tests/unit/compat/test_torch.py reads each recompile's from it) (torch 2.8, 2.13 and 2.15 alike): one reason per cache entry at each
# recompile, most recent entry first; a float attribute set per epoch, training and validation alternating
TEMPERATURE_FAILURES = [
    "0/0: GLOBAL_STATE changed: grad_mode ",  # validation's first call
    "0/1: GLOBAL_STATE changed: grad_mode ",  # the second epoch's training: validation's entry, then training's
    "0/0: s.temperature == 1.0                                     # return s.a(x) / s.temperature  # gf3.py:6 in forward",
    "0/2: GLOBAL_STATE changed: grad_mode ",  # the second epoch's validation
    "0/1: s.temperature == 1.0                                     # return s.a(x) / s.temperature  # gf3.py:6 in forward",
    "0/0: GLOBAL_STATE changed: grad_mode ",
]


TORCH_2_13 = """Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` or `export TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1` to include these operations in the captured graph.

  Developer debug context: call_method TensorVariable() item () {}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html"""


TORCH_2_8 = """Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `bool` with argument types ['Tensor'] (has_kwargs False)
  Hint: Avoid calling builtin `bool` with argument types ['Tensor']. Consider using an equivalent alternative function/method to `bool`.
  Hint: If you are attempting to call a logging function (e.g. `print`), you can try adding it to `torch._dynamo.config.reorderable_logging_functions`.
  Hint: Please report an issue to PyTorch.

  Developer debug context: builtin bool [<class 'torch._dynamo.variables.tensor.TensorVariable'>] False
"""


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


def test_every_recompile_of_a_real_run_gets_its_cause() -> None:
    classifier = RecompileClassifier()
    for frame, stage, index, batches, reason, cause, expected in RUN:
        got = classifier.observe(
            frame, stage, reason=reason, is_recompile=bool(reason), batch_index=index, batches=batches
        )
        assert (got and (got.cause, got.expected)) == (cause and (cause, expected)), reason


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("0/0: self._modules['pos_encoder'].pe is None", "python_value"),  # torch 2.8's wording of an attribute
        ("2/1: ___stack2 == 0.2564869523048401  # print(..., h.mean().item())", "break_value"),
        ("0/3: L['self'].scale == 0.5", "python_value"),
        ("0/0: tensor 'x' dtype mismatch. expected Float, actual Double", "tensor_property"),
        ("0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0", "tensor_property"),
        ("0/2: tensor 'x' device mismatch. expected cpu, actual cuda:0", "tensor_property"),
        ("0/0: ___check_global_state()  # something torch has not named", "other"),
        # model.eval() in an evaluation without torch.no_grad() (torch 2.13), the flag dropout reads
        (
            "0/0: s._modules['net']._modules['1'].training == True         # return F.dropout(input, self.p, "
            "self.training, self.inplace)  # nn/modules/dropout.py:73 in forward",
            "module_mode",
        ),
        # names with quotes of their own: a dict batch's tensors, a module's parameters (torch 2.13 and 2.15)
        ("0/0: tensor 'L['batch']['mask']' size mismatch at index 1. expected 5, actual 7", "changing_dim"),
        ("0/0: tensor 'L['batch']['input_ids']' dtype mismatch. expected Long, actual Int", "tensor_property"),
        (
            "0/0: tensor 'fn.__self__._modules['0']._parameters['bias']' requires_grad mismatch. expected "
            "requires_grad=0. Guard failed on a parameter, consider using "
            "torch._dynamo.config.force_parameter_static_shapes = False to allow dynamism on parameters.",
            "trainable_params",
        ),
    ],
)
def test_guards_are_read_as_their_cause(reason: str, cause: str) -> None:
    classifier = RecompileClassifier()
    classifier.observe("0", "train")
    assert classifier.observe("0", "train", reason=reason, is_recompile=True).cause == cause


def test_what_changed_is_named_where_torch_names_the_grad_mode_of_another_entry() -> None:
    # torch's recompile_reason is the most recent entry's: validation's, which fails on grad mode in training
    assert telling_reason(TEMPERATURE_FAILURES[1:3]).startswith("0/0: s.temperature == 1.0")
    assert telling_reason(TEMPERATURE_FAILURES[3:]).startswith("0/1: s.temperature == 1.0")
    assert telling_reason(TEMPERATURE_FAILURES[:1]) == TEMPERATURE_FAILURES[0]  # a first switch: grad mode it is
    classifier = RecompileClassifier()
    classifier.observe("0", "train", step=0)
    causes = [  # each recompile's reasons, as the probe reads them
        classifier.observe("0", stage, reason=telling_reason(reasons), is_recompile=True)
        for stage, reasons in (
            ("validating", TEMPERATURE_FAILURES[:1]),
            ("train", TEMPERATURE_FAILURES[1:3]),
            ("validating", TEMPERATURE_FAILURES[3:]),
        )
    ]
    assert [(c.cause, c.expected) for c in causes if c] == [
        ("stage_switch", True),
        ("python_value", False),
        ("python_value", False),
    ]
    assert causes[1] and causes[1].subject.startswith("s.temperature == 1.0")


def test_unfreezing_parameters_is_an_expected_price() -> None:
    # BackboneFinetuning at its unfreeze epoch (torch 2.13 and 2.15; torch 2.8 does not recompile for it)
    failures = [
        "0/0: GLOBAL_STATE changed: grad_mode ",
        "0/1: GLOBAL_STATE changed: grad_mode ",
        "0/0: tensor 'L['self']._modules['0']._parameters['bias']' requires_grad mismatch. expected requires_grad=0",
    ]
    classifier = RecompileClassifier()
    classifier.observe("0", "train", step=0)
    classifier.observe("0", "validating", reason=failures[0], is_recompile=True, step=8)
    unfrozen = classifier.observe("0", "train", reason=telling_reason(failures[1:]), is_recompile=True, step=8)
    assert unfrozen is not None and (unfrozen.cause, unfrozen.expected) == ("trainable_params", True)
    assert "trainable_params" in EXPECTED_CAUSES


def test_a_dimension_that_changes_again_is_not_the_last_batch() -> None:
    classifier = RecompileClassifier()
    classifier.observe("0", "train")
    first = classifier.observe(
        "0",
        "train",
        reason="0/0: tensor 'x' size mismatch at index 1. expected 16, actual 20",
        is_recompile=True,
        batch_index=1,
        batches=10,
    )
    last = classifier.observe(
        "0",
        "train",
        reason="0/1: tensor 'x' size mismatch at index 1. expected 20, actual 12",
        is_recompile=True,
        batch_index=9,
        batches=10,
    )
    assert (first.cause, last.cause) == ("changing_dim", "changing_dim")


def test_each_loops_smaller_last_batch_is_its_last_batch_whichever_loop_met_one_first() -> None:
    # validation twice an epoch: its 45 samples end in a batch of 13 before training's 150 end in one of 6
    classifier = RecompileClassifier()
    classifier.observe("0", "train", batch_index=0, batches=10, step=0)
    size = "tensor 'x' size mismatch at index 0. expected 16, actual {}"
    grad = classifier.observe(
        "0", "validating", reason="0/0: GLOBAL_STATE changed: grad_mode ", is_recompile=True, batch_index=0, step=2
    )
    validation = classifier.observe(
        "0", "validating", reason="0/1: " + size.format(13), is_recompile=True, batch_index=2, batches=3, step=2
    )
    training = classifier.observe(
        "0", "train", reason="0/0: " + size.format(6), is_recompile=True, batch_index=9, batches=10, step=4
    )
    assert [c and c.cause for c in (grad, validation, training)] == ["stage_switch", "last_batch", "last_batch"]


def test_callers_of_one_function_in_its_first_step_are_the_expected_price() -> None:
    # FSDP2 under torch.compile: each block's forward is its own frame; the first block gets the batch,
    # the second activations that need gradients (seen on torch 2.13 with fully_shard, gloo)
    classifier = RecompileClassifier()
    classifier.observe("1", "train", step=0)
    second = classifier.observe(
        "1",
        "train",
        reason="1/0: tensor 'x' requires_grad mismatch. expected requires_grad=0",
        is_recompile=True,
        step=0,
    )
    assert (second.cause, second.expected) == ("shared_code", True)
    # at the last, smaller batch torch names the requires_grad guard of one entry again: that is not
    # what changed, and no fix for requires_grad is offered
    later = classifier.observe(
        "1",
        "train",
        reason="1/1: tensor 'x' requires_grad mismatch. expected requires_grad=1",
        is_recompile=True,
        step=3,
    )
    assert (later.cause, later.expected) == ("other", False)
    # a property changing for the first time after the first step is the user's to fix
    dtype = classifier.observe(
        "1", "train", reason="1/2: tensor 'x' dtype mismatch. expected Float, actual Double", is_recompile=True, step=5
    )
    assert (dtype.cause, dtype.expected) == ("tensor_property", False)


def test_the_recompile_limit_wins_over_its_reason() -> None:
    classifier = RecompileClassifier()
    classifier.observe("0", "train")
    got = classifier.observe("0", "train", reason="0/7: L['self'].step == 7", is_recompile=True, limit_hit=True)
    assert got.cause == "recompile_limit"


def test_reasons_read_as_one_line_without_torchs_generated_names() -> None:
    assert normalize_reason("1/3: tensor 'L['x']' size mismatch at index 0. expected 8, actual 6") == (
        "tensor 'x' size mismatch at index 0. expected 8, actual 6"
    )
    assert normalize_reason("2/0: tensor '___stack0' size mismatch") == "tensor 'an intermediate value' size mismatch"
    assert normalize_reason("1/0: self.src_mask is None   # if self.src_mask ...\nUser stack trace:\n  x") == (
        "self.src_mask is None"
    )


def test_every_cause_has_a_title_a_fix_and_a_section_in_the_docs() -> None:
    from pathlib import Path

    fixing = (Path(__file__).resolve().parents[2] / "docs" / "fixing.md").read_text()
    for cause in CAUSES.values():
        assert cause.title and cause.fix
        assert f'<a id="{cause.doc.split("#")[1]}"></a>' in fixing, cause.id


@pytest.mark.parametrize(
    ("location", "owner"),
    [
        ("/home/me/project/train.py:12", "user"),
        ("/venv/lib/python3.11/site-packages/torch/nn/modules/transformer.py:1245", "torch"),
        ("/usr/lib/python3/dist-packages/torch/nn/parallel/distributed.py:1637", "torch"),
        ("/venv/lib/python3.12/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_common.py:140", "torch"),
        ("/venv/lib/python3.11/site-packages/lightning/pytorch/demos/transformer.py:78", "lightning"),
        ("/venv/lib/python3.11/site-packages/pytorch_lightning/core/module.py:1", "lightning"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py:81", "python"),
        ("/venv/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py:300", "transformers"),
        ("/home/me/pytorch/torch/_dynamo/polyfills/__init__.py:5", "torch"),  # torch built from source
        ("<frozen importlib._bootstrap>:241", "python"),
        ("/home/me/mylib/backends/torch/utils.py:7", "user"),  # a user's package named torch: not torch's tree
        ("/home/me/mylib/backends/torch/fx_passes.py:7", "user"),
        ("/home/me/pytorch/torch/_tensor.py:5", "torch"),
        ("<string>:3", "user"),  # exec'd code
        ("<ipython-input-4-1a2b>:2", "user"),
        ("<eval_with_key>.3:12", "torch"),  # torch.fx's generated code
        ("", "unknown"),
    ],
)
def test_a_break_belongs_to_whose_code_holds_it(location: str, owner: str) -> None:
    assert owner_of(location) == owner


def test_the_users_line_is_the_innermost_of_theirs_on_the_way() -> None:
    stack = (
        "/home/me/train.py:40",  # their loop
        "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1789",
        "/home/me/model.py:13",  # their call into the Transformer
        "/venv/lib/python3.11/site-packages/lightning/pytorch/demos/transformer.py:78",
        "/venv/lib/python3.11/site-packages/torch/nn/modules/transformer.py:1245",
    )
    assert user_location(stack) == "/home/me/model.py:13"
    assert user_location(stack[3:]) == ""


def test_torchs_own_words_for_a_break_are_kept() -> None:
    new = parse_break(TORCH_2_13)
    assert new.type == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert new.explanation.startswith("Dynamo does not support tracing `Tensor.item()`")
    assert new.hints == (
        "Set `torch._dynamo.config.capture_scalar_outputs = True` or `export "
        "TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1` to include these operations in the captured graph.",
    )
    assert new.doc_url == "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html"
    old = parse_break(TORCH_2_8)
    assert (old.type, len(old.hints), old.doc_url) == ("Failed to trace builtin operator", 3, "")


def test_the_fix_for_a_break_names_the_users_line_where_the_code_is_not_theirs() -> None:
    text = parse_break(TORCH_2_13)
    assert break_fix("user", text, ["/me/lm.py:14"]).startswith("Set `torch._dynamo.config")
    fix = break_fix("torch", text, ["/me/lm.py:13"])
    assert fix.startswith(
        "torch's code cannot be edited: change how your line /me/lm.py:13 calls it"
    )  # opens from anywhere
    assert "torch's hint: Set `torch._dynamo.config.capture_scalar_outputs = True`" in fix
    both = break_fix("torch", text, ["/me/lm.py:13", "/me/lm.py:20"])
    assert both.startswith("torch's code cannot be edited: change how your lines /me/lm.py:13, /me/lm.py:20 call it")
    assert "report an issue" not in break_fix("torch", parse_break(TORCH_2_8))


def test_a_fix_in_the_frames_own_code_is_no_fix_where_the_frame_is_another_packages() -> None:
    python_value = CAUSES["python_value"]
    assert python_value.fix_for("train") == python_value.fix_for("train", "user") == python_value.fix
    library = python_value.fix_for("validate", "lightning")
    assert library.startswith("lightning's code cannot be edited") and "JitConfig(module_selector=" in library
    # a fix made from outside the frame (the data, the inputs) holds whoever wrote it
    assert CAUSES["last_batch"].fix_for("train", "lightning") == CAUSES["last_batch"].fix


def test_whose_code_a_recompiles_fix_would_change() -> None:
    lightning = "/venv/lib/python3.11/site-packages/lightning/pytorch/core/module.py:386"
    assert recompile_owner("log", lightning) == "lightning"  # compiled only because compiled code calls it
    # a library's layer or model the user compiled: its attributes and inputs are the user's to set
    assert (
        recompile_owner("forward", "/venv/lib/python3.11/site-packages/lightning/pytorch/demos/transformer.py:65")
        == "user"
    )
    assert recompile_owner("step", "/home/me/train.py:12") == "user"


def test_a_frames_first_grad_mode_recompile_is_expected_whatever_the_stage_and_a_second_is_not() -> None:
    # a plain loop evaluates under no_grad with its stage still "train"; a training_step may call a module
    # without gradients too: grad mode has two values, so only the first switch is the price
    classifier = RecompileClassifier()
    classifier.observe("0", "train")
    first = classifier.observe("0", "train", reason="0/0: GLOBAL_STATE changed: grad_mode ", is_recompile=True)
    again = classifier.observe("0", "train", reason="0/1: GLOBAL_STATE changed: grad_mode ", is_recompile=True)
    assert (first.cause, first.expected) == ("stage_switch", True)
    assert (again.cause, again.expected) == ("stage_switch", False)


def test_training_that_meets_a_size_evaluation_left_is_evaluations_item() -> None:
    # the demo Transformer keeps the mask it built for validation's length (torch 2.13 and 2.8 alike)
    classifier = RecompileClassifier()
    classifier.observe("1", "train")
    mask = "tensor 'self.src_mask' size mismatch at index 0. expected 16, actual {}"
    causes = [
        classifier.observe("1", stage, reason=f"1/{n}: " + mask.format(size), is_recompile=True)
        for n, (stage, size) in enumerate((("validating", 24), ("train", 24), ("train", 20)))
    ]
    assert [c and c.cause for c in causes] == ["eval_shape", "eval_shape", "changing_dim"]


def test_validation_meeting_the_length_training_moved_to_is_a_changing_dimension_not_evaluations_shape() -> None:
    # a curriculum: training's sequences grow from 64 to 128 at the second epoch, validation's with them
    classifier = RecompileClassifier()
    classifier.observe("0", "train")
    seq = "tensor 'x' size mismatch at index 1. expected 64, actual 128"
    steps = [
        ("validating", "0/0: GLOBAL_STATE changed: grad_mode "),
        ("train", f"0/0: {seq}"),
        ("validating", f"0/1: {seq}"),
    ]
    causes = [classifier.observe("0", stage, reason=reason, is_recompile=True) for stage, reason in steps]
    assert [c and c.cause for c in causes] == ["stage_switch", "changing_dim", "changing_dim"]


def test_what_changed_is_named_where_torch_names_the_entry_of_another_caller() -> None:
    # two Blocks compiled apart share Block.forward: the first gets the batch, the second activations that need
    # gradients; the last batch holds 6 of 8 (torch 2.13's guard_failures, as recorded)
    first_block = (
        "0/1: tensor 'x' requires_grad mismatch. expected requires_grad=1",
        "0/0: tensor 'x' size mismatch at index 0. expected 8, actual 6",
    )
    second_block = (
        "0/2: tensor 'x' requires_grad mismatch. expected requires_grad=0",
        "0/1: tensor 'x' size mismatch at index 0. expected 8, actual 6",
        "0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0",
    )
    assert telling_reason(first_block) == first_block[1] and telling_reason(second_block) == second_block[1]
    classifier = RecompileClassifier()
    classifier.observe("0", "train", step=0)
    activations = "0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0"  # the second block's first call
    classifier.observe("0", "train", reason=activations, is_recompile=True, step=0)  # the expected shared_code
    for reasons in (first_block, second_block):
        got = classifier.observe(
            "0", "train", reason=telling_reason(reasons), is_recompile=True, step=3, batch_index=3, batches=4
        )
        assert got is not None and got.cause == "last_batch"
    # an input that needs gradients where it did not before, alone, is still said
    assert telling_reason(("0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0",)).endswith("=0")
    parameter = "0/0: tensor 'self.l._parameters['weight']' requires_grad mismatch. expected requires_grad=0"
    assert telling_reason(("0/1: GLOBAL_STATE changed: grad_mode ", parameter)) == parameter


def test_the_first_batch_is_a_batch_not_a_step() -> None:
    # two networks of one class (a GAN's Sequentials) on their own inputs, in the batch that first ran them
    classifier = RecompileClassifier()
    classifier.observe("0", "train", step=0, batch_index=0)
    first_batch: dict[str, Any] = {"is_recompile": True, "step": 0, "batch_index": 0}
    grads = "0/0: tensor 'args[0]' requires_grad mismatch. expected requires_grad=0"
    classifier.observe("0", "train", reason=grads, **first_batch)
    size = "0/0: tensor 'args[0]' size mismatch at index 1. expected 4, actual 8"
    other_net = classifier.observe("0", "train", reason=size, **first_batch)
    assert other_net is not None and (other_net.cause, other_net.expected) == ("shared_code", True)
    # with gradient accumulation the first optimizer step spans batches: the second batch is not the first
    accumulating = RecompileClassifier()
    accumulating.observe("0", "train", step=0, batch_index=0)
    changed = accumulating.observe("0", "train", reason=size, is_recompile=True, step=0, batch_index=1, batches=8)
    assert changed is not None and changed.cause == "changing_dim"


def test_each_entrys_failed_guard_is_read_for_the_caller_it_was_made_for() -> None:
    # a GAN's generator (G) and discriminator (D) share one compiled Sequential.forward; bf16-mixed, the last batch
    # holds 6 of 16. torch 2.13's guard_failures at the discriminator's call on the real images of the last batch:
    # the generator's entry fails first on the width ("index 1. expected 8, actual 12"), the discriminator's own
    # entry for this kind of call (float32, no gradients, its parameters trainable) on the batch size
    g, d_fake, d_real = "G/1/gp", "D/11/df", "D/10/dt"  # modules / grad mode and inputs / parameters (compat.torch)
    classifier = RecompileClassifier()
    calls = [("0/0", g), ("0/1", d_fake), ("0/2", d_real), ("0/3", d_real), ("0/4", g), ("0/5", d_real)]
    for compile_id, caller in calls:
        classifier.observe("0", "train", compile_id=compile_id, caller=caller, step=0, batch_index=0, batches=3)
    reasons = [
        "0/5: tensor 'args[0]' dtype mismatch. expected BFloat16, actual Float",
        "0/4: tensor 'args[0]' size mismatch at index 1. expected 8, actual 12",
        "0/3: tensor 'args[0]' dtype mismatch. expected BFloat16, actual Float",
        "0/2: tensor 'args[0]' size mismatch at index 0. expected 16, actual 6",
        "0/1: tensor 'args[0]' dtype mismatch. expected BFloat16, actual Float",
        "0/0: tensor 'args[0]' size mismatch at index 0. expected 16, actual 6",
    ]
    last = dict(is_recompile=True, step=4, batch_index=2, batches=3, reasons=reasons, reason=reasons[0])
    found = classifier.observe("0", "train", compile_id="0/6", caller=d_real, **last)  # type: ignore[arg-type]
    assert found is not None and (found.cause, found.expected) == ("last_batch", False)
    assert found.reason == reasons[3] and found.subject.endswith("index 0. expected 16, actual 6")
    # the discriminator's first call on float32 images after its bfloat16 fakes, its parameters trainable now: the
    # dtype its other entry failed on is not all that differs (a cast would leave the recompile): the expected price
    first = RecompileClassifier()
    first.observe("0", "train", compile_id="0/0", caller=g, step=0, batch_index=0)
    first.observe("0", "train", compile_id="0/1", caller=d_fake, step=0, batch_index=0)
    new_kind = first.observe(
        "0",
        "train",
        compile_id="0/2",
        caller=d_real,
        is_recompile=True,
        step=0,
        batch_index=0,
        reasons=[reasons[4], "0/0: tensor 'args[0]' size mismatch at index 1. expected 8, actual 12"],
    )
    assert new_kind is not None and (new_kind.cause, new_kind.expected) == ("trainable_params", True)
    # the same caller and kind met with another dtype: the cast is the user's to make, in the first batch too
    dtype = first.observe(
        "0",
        "train",
        compile_id="0/3",
        caller=d_real,
        is_recompile=True,
        step=0,
        batch_index=0,
        reasons=["0/2: tensor 'args[0]' dtype mismatch. expected Float, actual BFloat16", reasons[4]],
    )
    assert dtype is not None and (dtype.cause, dtype.expected) == ("tensor_property", False)


def test_a_size_torch_made_dynamic_and_fixed_again_is_specialized_with_or_without_its_log_line() -> None:
    # a U-Net under inductor, torch 2.13: the height changed, torch's automatic dynamic shapes compiled it dynamic,
    # and inductor fixed it to 24 (set_replacement s53 = 24 (range_refined_to_singleton)); the graph's inputs hold 24
    reason = "0/0: tensor 'x' size mismatch at index 2. expected 16, actual 24"
    recompile: dict[str, Any] = {"reason": reason, "is_recompile": True, "step": 1, "batch_index": 1, "batches": 8}
    seen = RecompileClassifier()
    seen.observe("0", "train", dynamic="auto", step=0, batch_index=0, batches=8)
    logged = seen.observe("0", "train", dynamic="auto", specialized=["L['x'].size()[2]"], **recompile)
    assert logged is not None and logged.cause == "specialized"
    # a graph inductor loaded from its cache logs no decision: the graph's inputs still say it
    cached = RecompileClassifier()
    cached.observe("0", "train", dynamic="auto", step=0, batch_index=0, batches=8)
    found = cached.observe("0", "train", dynamic="auto", input_shapes=["x: [2, 3, 24, 24]"], **recompile)
    assert found is not None and found.cause == "specialized"
    assert "dynamic=True does not help" in CAUSES["specialized"].fix and "mark_dynamic" in CAUSES["specialized"].fix
    # kept dynamic (aot_eager), it is a dimension that changed: dynamic=True or mark_dynamic is the fix
    kept = RecompileClassifier()
    kept.observe("0", "train", dynamic="auto", step=0, batch_index=0, batches=8)
    found = kept.observe("0", "train", dynamic="auto", input_shapes=["x: [2, 3, s53, s0]"], **recompile)
    assert found is not None and found.cause == "changing_dim"
