"""Reading torch's cache look-ups (``compat/compile_cache``): the parts of a key as torch 2.8 - 2.15 write
them, shortened for people, and the look-up events of a real compile."""

from __future__ import annotations

import torch

from telemetry_jit.compat import compile_cache
from telemetry_jit.probes.log_taps import LogTap, cache_bypass_log

GM = """GraphModule()



def forward(self, p_0 : torch.nn.parameter.Parameter, p_1 : torch.Tensor):
    linear = torch._C._nn.linear(p_1, p_0);  p_0 = p_1 = None
    return (linear,)"""


COMPONENTS = [
    f"[4sfbocuwcptxczysz2cypsqgoyupimm4kooiss7nycgo6wwjnc6] gm: {GM}",
    "[ifcqr4f7nddsjb55kwo2bhqkw72m7mudamdc3gl3u7zqyxo4fy4] example_inputs[0]: TensorMetadata(dtype=torch.float32, "
    "shape=torch.Size([8, 8]), stride=(8, 1), device=device(type='cpu'), layout=torch.strided, memory_format=None)",
    "[swllrjo2cflhqhfdmfic3efkmdzrn5h6uvbccmnmtjtxuto7iad] example_inputs[1]: TensorMetadata(dtype=torch.bfloat16, "
    "shape=torch.Size([8, 4]), stride=(1, 8), device=device(type='cuda', index=1), layout=torch.strided)",
    "[sjldm5hyfytkdkxlfj3fhwi432gtpoqk3r6uo4z3lfs7aiipms3] torch_version: \x8e\x00\x01binary",
    "[esstihe2nyydk4mhzpvox3qkajyu5y5t23hk3fi2me7jn75xi3o] inductor_config[max_autotune]: False",
    "[cev5uo2jlwdhw2uyzcm7vr6cl23azjfw437f5r5lskm7spucos6] grad_enabled: True",
]


def compile_watched(*taps: LogTap) -> list[compile_cache.Lookup]:
    """The look-ups a real inductor compile hands the watcher (with ``taps`` installed meanwhile)."""
    seen: list[compile_cache.Lookup] = []
    for tap in taps:
        tap.install()
    compile_cache.watch(seen.append)
    try:
        torch._dynamo.reset()
        torch.compile(torch.nn.Linear(4, 4), backend="inductor")(torch.randn(2, 4))
    finally:
        compile_cache.unwatch(seen.append)
        for tap in taps:
            tap.uninstall()
        torch._dynamo.reset()
    return seen


def test_parts_are_hashes_with_readable_values_and_settings_apart() -> None:
    lookup = compile_cache.parse_lookup("autograd_cache_miss", {"key": "akey", "components": COMPONENTS})
    assert lookup is not None and (lookup.layer, lookup.state, lookup.key) == ("aot_autograd", "miss", "akey")
    assert lookup.parts == {
        "gm": ("4sfbocuwcp", ""),  # the code is long: its hash tells whether it changed
        "example_inputs[0]": ("ifcqr4f7nd", "parameter float32[8, 8] cpu"),  # contiguous: no stride said
        "example_inputs[1]": ("swllrjo2cf", "bfloat16[8, 4] stride (1, 8) cuda:1"),
        "torch_version": ("sjldm5hyfy", torch.__version__),  # torch hashes it as bytes: named as the running one
        "grad_enabled": ("cev5uo2jlw", "True"),
    }
    assert lookup.settings == {"inductor_config[max_autotune]": ("esstihe2ny", "False")}
    digest = compile_cache.settings_digest(lookup.settings)
    assert digest and digest == compile_cache.settings_digest(dict(lookup.settings))
    assert digest != compile_cache.settings_digest({"inductor_config[max_autotune]": ("other", "True")})


def test_a_look_up_carries_its_settings_digest_for_every_listener() -> None:
    lookup = compile_cache.parse_lookup("fx_graph_cache_miss", {"key": "fkey", "components": COMPONENTS})
    assert lookup is not None and lookup.settings_digest == compile_cache.settings_digest(lookup.settings)
    assert "settings_digest" in vars(lookup)  # computed once: the probe and the heartbeat read the same value


def test_other_events_and_unknown_states_are_not_look_ups() -> None:
    assert compile_cache.parse_lookup("fx_graph_cache_disabled", {}) is None
    assert compile_cache.parse_lookup("dynamo", {"key": "x"}) is None
    hit = compile_cache.parse_lookup("fx_graph_cache_hit", {"key": "f", "time_saved_ns": 2_500_000_000})
    assert hit is not None and (hit.layer, hit.saved_s, hit.parts) == ("fx_graph", 2.5, {})


def test_a_real_compile_hands_its_look_ups_to_the_watcher() -> None:
    seen = compile_watched()
    assert seen and all(lookup.state in ("hit", "miss", "bypass") for lookup in seen)
    assert all(lookup.key for lookup in seen if lookup.state != "bypass")
    from torch._dynamo.utils import ChromiumEventLogger

    assert ChromiumEventLogger.log_instant_event.__module__ == "torch._dynamo.utils"  # unwatched: torch's own again


def test_the_process_groups_a_graphs_collectives_name_are_a_part_of_their_own() -> None:
    code = GM.replace(
        "    return (linear,)",
        "    tensor = torch.ops._c10d_functional.all_reduce(linear, 'sum', '3');  linear = None\n"
        "    gathered = torch.ops._c10d_functional.all_gather_into_tensor.default(tensor, 2, '1')\n"
        "    wait_tensor = torch.ops._c10d_functional.wait_tensor(gathered);  gathered = None\n"
        "    return (wait_tensor,)",
    )
    parts = compile_cache.parse_parts([f"[4sfbocuwcptxczysz2cypsqgoyupimm4kooiss7nycgo6wwjnc6] gm: {code}"])
    assert parts[compile_cache.PROCESS_GROUPS] == ("'1', '3'", "'1', '3'")
    assert compile_cache.PROCESS_GROUPS not in compile_cache.parse_parts(COMPONENTS)  # no collective, no part


def test_an_aot_autograd_miss_is_told_once_with_its_parts_before_the_graph_compiles(tmp_path, monkeypatch) -> None:
    """torch 2.8 - 2.12 hand AOTAutograd's look-up over only after compiling the graph it missed; its log says the
    miss before (read by the cache log tap): told then, with the key's parts, before inductor's own look-ups made
    while compiling that graph, and not told again when torch's event comes."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # an empty cache: every look-up misses
    seen = compile_watched(cache_bypass_log())
    layers = [(lookup.layer, lookup.state) for lookup in seen]
    assert layers[0] == ("aot_autograd", "miss"), layers  # before the FX graph cache's look-ups inside its compile
    assert "fx_graph" in {layer for layer, _ in layers}
    aot = [lookup for lookup in seen if lookup.layer == "aot_autograd"]
    assert len({lookup.key for lookup in aot}) == len(aot)  # each look-up told once
    assert "gm" in aot[0].parts and aot[0].settings  # the key's parts, the settings apart
