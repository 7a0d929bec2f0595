"""JitConfig validation and module selection semantics."""

from __future__ import annotations

import pytest
import torch

from telemetry_jit import JitConfig, JitTransform, resolve_root, select_modules
from telemetry_jit.compat.torch import compiled_call
from telemetry_jit.lightning.jit_transform import JitConfigError, select, selector_for
from tests.models import Net


def tree() -> torch.nn.Module:
    root = torch.nn.Module()
    for branch in ("enc", "dec"):
        parent = torch.nn.Module()
        for name in ("layer0", "layer1", "norm"):
            parent.add_module(name, torch.nn.Linear(2, 2))
        root.add_module(branch, parent)
    root.scale = 3.0
    return root


def names(selector: str) -> list[str]:
    return [name for name, _ in select_modules(tree(), selector)]


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = torch.nn.Linear(4, 4)
        self.self_attn_out = torch.nn.Linear(4, 4)
        self.mlp = torch.nn.Linear(4, 4)


class Layered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Attention() for _ in range(2))


def selected(root: torch.nn.Module, config: JitConfig) -> list[str]:
    return [name for name, _ in select(root, config)]


@pytest.mark.parametrize("selector", ["", "*"])
def test_empty_and_star_select_the_root(selector: str) -> None:
    root = tree()
    assert select_modules(root, selector) == [("", root)]


def test_dotted_path_selects_one_module() -> None:
    assert names("enc.layer1") == ["enc.layer1"]


def test_glob_at_any_depth_selects_grandchildren() -> None:
    # NeMo stops at the first wildcard and would return every child of the root here.
    assert names("*.layer*") == ["enc.layer0", "enc.layer1", "dec.layer0", "dec.layer1"]


def test_glob_in_the_middle() -> None:
    assert names("*.norm") == ["enc.norm", "dec.norm"]
    assert names("d?c.layer[01]") == ["dec.layer0", "dec.layer1"]


def test_selector_matching_nothing_lists_the_names_at_that_level() -> None:
    with pytest.raises(LookupError, match=r"no child of enc .*'layer9'.*\['layer0', 'layer1', 'norm'\]"):
        select_modules(tree(), "enc.layer9")
    with pytest.raises(LookupError, match=r"\['dec', 'enc'\]"):
        select_modules(tree(), "encoder")


@pytest.mark.parametrize("selector", ["zz*", "*zz", "enc.zz*", "enc.*9"])
@pytest.mark.parametrize("style", ["auto", "glob", "nemo"])
def test_a_wildcard_selector_matching_nothing_is_an_error_in_every_style(selector: str, style: str) -> None:
    config = JitConfig(use_torch=True, module_selector=selector, selector_style=style)
    with pytest.raises(LookupError, match="matches nothing"):
        select(tree(), config)


def test_selector_naming_a_non_module_attribute() -> None:
    with pytest.raises(TypeError, match="'scale'.*float, not an nn.Module"):
        select_modules(tree(), "scale")


@pytest.mark.parametrize("selector", ["enc..layer0", ".enc", "enc."])
def test_malformed_selector_fails_at_construction(selector: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        JitConfig(use_torch=True, module_selector=selector)


def test_non_string_selector() -> None:
    with pytest.raises(TypeError, match="module_selector must be a str"):
        JitConfig(use_torch=True, module_selector=["enc"])  # type: ignore[arg-type]


def test_torch_and_thunder_together_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="use_torch and use_thunder cannot both be True"):
        JitConfig(use_torch=True, use_thunder=True)


def test_unknown_torch_kwargs_are_named() -> None:
    with pytest.raises(ValueError, match=r"\['fulgraph'\].*Valid: .*'fullgraph'"):
        JitConfig(use_torch=True, torch_kwargs={"fulgraph": True})


def test_transform_rejects_what_is_not_a_config() -> None:
    with pytest.raises(TypeError, match="JitConfig or a list of JitConfig, got dict"):
        JitTransform({"use_torch": True})  # type: ignore[arg-type]


def test_root_is_model_attribute_like_nemo() -> None:
    net = Net()
    assert resolve_root(net) is net.model
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert resolve_root(plain) is plain


def test_torch_kwargs_pass_through_and_compile_once() -> None:
    net = Net()
    transform = JitTransform(
        [
            JitConfig(use_torch=True, module_selector="layer*", torch_kwargs={"backend": "eager", "fullgraph": True}),
            JitConfig(use_torch=True, module_selector="layer0", torch_kwargs={"backend": "aot_eager"}),
        ]
    )
    transform._compile(net)
    transform._compile(net)  # a second epoch compiles nothing more
    assert transform.compiled == ["layer0", "layer1"]
    compiled = compiled_call(net.model.layer0)
    assert compiled is not None
    assert compiled_call(net.model.head) is None
    assert net._compiled is True
    # state_dict keys are those of the plain model
    assert set(net.state_dict()) == set(Net().state_dict())


def test_nemo_configs_never_change_meaning_silently() -> None:
    root = Layered()
    # NeMo stops at the first wildcard (each layer); glob matching goes on to the attention modules
    with pytest.raises(
        JitConfigError, match=r"\['layers.0.self_attn', 'layers.1.self_attn'\].*\['layers.0', 'layers.1'\]"
    ):
        selected(root, JitConfig(use_torch=True, module_selector="layers.*.self_attn"))
    assert selected(root, JitConfig(use_torch=True, module_selector="layers.*.self_attn", selector_style="nemo")) == [
        "layers.0",
        "layers.1",
    ]
    assert selected(root, JitConfig(use_torch=True, module_selector="layers.*.self_attn", selector_style="glob")) == [
        "layers.0.self_attn",
        "layers.1.self_attn",
    ]
    # NeMo's re.match is anchored at the start only: "*attn" also selects "self_attn_out"
    layer = root.layers[0]
    with pytest.raises(JitConfigError, match=r"\['self_attn'\] with glob.*\['self_attn', 'self_attn_out'\] with NeMo"):
        selected(layer, JitConfig(use_torch=True, module_selector="*attn"))
    assert selected(layer, JitConfig(use_torch=True, module_selector="*attn", selector_style="nemo")) == [
        "self_attn",
        "self_attn_out",
    ]
    # where both read a selector alike, nothing to say
    assert selected(root, JitConfig(use_torch=True, module_selector="layers.*")) == ["layers.0", "layers.1"]


def test_nemo_defaults_and_errors_keep_their_meaning() -> None:
    root = Layered()
    assert selected(root, JitConfig(use_torch=True, module_selector=None)) == [""]  # NeMo's "the whole model"
    with pytest.raises(AssertionError, match="cannot both be True"):  # as NeMo raises it
        JitConfig(use_torch=True, use_thunder=True)
    with pytest.raises(ValueError, match="cannot both be True"):
        JitConfig(use_torch=True, use_thunder=True)
    transform = JitTransform(JitConfig(use_torch=True))
    transform.config = JitConfig(use_torch=True, module_selector="layers")  # assignable, as in NeMo
    assert transform.config.module_selector == "layers" and transform.configs == [transform.config]


def test_a_module_marked_compiled_is_left_alone() -> None:
    net = Net()
    net._compiled = True  # NeMo's marker, set by the user or an earlier transform
    JitTransform(JitConfig(use_torch=True, torch_kwargs={"backend": "eager"}))._compile(net)
    assert compiled_call(net.model) is None


def test_the_selector_named_for_a_module_selects_it() -> None:
    net = Net()  # selectors resolve against net.model
    for path, module in net.named_modules():
        selector = selector_for(net, path)
        if path == "" or not path.startswith("model"):
            assert selector == "", path  # outside the root: no selector reaches it
        else:
            assert [m for _, m in select(resolve_root(net), JitConfig(module_selector=selector))] == [module], path
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))  # no .model: the module itself is the root
    assert (selector_for(plain, ""), selector_for(plain, "0")) == ("*", "0")
