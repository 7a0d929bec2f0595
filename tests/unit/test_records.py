"""``records``: what a record says to the user."""

from __future__ import annotations

import re

import pytest

from telemetry_jit.records import GraphBreak, NotCompiled, first_step_line


def test_a_module_compiled_to_no_effect_names_the_selector_where_one_reaches_it() -> None:
    reached = NotCompiled("model.encoder", "torch.nn.modules.transformer.TransformerEncoder", "2.13.0", "encoder")
    assert reached.words().startswith("`model.encoder` (TransformerEncoder) was compiled with Module.compile()")
    assert "JitConfig(module_selector='encoder', use_torch=True)" in reached.fix()
    assert "`self.model.encoder = torch.compile(self.model.encoder)`" in reached.fix()
    outside = NotCompiled("head", "torch.nn.modules.linear.Linear", "2.13.0")
    assert "JitConfig" not in outside.fix() and "`self.head = torch.compile(self.head)`" in outside.fix()
    assert NotCompiled.from_attributes(reached.attributes()) == reached


def test_a_graph_breaks_summary_is_its_reasons_first_line() -> None:
    # public: a plug-in's take_splits builds GraphBreaks, and what it shows of one is this line
    assert GraphBreak(reason="  Call to `torch._dynamo.graph_break()`\n  Explanation: ...").summary == (
        "Call to `torch._dynamo.graph_break()`"
    )


@pytest.mark.parametrize(("wall_ms", "compile_ms"), [(2840, 2760), (2849, 2751), (150, 149), (41_240, 38_860)])
def test_a_first_steps_line_adds_up_as_it_reads(wall_ms: float, compile_ms: float) -> None:
    line = first_step_line("train", 0, wall_ms, compile_ms, {})
    wall, compiling, running = map(float, re.findall(r"([\d.]+) s", line))
    assert round(compiling + running, 1) == wall, line
