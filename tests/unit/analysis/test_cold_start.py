"""Why a warm start was cold, from two runs' recorded cache look-ups (no torch needed): the parts of the key
that changed, a key that did not change, graphs the base run never had, and graphs that hit."""

from __future__ import annotations

from telemetry_jit.analysis import cold_start
from telemetry_jit.analysis.cold_start import CacheLedger, explain, option_changed
from telemetry_jit.analysis.runs import EventRecord, SpanRecord

SETTINGS = ["inductor_config[max_autotune]\tmaaa\tFalse", "inductor_config[freezing]\tfrrr\tFalse"]


PARTS = [
    "gm\tgraph1\t",
    "example_inputs[0]\tin0\tparameter float32[8, 8] cpu",
    "example_inputs[1]\tin1\tfloat32[4, 8] cpu",
]


def lookup(state: str, key: str, parts: list[str], settings: str = "s1", table: list[str] | None = None) -> EventRecord:
    attributes = {"cache.layer": "aot_autograd", "cache.state": state, "cache.key": key, "cache.parts": parts}
    attributes["cache.settings"] = settings
    if table is not None:
        attributes["cache.settings_parts"] = table
    return EventRecord("cache_lookup", 0, attributes)


def ledger(*lookups: EventRecord, frame: str = "forward (model.py:5)", seconds: float = 2.0) -> CacheLedger:
    recorded = CacheLedger()
    for index, event in enumerate(lookups):
        span = SpanRecord(f"s{index}", "compilation", None, 0, int(seconds * 1e9), events=[event])
        recorded.add(span, frame, "dynamo", f"{index}/0", "0")
    return recorded


def test_graphs_that_hit_say_nothing() -> None:
    base = ledger(lookup("miss", "k1", PARTS, table=SETTINGS))
    assert explain(base, ledger(lookup("hit", "k1", PARTS, table=SETTINGS))).groups == []


def test_a_changed_setting_is_named_with_both_values_from_each_runs_table() -> None:
    changed = [SETTINGS[0].replace("maaa\tFalse", "mbbb\tTrue"), SETTINGS[1]]
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    cold = explain(base, ledger(lookup("miss", "k2", PARTS, settings="s2", table=changed), seconds=3.5))
    (group,) = cold.groups
    assert group.reason == "setting inductor's max_autotune: False -> True"
    assert (group.graphs, group.seconds, cold.seconds) == (1, 3.5, 3.5)
    assert "keep the setting" in group.fix


def test_the_graph_and_the_models_parameters_come_before_settings_and_inputs() -> None:
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    wider = PARTS[1].replace("in0\tparameter float32[8, 8]", "inX\tparameter float32[12, 8]")
    new_parts = ["gm\tgraph2\t", wider, PARTS[2]]
    (group,) = explain(base, ledger(lookup("miss", "k2", new_parts, table=SETTINGS))).groups
    assert group.reason == "the graph itself changed (the code dynamo traced) (and 1 more part)"
    assert [change.name for change in group.changes] == ["gm", "example_inputs[0]"]
    (group,) = explain(base, ledger(lookup("miss", "k2", [PARTS[0], *new_parts[1:]], table=SETTINGS))).groups
    assert group.reason == "a parameter's shape or dtype (graph input 0): float32[8, 8] -> float32[12, 8]"


def test_the_same_key_means_the_entry_was_not_there_and_the_fix_shares_the_cache() -> None:
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    (group,) = explain(base, ledger(lookup("miss", "k1", PARTS, table=SETTINGS))).groups
    assert group.reason.startswith("the same key as in the base run")
    assert "TORCHINDUCTOR_CACHE_DIR" in group.fix and group.changes == []


def test_a_key_the_base_run_had_from_loaded_artifacts_says_this_run_did_not_load_them() -> None:
    loaded = lookup("hit", "k1", PARTS, table=SETTINGS)
    loaded.attributes["cache.loaded_artifact"] = True
    (group,) = explain(ledger(loaded), ledger(lookup("miss", "k1", PARTS, table=SETTINGS))).groups
    assert group.reason.endswith("(torch.compiler.load_cache_artifacts); this run did not load them")
    assert group.fix.startswith("load the same artifacts before the first compile")
    # a key that changed is explained by what changed, loaded or not
    changed = [SETTINGS[0].replace("maaa\tFalse", "mbbb\tTrue"), SETTINGS[1]]
    (group,) = explain(ledger(loaded), ledger(lookup("miss", "k2", PARTS, settings="s2", table=changed))).groups
    assert group.reason == "setting inductor's max_autotune: False -> True"


def test_misses_are_grouped_by_reason_with_counts_and_seconds_costliest_first() -> None:
    base = ledger(*(lookup("hit", f"k{i}", PARTS, table=SETTINGS) for i in range(3)))
    new = ledger(
        lookup("miss", "k0", PARTS, table=SETTINGS),
        lookup("miss", "k1", PARTS),
        lookup("miss", "x2", [*PARTS[:2], "example_inputs[1]\tother\tfloat64[4, 8] cpu"]),
        lookup("miss", "k3", PARTS),  # the base run never looked this graph up
    )
    cold = explain(base, new)
    assert [(group.graphs, group.seconds) for group in cold.groups] == [(2, 4.0), (1, 2.0), (1, 2.0)]
    assert {group.reason.split(" (")[0].split(":")[0] for group in cold.groups} == {
        "the same key as in the base run, but the entry was not in this run's cache",
        "an input's dtype, shape or layout",
        "a graph the base run did not compile",
    }


def test_a_base_run_without_look_ups_explains_nothing_and_says_so() -> None:
    cold = explain(CacheLedger(), ledger(lookup("miss", "k1", PARTS, table=SETTINGS)))
    assert cold.groups == [] and cold.as_json()["recorded"] == {"base": False, "new": True}


def test_aot_autograds_look_up_stands_for_the_graph_whatever_order_torch_says_them_in() -> None:
    fx_miss = EventRecord("cache_lookup", 0, {**lookup("miss", "f1", PARTS).attributes, "cache.layer": "fx_graph"})
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    changed = [SETTINGS[0].replace("maaa\tFalse", "mbbb\tTrue"), SETTINGS[1]]
    new = CacheLedger()
    span = SpanRecord("s0", "compilation", None, 0, 10**9, events=[fx_miss, lookup("miss", "k2", PARTS, "s2", changed)])
    new.add(span, "forward (model.py:5)", "dynamo", "0/0", "0")  # torch 2.8: inductor's look-up is said first
    (group,) = explain(base, new).groups
    assert group.reason == "setting inductor's max_autotune: False -> True" and group.graphs == 1


def test_a_new_torch_is_named_first_with_both_versions_whatever_else_it_changed() -> None:
    base = ledger(lookup("hit", "k1", [*PARTS, "torch_version\tv28\t2.8.0"], table=SETTINGS))
    newer = ["gm\tgraph2\t", *PARTS[1:], "torch_version\tv213\t2.13.0"]
    (group,) = explain(base, ledger(lookup("miss", "k2", newer, table=SETTINGS))).groups
    assert group.reason == "torch_version changed: 2.8.0 -> 2.13.0 (and 1 more part)"
    assert "pin torch" in group.fix


def test_triton_and_cuda_are_versions_and_the_gpu_is_the_machine_as_inductor_keys_them_on_a_gpu() -> None:
    """On a GPU, inductor keys every graph by ``system_info``: the device's name and the triton and CUDA versions
    (``CacheBase.get_system``), one part per entry; written here as a GPU run records them."""
    gpu = [
        "system_info[device]\td1\t{'name': 'NVIDIA H100 80GB HBM3'}",
        "system_info[version]\tv1\t{'triton': '3.4.0'}",
    ]
    base = ledger(lookup("hit", "k1", [*PARTS, *gpu], table=SETTINGS))
    triton = [*PARTS, gpu[0], "system_info[version]\tv2\t{'triton': '3.5.0'}"]
    (group,) = explain(base, ledger(lookup("miss", "k2", triton, table=SETTINGS))).groups
    assert group.reason == "system_info[version] changed: {'triton': '3.4.0'} -> {'triton': '3.5.0'}"
    assert "pin torch and triton" in group.fix
    other_gpu = [*PARTS, "system_info[device]\td2\t{'name': 'NVIDIA A100-SXM4-80GB'}", gpu[1]]
    (group,) = explain(base, ledger(lookup("miss", "k3", other_gpu, table=SETTINGS))).groups
    assert group.reason.startswith("system_info[device]: {'name': 'NVIDIA H100 80GB HBM3'} -> {'name': 'NVIDIA A100")
    assert "kind of machine" in group.fix


def test_a_process_group_name_baked_into_the_graph_is_named_before_the_graph_it_changed() -> None:
    """pytorch/pytorch#189330: a job that makes one more process group first gives the group the graph uses another
    name, and every graph with a collective misses."""
    base = ledger(lookup("hit", "k1", ["gm\tgraph1\t", "gm[process_groups]\t'1'\t'1'", *PARTS[1:]], table=SETTINGS))
    renamed = ["gm\tgraph2\t", "gm[process_groups]\t'2'\t'2'", *PARTS[1:]]
    (group,) = explain(base, ledger(lookup("miss", "k2", renamed, table=SETTINGS))).groups
    assert group.reason == "the process group's name baked into the graph's collectives: '1' -> '2' (and 1 more part)"
    assert "same process groups in the same order" in group.fix


def test_torchs_global_state_is_named_by_the_call_that_sets_it_one_knob_once() -> None:
    """``Trainer(deterministic=True)`` changes three parts (torch.use_deterministic_algorithms sets inductor's
    ``deterministic`` too), ``torch.set_float32_matmul_precision`` one, as torch 2.13 records them."""
    state = ["deterministic_algorithms\tdf\tFalse", "deterministic_algorithms_settings\tdsf\t(False, False, True)"]
    matmul = "cuda_matmul_settings\tmm1\t('none', True, True)"
    table = [*SETTINGS, "inductor_config[deterministic]\tidf\tFalse"]
    base = ledger(lookup("hit", "k1", [*PARTS, *state, matmul], table=table))
    on = [line.replace("\tdf\tFalse", "\tdt\tTrue").replace("dsf\t(False", "dst\t(True") for line in state]
    on_table = [*SETTINGS, "inductor_config[deterministic]\tidt\tTrue"]
    (group,) = explain(base, ledger(lookup("miss", "k2", [*PARTS, *on, matmul], "s2", on_table))).groups
    assert group.reason == (
        "deterministic algorithms (torch.use_deterministic_algorithms, which Trainer(deterministic=True) calls): "
        "False -> True"
    )
    assert [change.name for change in group.changes] == [
        "deterministic_algorithms",
        "deterministic_algorithms_settings",
        "inductor_config[deterministic]",
    ]
    assert group.fix.startswith("nothing to fix if you changed it on purpose")
    tf32 = matmul.replace("mm1\t('none'", "mm2\t('tf32'")
    (group,) = explain(base, ledger(lookup("miss", "k3", [*PARTS, *state, tf32], table=table))).groups
    assert group.reason == (
        "the float32 matmul precision (torch.set_float32_matmul_precision, torch.backends.cuda.matmul.allow_tf32): "
        "('none', True, True) -> ('tf32', True, True)"
    )


def test_autocast_is_named_off_or_its_dtype_as_torch_2_13_and_2_15_key_it() -> None:
    """torch 2.13 keys a device's autocast dtype only while it is on; 2.15 ``(enabled, dtype)`` for every device."""
    words = "autocast on cpu (Trainer(precision='bf16-mixed' or '16-mixed'), torch.autocast): off -> bfloat16"
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    on = [*PARTS, "autocast_state[cpu]\tac1\ttorch.bfloat16"]
    (group,) = explain(base, ledger(lookup("miss", "k2", on, table=SETTINGS))).groups
    assert group.reason == words
    base = ledger(lookup("hit", "k1", [*PARTS, "autocast_state[cpu]\tac0\t(False, torch.bfloat16)"], table=SETTINGS))
    on = [*PARTS, "autocast_state[cpu]\tac1\t(True, torch.bfloat16)"]
    (group,) = explain(base, ledger(lookup("miss", "k2", on, table=SETTINGS))).groups
    assert group.reason == words
    assert group.fix.startswith("nothing to fix if you changed it on purpose")


def test_another_cpu_thread_count_is_named_with_the_settings_that_choose_it() -> None:
    """Inductor builds its CPU code for a thread count and keys the graph by it: a machine with other cores,
    or OMP_NUM_THREADS, misses."""
    base = ledger(lookup("hit", "k1", [*PARTS, "cpp_runtime_thread_count\tt2\t2"], table=SETTINGS))
    one_thread = [*PARTS, "cpp_runtime_thread_count\tt1\t1"]
    (group,) = explain(base, ledger(lookup("miss", "k2", one_thread, table=SETTINGS))).groups
    assert group.reason.startswith(
        "the CPU threads inductor's code is built for (torch.set_num_threads, OMP_NUM_THREADS"
    )
    assert group.reason.endswith("by default the machine's cores): 2 -> 1")
    assert "set it as the run that filled the cache did" in group.fix


def test_aot_compile_is_offered_only_to_a_run_without_graph_breaks() -> None:
    residual = cold_start.Residual(total_s=4.0, timed=True)
    residual.phases_s.update(dynamo_tracing=2.0, guards=0.5, cache_load=0.7)
    features = ["set_stance", "cache_artifacts", "aot_compile"]
    whole = cold_start.removable_by(residual, features, saved_s=10.0)[0]
    assert whole["feature"].startswith("AOT compile") and whole["available"] and whole["saves_s"] == 3.2
    broken = cold_start.removable_by(residual, features, saved_s=10.0, graph_breaks=3)[0]
    # AOT compile takes one whole graph: a run whose model breaks into pieces cannot load it, so it saves nothing
    assert not broken["available"] and broken["saves_s"] == 0.0
    assert broken["note"].startswith("not for this run: its 3 graph breaks split the model")


def test_one_compile_that_missed_two_graphs_counts_its_seconds_once() -> None:
    """Issue 63: a 268 s compile that missed its forward's and its backward's inductor graph was counted twice
    (827 s missed for a run that compiled 565 s in all)."""

    def inductor(state: str, key: str, graph: str) -> EventRecord:
        event = lookup(state, key, [f"gm\t{graph}\t", *PARTS[1:]], table=SETTINGS)
        event.attributes["cache.layer"] = "inductor"
        return event

    def one_compile(*events: EventRecord) -> CacheLedger:
        recorded = CacheLedger()
        recorded.add(
            SpanRecord("s0", "compilation", None, 0, int(268e9), events=list(events)), "fw", "dynamo", "0/0", "0"
        )
        return recorded

    base = one_compile(inductor("miss", "f1", "fw1"), inductor("miss", "b1", "bw1"))
    cold = explain(base, one_compile(inductor("miss", "f2", "fw2"), inductor("miss", "b2", "bw2")))
    assert (cold.graphs, cold.seconds) == (2, 268.0)


def test_a_changed_compile_option_is_named_where_the_fix_would_say_the_code_changed() -> None:
    base = ledger(lookup("hit", "k1", PARTS, table=SETTINGS))
    cold = explain(base, ledger(lookup("miss", "k2", ["gm\tgraph2\t", *PARTS[1:]], table=SETTINGS)))
    assert cold.groups[0].fix.startswith("nothing to fix if you changed the model on purpose")
    option_changed(cold.groups, ["dynamic: auto -> true"])
    (group,) = cold.groups
    assert group.fix.startswith("the torch.compile option dynamic: auto -> true changed between the runs")
    assert "changed the model" not in group.fix
