"""Cache outcome on compilation spans: a real inductor run done twice against one cache folder, in
two processes; the second run's spans show the cache hits torch counts, and the summary says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import telemetry_jit
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.analysis.report import render_report
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.compat import torch as torch_compat
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
"""


def run_once(tmp_path: Path, name: str, cache_dir: Path) -> tuple[TelemetryRun, list[dict]]:
    path, metrics = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.metrics.json"
    fields = [torch_name for _, torch_name in torch_compat._CACHE]
    script = SCRIPT.format(root=str(ROOT), path=str(path), metrics=str(metrics), fields=fields)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return telemetry_jit.read_telemetry(path)[-1], json.loads(metrics.read_text())


def span_cache(span) -> dict[str, float]:
    prefix = "compile.cache."
    return {name.removeprefix(prefix): value for name, value in span.attributes.items() if name.startswith(prefix)}


def torch_cache(metric: dict) -> dict[str, float]:
    return {ours: metric[name] for ours, name in torch_compat._CACHE if metric.get(name) is not None}


def test_a_second_run_against_the_same_cache_shows_torchs_hits(tmp_path: Path) -> None:
    cache_dir = tmp_path / "inductor-cache"
    for name in ("cold", "warm"):
        run, metrics = run_once(tmp_path, name, cache_dir)
        spans = sorted(
            (s for s in run.find("compilation") if s.attributes["compile.source"] == "dynamo"),
            key=lambda s: s.start_unix_ns,
        )
        assert [span_cache(s) for s in spans] == [torch_cache(m) for m in metrics], name  # exact, span by span
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
        else:
            assert hits > 0 and misses == 0
            assert "(warm start)" in flat(format_summary(run))
            assert f"compile cache: {warm_start.line}" in render_report(summarize(run))
            assert warm_start.saved_s == pytest.approx(
                sum(torch_cache(m).get("time_saved_s", 0.0) for m in metrics), abs=1e-3
            )


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
