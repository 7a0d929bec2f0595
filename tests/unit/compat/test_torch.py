"""``compat.torch``: what torch's records, logs and compile ids say, parsed as each torch version writes them."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from telemetry_jit.compat import torch as torch_compat
from tests.unit.test_causes import TEMPERATURE_FAILURES


def record(name: str, msg: str, *args: object, level: int = logging.DEBUG) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args or None, None)


# what torch 2.8 - 2.15 log, copied from their runs
BREAK = (
    "Graph break in user code at /home/me/model.py:58\n"
    "Graph Break Reason: Call to `torch._dynamo.graph_break()`\n"
    "  Explanation: User-inserted graph break.\n"
    "User code traceback:\n"
    '  File "/home/me/model.py", line 58, in forward\n'
)


def metrics(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**fields)


class Own(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_a_graph_break_record_gives_its_user_line_and_reason() -> None:
    parsed = torch_compat.parse_graph_break(record("torch._dynamo.symbolic_convert.__graph_breaks", BREAK))
    assert parsed is not None
    location, reason = parsed
    assert location == "/home/me/model.py:58"
    assert reason.startswith("Call to `torch._dynamo.graph_break()`")
    assert torch_compat.parse_graph_break(record("torch._dynamo.symbolic_convert", "tracing forward")) is None


def test_ddp_optimizers_line_gives_its_bucket_cap_and_buckets() -> None:
    message = "\nDDPOptimizer used bucket cap %s and created %d buckets. Enable debug logs for detailed bucket info."
    line = record(torch_compat.DDP_LOGGER, message, 26214400, 3)
    assert torch_compat.parse_ddp_buckets(line) == (26214400, 3)
    assert torch_compat.parse_ddp_buckets(record(torch_compat.DDP_LOGGER, "something else")) is None


@pytest.mark.parametrize(
    ("logger", "msg", "expected"),
    [
        (
            "torch._inductor.codecache",
            "Bypassing FX Graph Cache because '%s'",
            "fx_graph: Can't cache HigherOrderOperators.",
        ),
        (
            "torch._functorch._aot_autograd.autograd_cache",
            "Bypassing autograd cache due to: %s",
            "aot_autograd: Can't cache HigherOrderOperators.",
        ),
    ],
)
def test_a_cache_bypass_line_names_the_cache_and_torchs_reason(logger: str, msg: str, expected: str) -> None:
    assert torch_compat.parse_cache_bypass(record(logger, msg, "Can't cache HigherOrderOperators.")) == expected
    assert torch_compat.parse_cache_bypass(record("torch._inductor.codecache", "fx graph cache hit")) is None


def test_dynamos_frame_skip_line_is_recognised() -> None:
    skip = "Skipping frame because there is a graph break in a for/while loop\n%s"
    assert torch_compat.is_frame_skip(record(torch_compat.FRAME_SKIP_LOGGER, skip, "frame", level=logging.INFO))
    assert not torch_compat.is_frame_skip(record(torch_compat.FRAME_SKIP_LOGGER, "Step 1: torchdynamo start"))


@pytest.mark.parametrize(
    ("compile_id", "frame", "attempt"),
    [("0/0", "0", 0), ("3/1", "3", 1), ("12/4_1", "12", 4), ("!0/2", "!0", 2), ("x", "", 0)],
)
def test_a_compile_id_gives_its_frame_and_which_compile_of_it(compile_id: str, frame: str, attempt: int) -> None:
    assert (torch_compat.compile_frame_id(compile_id), torch_compat.compile_attempt(compile_id)) == (frame, attempt)


def test_a_frame_dynamo_could_not_trace_fell_back_to_eager() -> None:
    text, fell_back, limit = torch_compat.failure(metrics(fail_type="Unsupported", fail_reason="print is not traced"))
    assert (text, fell_back, limit) == ("print is not traced", True, False)


def test_the_recompile_limit_is_recognised_by_either_of_its_names() -> None:
    for reason in ("cache_size_limit reached", "hit config.recompile_limit (8)"):
        _, fell_back, limit = torch_compat.failure(metrics(fail_type="RecompileLimitExceeded", fail_reason=reason))
        assert fell_back and limit


def test_a_backend_error_falls_back_only_under_suppress_errors() -> None:
    failing = {"fail_type": "BackendCompilerFailed", "fail_reason": "inductor raised"}
    assert torch_compat.failure(metrics(**failing, config_suppress_errors=False)) == ("inductor raised", False, False)
    assert torch_compat.failure(metrics(**failing, config_suppress_errors=True))[1]
    assert torch_compat.failure(metrics(fail_type=None)) == ("", False, False)


def test_phase_times_counts_and_cache_outcome_take_only_what_torch_filled_in() -> None:
    metric = metrics(
        entire_frame_compile_time_s=1.5,
        backend_compile_time_s=None,
        backward_cumulative_compile_time_us=250_000,
        graph_op_count=7,
        guard_count=None,
        inductor_fx_local_cache_hit_count=2,
        remote_cache_time_saved_s=0.5,
    )
    assert torch_compat.phase_times(metric) == {"dynamo": 1.5, "backward": 0.25}
    assert torch_compat.counts(metric) == {"graph_op_count": 7}
    assert torch_compat.cache_outcome(metric) == {"fx_graph_local_hits": 2, "time_saved_s": 0.5}


def test_module_compile_of_torchs_own_layers_is_known_to_compile_nothing_before_torch_2_15() -> None:
    untouched, given, in_place, own = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), Own()
    given.compile(backend="eager")
    torch_compat.compile_in_place(in_place, backend="eager")  # JitTransform's way: a frame of its own per class
    own.compile(backend="eager")  # the user's forward: dynamo traces it on every release
    assert torch_compat.compiles_nothing(given) is (not torch_compat.MODULE_COMPILE_TRACES_TORCH_LAYERS)
    assert not any(torch_compat.compiles_nothing(module) for module in (untouched, in_place, own))
    if not torch_compat.MODULE_COMPILE_TRACES_TORCH_LAYERS:  # the fact it rests on, as torch shows it
        before = torch_compat.frames_compiled()
        given(torch.randn(3, 2))
        assert torch_compat.frames_compiled() == before


def test_each_recompiles_reasons_are_read_from_torchs_list_of_guard_failures() -> None:
    assert torch_compat.last_recompiles_reasons(TEMPERATURE_FAILURES[:1]) == ("0/0: GLOBAL_STATE changed: grad_mode ",)
    assert torch_compat.last_recompiles_reasons(TEMPERATURE_FAILURES[:3]) == tuple(TEMPERATURE_FAILURES[1:3])
    assert torch_compat.last_recompiles_reasons(TEMPERATURE_FAILURES) == tuple(TEMPERATURE_FAILURES[3:])
    assert torch_compat.last_recompiles_reasons([]) == ()


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_the_inductor_mode_is_read_back_from_the_options_torch_compile_gives_it(mode: str) -> None:
    """compile.mode: what torch.compile(mode=...) builds for inductor (its own wrapper, the backend dynamo's
    ``_compile`` holds) reads back as that mode."""
    backend = torch._TorchCompileInductorWrapper(mode, None, False)
    assert backend.compiler_name == "inductor"
    assert torch_compat._inductor_mode(backend.config) == mode


def test_an_option_whose_value_cannot_be_compared_leaves_the_mode_unsaid() -> None:
    class Unanswerable:  # an option value whose == raises, as an array's truth value does
        def __eq__(self, other: object) -> bool:
            raise ValueError("the truth value of an array is ambiguous")

    settings = {name: Unanswerable() for name in torch._TorchCompileInductorWrapper("max-autotune", None, False).config}
    assert torch_compat._inductor_mode(settings) == ""


def test_input_shapes_read_only_the_inputs_of_torchs_record_of_every_node() -> None:
    """torch writes every node's shape (megabytes for a large model) as a dict's repr: the inputs are read from it,
    parameters and intermediate nodes passed over, whatever the rest of it holds (parsing it whole cost a llama's
    training step 0.6 s on torch 2.15)."""
    graph = ", ".join(f"'layer_{i}': [[s77, 4], <SymInt {i}>]" for i in range(20_000))  # not Python literals
    shapes = (
        "{'l_x_': ['s77', 4, 's53'], 'l_self_modules_fc_parameters_weight_': [4, 4], "
        f"'l_kwargs_mask_': ['s77'], {graph}}}"
    )
    said = torch_compat.input_shapes(SimpleNamespace(graph_node_shapes=shapes))
    assert said == ["x: [s77, 4, s53]", "kwargs[mask]: [s77]"]
    assert torch_compat.input_shapes(SimpleNamespace(graph_node_shapes="{'l_y_': [2, 3], 'relu': [2, 3]}")) == [
        "y: [2, 3]"
    ]
