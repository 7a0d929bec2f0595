"""``records``: what a record says to the user."""

from __future__ import annotations

from telemetry_jit.records import GraphBreak, NotCompiled


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
