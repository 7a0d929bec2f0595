"""Cache outcome on compilation spans: a real inductor run done twice against one cache folder, in
two processes; the second run's spans show the cache hits torch counts, and the summary says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import telemetry_jit
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.analysis.report import render_report
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.compat import torch as torch_compat
from telemetry_jit.schema import JitEventName, RanksAttr
from tests.words import flat

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import dataclasses, json, sys
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
import torch
import telemetry_jit
from torch._dynamo.utils import get_compilation_metrics
from tests.models import TRAINER_DEFAULTS, Net, loader

provider = telemetry_jit.configure("cache", file={path!r}, global_batch_size=4)
config = telemetry_jit.JitConfig(use_torch=True, module_selector="", torch_kwargs={{"backend": "inductor"}})
HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config)
HookedTrainer(max_epochs=1, limit_val_batches=0, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
telemetry_jit.shutdown()
fields = {fields!r}
metrics = [{{name: getattr(m, name, None) for name in fields}} for m in get_compilation_metrics()]
json.dump(metrics, open({metrics!r}, "w"))
timers = torch._dynamo.utils.compilation_time_metrics  # torch's own timers, the run's every compile in them
json.dump({{name: sum(timers.get(name, [])) for name in ("bytecode_tracing", "build_guards")}}, open({timers!r}, "w"))
"""


def run_once(tmp_path: Path, name: str, cache_dir: Path) -> tuple[TelemetryRun, list[dict]]:
    path, metrics = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.metrics.json"
    fields = [torch_name for _, torch_name in torch_compat._CACHE]
    timers = tmp_path / f"{name}.timers.json"
    script = SCRIPT.format(root=str(ROOT), path=str(path), metrics=str(metrics), fields=fields, timers=str(timers))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return telemetry_jit.read_telemetry(path)[-1], json.loads(metrics.read_text())


def span_cache(span) -> dict[str, float]:
    prefix = "compile.cache."
    return {name.removeprefix(prefix): value for name, value in span.attributes.items() if name.startswith(prefix)}


def torch_cache(metric: dict) -> dict[str, float]:
    return {ours: metric[name] for ours, name in torch_compat._CACHE if metric.get(name) is not None}


def assert_warm_residual(run: TelemetryRun) -> None:
    """A warm start's residual (docs/cold-starts.md): its compile time in phases that add up to it, by torch's own
    timers (torch 2.8, 2.13 and 2.15 name them alike: read in their sources), and what would remove which."""
    residual = summary_json(run)["warm_start"]
    phases = residual["phases"]
    assert sum(phases.values()) == pytest.approx(residual["compile_s"], abs=0.01)
    assert residual["compile_s"] == pytest.approx(summary_json(run)["compile_s"], abs=0.01)
    assert phases["kernel_load"] > 0 and phases["dynamo_tracing"] > 0 and phases["guards"] > 0
    aot, stance, mega, none = residual["removable_by"]
    removed = phases["dynamo_tracing"] + phases["guards"] + phases["cache_load"]
    assert aot["available"] == hasattr(torch.compiler, "load_compiled_function")  # what the recording torch has
    assert aot["saves_s"] == pytest.approx(removed, abs=0.01)
    assert mega["saves_s"] == 0 and none["removes"] == ["kernel_load", "rest"]
    assert "warm start: every graph came from the compile cache" in flat(format_summary(run))


def test_a_second_run_against_the_same_cache_shows_torchs_hits(tmp_path: Path) -> None:
    cache_dir = tmp_path / "inductor-cache"
    for name in ("cold", "warm"):
        run, metrics = run_once(tmp_path, name, cache_dir)
        spans = sorted(
            (s for s in run.find("compilation") if s.attributes["compile.source"] == "dynamo"),
            key=lambda s: s.start_unix_ns,
        )
        assert [span_cache(s) for s in spans] == [torch_cache(m) for m in metrics], name  # exact, span by span
        timers = json.loads((tmp_path / f"{name}.timers.json").read_text())
        for phase, timer in (("dynamo_tracing", "bytecode_tracing"), ("guards", "build_guards")):  # torch's own
            ours = sum(s.attributes.get(f"compile.time.{phase}_s", 0.0) for s in run.find("compilation"))
            assert ours == pytest.approx(timers[timer], abs=1e-3) and ours > 0, (name, phase, timers)
        warm_start = summarize(run).digest.warm_start
        hits = sum(v for m in metrics for k, v in torch_cache(m).items() if k.endswith("_hits"))
        misses = sum(v for m in metrics for k, v in torch_cache(m).items() if k.endswith("_misses"))
        assert (warm_start.hits, warm_start.misses) == (hits, misses), name
        (loop_summary,) = [e for e in run.find("training_loop")[0].events if e.name == "compile_summary"]
        assert (loop_summary.attributes["compile.cache_hits"], loop_summary.attributes["compile.cache_misses"]) == (
            hits,
            misses,
        )
        if "cache.fx_graph_local_hits" in torch_compat.UNAVAILABLE:  # torch 2.8 counts remote caches only
            text = flat(format_summary(run))
            assert "did not record" in text and "compile.cache.fx_graph_local_hits" in text
            continue
        if name == "cold":
            assert hits == 0 and misses > 0
            assert "cold start" in flat(format_summary(run)) and warm_start.missed_frames
            assert summary_json(run)["warm_start"] is None  # a residual only where every graph came from the cache
        else:
            assert hits > 0 and misses == 0
            assert "(warm start)" in flat(format_summary(run))
            assert f"compile cache: {warm_start.line}" in render_report(summarize(run))
            assert warm_start.saved_s == pytest.approx(
                sum(torch_cache(m).get("time_saved_s", 0.0) for m in metrics), abs=1e-3
            )
            assert_warm_residual(run)


def test_why_torch_bypassed_a_cache_is_on_the_span_and_in_the_summary(telemetry) -> None:
    from torch._dynamo.utils import counters

    model = torch.nn.Linear(8, 8)
    compiled = torch.compile(model)
    # freezing folds weights into constants: torch caches neither the FX graph nor the AOTAutograd graph
    with torch._inductor.config.patch(freezing=True), torch.no_grad(), telemetry_jit.CompileTelemetry(stage="predict"):
        compiled(torch.randn(2, 8))
    run = telemetry.end()
    (span,) = run.find("compilation")
    bypasses = span.attributes["compile.cache_bypasses"]
    assert (
        len(bypasses)
        == counters["inductor"]["fxgraph_cache_bypass"] + counters["aot_autograd"]["autograd_cache_bypass"]
    )
    assert any(reason.startswith("fx_graph: ") for reason in bypasses)
    assert any(reason.startswith("aot_autograd: ") and "freezing" in reason for reason in bypasses)
    assert f"compile cache bypassed: {bypasses[0]}" in format_summary(run)


COLD_START_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
import torch
import telemetry_jit
from tests.models import TRAINER_DEFAULTS, Net, loader

provider = telemetry_jit.configure("cold-start", file={path!r}, global_batch_size=4)
config = telemetry_jit.JitConfig(use_torch=True, module_selector="", torch_kwargs={{"backend": "inductor"}})
HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=config)
{before}
class Typed(Net):  # trains in the dtype it is given, as a model cast to another precision does
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

HookedTrainer(max_epochs=1, limit_val_batches=0, **TRAINER_DEFAULTS).fit(
    Typed(width={width}).to(torch.{dtype}), loader(8, {batch}, features={width}, dtype=torch.{dtype})
)
telemetry_jit.shutdown()
{after}
"""


def fit_against(
    tmp_path: Path,
    name: str,
    cache_dir: Path,
    width: int = 8,
    batch: int = 4,
    dtype: str = "float32",
    before: str = "",
    after: str = "",
    **env: str,
) -> Path:
    """A real inductor fit in its own process against ``cache_dir``: the way a job starts; ``before`` and ``after``
    the fit, lines of the job's own."""
    path = tmp_path / f"{name}.jsonl"
    script = COLD_START_SCRIPT.format(
        root=str(ROOT), path=str(path), width=width, batch=batch, dtype=dtype, before=before, after=after
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **env}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return path


def fits_against(tmp_path: Path, cache_dir: Path, jobs: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """Several of ``fit_against``'s jobs, two at a time (each is a process mostly waiting on one core), against
    ``cache_dir`` unless a job names its own: none of them reads an entry another writes (each differs from the
    others in a part of the key, or has its own cache), so their order cannot change what they find."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(fit_against, tmp_path, name, **{"cache_dir": cache_dir, **options})
            for name, options in jobs.items()
        }
        return {name: future.result() for name, future in futures.items()}


def explained(base: Path, new: Path) -> tuple[dict, str]:
    from telemetry_jit.analysis.diff import diff
    from telemetry_jit.analysis.text import format_diff

    result = diff(telemetry_jit.read_telemetry(base)[-1], telemetry_jit.read_telemetry(new)[-1])
    return result.cold_start.as_json(), flat(format_diff(result))


def test_a_cold_start_against_a_warm_one_is_explained_by_the_part_of_the_key_that_changed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fill = fit_against(tmp_path, "fill", cache)
    jobs: dict[str, dict[str, Any]] = {
        "warm": {},
        "setting": {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
        "width": {"width": 12},
        "batch": {"batch": 2},
        "dtype": {"dtype": "float64"},
        "moved": {"cache_dir": tmp_path / "another-cache"},
        # torch's global state, set by the job: named by the call that sets it
        "deterministic": {"before": "torch.use_deterministic_algorithms(True)"},
        "matmul": {"before": "torch.set_float32_matmul_precision('high')"},
        "autocast": {"before": "TRAINER_DEFAULTS = {**TRAINER_DEFAULTS, 'precision': 'bf16-mixed'}"},
    }
    # inductor's CPU code is built for a thread count, which keys it (where torch says so): another count misses
    keyed_by_threads = re.search(r"cpp_runtime_thread_count\\t\w+\\t(\d+)", fill.read_text())
    if keyed_by_threads:
        threads = int(keyed_by_threads[1])
        other_threads = 1 if threads > 1 else 2
        jobs["threads"] = {"OMP_NUM_THREADS": str(other_threads)}
    runs = fits_against(tmp_path, cache, jobs)
    warm = runs.pop("warm")
    keyed_by_autocast = "autocast_state[" in runs["autocast"].read_text()
    said = {name: explained(warm, path) for name, path in runs.items()}

    # all hits: nothing to explain, nothing said
    facts, text = explained(fill, warm)
    assert facts["missed_graphs"] == 0 and facts["recorded"] == {"base": True, "new": True}
    assert "compile cache:" not in text
    assert explained(fill, fill)[0]["missed_graphs"] == 0  # a cold run compared with itself: nothing to explain
    for name in runs:
        if name == "autocast" and not keyed_by_autocast:
            continue  # a torch that does not key its caches by autocast: nothing missed
        facts, text = said[name]
        assert facts["missed_graphs"] >= 1 and facts["compile_s"] > 0, name
        assert f"compile cache: {facts['missed_graphs']} graph(s) missed that the base run had" in text
        assert len(facts["reasons"]) == 1, (name, facts)  # one reason per scenario, every graph in it
    reason = {name: said[name][0]["reasons"][0] for name in said if said[name][0]["reasons"]}
    assert reason["setting"]["reason"].startswith("setting inductor's max_autotune: False -> True")
    assert "keep the setting" in reason["setting"]["fix"]
    assert reason["width"]["reason"].startswith("a parameter's shape or dtype (graph input ")
    assert "float32[8, 8] -> float32[12, 12]" in reason["width"]["reason"]
    assert reason["batch"]["reason"].startswith("an input's dtype, shape or layout (graph input ")
    assert "float32[4, 8] -> float32[2, 8]" in reason["batch"]["reason"]
    assert "dynamic=True" in reason["batch"]["fix"]
    # a precision change casts the model and its inputs: the parameters are named first, with both dtypes
    assert "float32[8, 8] -> float64[8, 8]" in reason["dtype"]["reason"], reason["dtype"]
    # the same frames compiled, but a change made the caches miss: not put down to the caches alone (torch 2.8
    # counts no local hits on its spans, so there diff cannot tell the caches' effect at all)
    assert "not a code change" not in said["dtype"][1]
    if "cache.fx_graph_local_hits" not in torch_compat.UNAVAILABLE:
        assert "below, why they missed" in said["dtype"][1]
        assert "this is the caches' doing, not a code change" in said["moved"][1]
    assert reason["moved"]["reason"] == "the same key as in the base run, but the entry was not in this run's cache"
    assert reason["deterministic"]["reason"].startswith("deterministic algorithms (torch.use_deterministic_algorithms")
    assert reason["deterministic"]["reason"].endswith(": False -> True")  # three parts, one knob, said once
    assert reason["matmul"]["reason"].startswith("the float32 matmul precision (torch.set_float32_matmul_precision")
    if keyed_by_threads:
        assert reason["threads"]["reason"].startswith("the CPU threads inductor's code is built for")
        assert reason["threads"]["reason"].endswith(f": {threads} -> {other_threads}")
    for name in {"deterministic", "matmul", "threads"} & reason.keys():
        assert reason[name]["fix"].startswith("nothing to fix if you changed it on purpose"), name
    if keyed_by_autocast:
        assert reason["autocast"]["reason"].startswith("autocast on cpu (Trainer(precision='bf16-mixed'")
        assert reason["autocast"]["reason"].endswith(": off -> bfloat16")
    assert "TORCHINDUCTOR_CACHE_DIR" in reason["moved"]["fix"] and "load_cache_artifacts" in reason["moved"]["fix"]
    # the frame the user compiled, and the step it missed at
    assert all(group["frames"] == ["forward (tests/models.py:55)"] for group in reason.values()), reason
    assert all(group["steps"] == ["0"] for group in reason.values())
    assert reason["setting"]["changes"] == [{"part": "inductor_config[max_autotune]", "base": "False", "new": "True"}]

    # bounded: a few KB a graph; each table of settings written once per run
    lookups = [line for line in fill.read_text().splitlines() if '"name":"cache_lookup"' in line]
    tables = [json.loads(line)["attributes"]["cache.settings"] for line in lookups if "cache.settings_parts" in line]
    own = [len(line) for line in lookups if "cache.settings_parts" not in line]
    assert lookups and own and max(own) < 4096
    assert tables and len(tables) == len(set(tables))


def test_the_fleet_view_names_the_rank_whose_cache_was_empty_and_why(tmp_path: Path) -> None:
    from telemetry_jit.analysis.fleet import fleets
    from telemetry_jit.analysis.text import format_fleet

    loop = Path(__file__).with_name("cache_ranks_loop.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_JIT_", "TORCHELASTIC_"))}
    shared = tmp_path / "shared-cache"
    for job, rank1_cache in (("fill", shared), ("job", tmp_path / "empty-cache")):
        out = tmp_path / job / "t.jsonl"
        out.parent.mkdir()
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(loop), str(out)]
        # any wait is a stall here: a cold compile of this tiny model outlasts a warm one by only a few seconds
        watch = {"TELEMETRY_JIT_STALL_DELAY_S": "0", "TELEMETRY_JIT_HEARTBEAT_S": "0.5"} if job == "job" else {}
        result = subprocess.run(
            [*command, str(shared), str(rank1_cache)], capture_output=True, text=True, timeout=600, env={**env, **watch}
        )
        assert result.returncode == 0, result.stderr[-4000:]
    runs = [telemetry_jit.read_telemetry(tmp_path / "job" / f"t.rank{rank}.jsonl")[-1] for rank in range(2)]
    # said live on rank 0 while rank 1 still compiled: the rank, the graph, the cache it missed and why
    said = [e for s in runs[0].spans.values() for e in s.events if e.name == JitEventName.RANKS_OUT_OF_STEP]
    stalls = [e for e in said if e.attributes[RanksAttr.KIND] == "stall" and e.attributes[RanksAttr.RANKS] == [1]]
    # the first that knew why: said once rank 0 waited, which may be before rank 1's look-up; the forward's
    # compile says it on every torch (2.8 - 2.12 hand AOTAutograd's look-up over after compiling the graph: the
    # miss is read from torch's log, said before)
    stall = next(e for e in stalls if e.attributes.get(RanksAttr.WHY))
    what = str(stall.attributes[RanksAttr.WHAT])
    assert not what.startswith("the backward graph of "), what  # the forward's, not the later backward's
    compiled = next(s for s in runs[1].find("compilation") if s.attributes.get("compile.trigger") == "dynamo")
    assert compiled.start_unix_ns < stall.time_unix_ns < compiled.end_unix_ns  # said while rank 1 still compiled
    line = stall.attributes[RanksAttr.LINE]
    assert line.startswith(f"rank 1 has been compiling {what}") and what.endswith("[0/0]"), line
    assert re.search(r"Sequential\.forward \((?:\S*/)?modules/container\.py:\d+\) \[0/0\]$", what), what
    assert "(train step 0) while 1 rank waits at step 0" in line, line
    assert "it missed AOTAutograd's cache where rank 0 hit; the same key, and rank 1's cache directory" in line, line
    assert re.search(r"the cold compile of that graph took \d+\.\d s \(forward and backward\)$", line), line
    assert line in result.stderr
    (fleet,) = fleets(runs)
    warm, cold = fleet.caches
    assert (warm.ranks, warm.what) == ([0], "warm: every graph from the compile cache")
    assert (cold.ranks, cold.what) == ([1], "cold: every graph compiled")
    assert cold.difference.startswith("1 graph(s) that rank 0 had missed here")
    assert "the same key as in the base run, but the entry was not in this run's cache" in cold.difference
    assert "TORCHINDUCTOR_CACHE_DIR" in flat(format_fleet(fleet))
    assert fleet.as_json()["compile_cache"][1]["difference"] == cold.difference


def test_hits_from_loaded_cache_artifacts_are_said_and_a_run_that_did_not_load_them_is_told_to(tmp_path: Path) -> None:
    """The mega-cache: one job saves its compiled graphs with torch.compiler.save_cache_artifacts(), the next
    loads them into an empty cache and starts warm; a job that forgets to load them is told why it was cold."""
    artifacts = tmp_path / "artifacts.bin"
    save = f"import torch; open({str(artifacts)!r}, 'wb').write(torch.compiler.save_cache_artifacts()[0])"
    load = f"import torch; torch.compiler.load_cache_artifacts(open({str(artifacts)!r}, 'rb').read())"
    fit_against(tmp_path, "saved", tmp_path / "cache-a", after=save)
    jobs = {"loaded": {"before": load}, "forgot": {"cache_dir": tmp_path / "cache-c"}}
    loaded, forgot = fits_against(tmp_path, tmp_path / "cache-b", jobs).values()

    run = telemetry_jit.read_telemetry(loaded)[-1]
    lookups = [e for s in run.find("compilation") for e in s.events if e.name == "cache_lookup"]
    hits = [e for e in lookups if e.attributes["cache.state"] == "hit"]
    assert hits and len(hits) == len(lookups)  # an empty cache, filled by the artifacts alone
    assert all(e.attributes.get("cache.loaded_artifact") is True for e in hits)
    assert summarize(run).digest.cache_ledger.loaded_hits == len(hits)
    assert f"{len(hits)} graph(s) from loaded cache artifacts" in flat(format_summary(run))

    facts, text = explained(loaded, forgot)
    (reason,) = facts["reasons"]
    assert reason["reason"].startswith("the same key as in the base run, which had it from the cache artifacts")
    assert "load the same artifacts" in reason["fix"] and reason["graphs"] == facts["missed_graphs"] >= 1
    assert "this run did not load them" in text


PROCESS_GROUP_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import telemetry_jit

telemetry_jit.configure("process-group", file={path!r})
dist.init_process_group("gloo", init_method={store!r}, rank=0, world_size=1)
for _ in range({extra}):  # a group made first, for something else: the one the model uses gets the next name
    dist.new_group([0])
group = dist.new_group([0])

@torch.compile
def step(x):
    return funcol.all_reduce(torch.sin(x) * 2, "sum", group) + 1

with telemetry_jit.CompileTelemetry() as loop:
    for i in range(2):
        loop.step(i)
        step(torch.randn(8))
telemetry_jit.shutdown()
dist.destroy_process_group()
"""


def test_a_process_group_named_otherwise_is_why_a_graph_with_a_collective_missed(tmp_path: Path) -> None:
    """pytorch/pytorch#189330: the group's name is in the graph's code, so a job that makes its groups in another
    order misses every graph with a collective. Two one-process gloo jobs against one cache."""
    cache, paths = tmp_path / "cache", {}
    for name, extra in (("fill", 0), ("extra-group", 1)):
        paths[name] = tmp_path / f"{name}.jsonl"
        store = f"file://{tmp_path / (name + '.store')}"
        script = PROCESS_GROUP_SCRIPT.format(root=str(ROOT), path=str(paths[name]), store=store, extra=extra)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stderr[-4000:]
    facts, text = explained(paths["fill"], paths["extra-group"])
    (reason,) = facts["reasons"]
    assert reason["reason"].startswith("the process group's name baked into the graph's collectives: '1' -> '2'")
    assert "same process groups in the same order" in reason["fix"]
