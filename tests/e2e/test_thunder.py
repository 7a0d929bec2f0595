"""JitConfig(use_thunder=True) on this torch: training, checkpoints and compile spans from
thunder.compile_stats."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import JitConfig, JitTransform
from telemetry_jit.compat import thunder as thunder_compat
from telemetry_jit.compat.thunder import import_thunder
from telemetry_jit.compat.torch import compiled_call
from telemetry_jit.probes import thunder_stats as thunder_probe
from tests.e2e.conftest import Telemetry, needs_thunder
from tests.e2e.dynamo_facts import compiles_recorded_by_torch, total_graph_breaks
from tests.models import TRAINER_DEFAULTS, Net, loader

THUNDER = JitConfig(use_thunder=True, module_selector="layer*")


def fit(telemetry: Telemetry, model: Net, epochs: int = 2, **kwargs) -> tuple[pl.Trainer, object]:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=THUNDER)
    trainer = HookedTrainer(max_epochs=epochs, **{**TRAINER_DEFAULTS, **kwargs})
    trainer.fit(model, loader(18, 4), loader(8, 4))
    return trainer, callback


@needs_thunder
def test_trains_like_eager_and_keeps_state_dict_keys(telemetry: Telemetry) -> None:
    eager = Net()
    pl.Trainer(max_epochs=3, **TRAINER_DEFAULTS).fit(eager, loader(18, 4), loader(8, 4))
    model = Net()
    keys = list(model.state_dict())
    trainer, _ = fit(telemetry, model, epochs=3)
    assert len(model.losses) == 15  # forward, backward and optimizer step, three epochs
    assert model.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-5)
    assert list(model.state_dict()) == keys
    assert all(compiled_call(getattr(model.model, name)) is not None for name in ("layer0", "layer1"))
    stand_ins = [
        getattr(getattr(torch.Tensor, name, None), "__module__", "") for name in thunder_compat.NAMED_TENSOR_METHODS
    ]
    assert thunder_compat.__name__ not in stand_ins  # import_thunder's stand-ins for them were removed again


@needs_thunder
def test_compile_spans_match_thunder_cache_misses_and_summary_its_hits(telemetry: Telemetry) -> None:
    thunder = import_thunder()
    model = Net()
    trainer, callback = fit(telemetry, model)
    compiled = {name: compiled_call(getattr(model.model, name)).thunder_module for name in ("layer0", "layer1")}
    callback.on_app_end()
    run = telemetry.run()
    spans = [s for s in run.find("compilation") if s.attributes["compile.source"] == "thunder"]
    assert len(spans) == sum(thunder.cache_misses(tm) for tm in compiled.values())
    for name, tm in compiled.items():
        own = sorted((s for s in spans if s.attributes["compile.frame"] == name), key=lambda s: s.start_unix_ns)
        assert len(own) == thunder.cache_misses(tm) >= 2  # the short last batch forces a new trace
        assert [s.attributes["compile.is_recompile"] for s in own] == [False] + [True] * (len(own) - 1)
        assert "(4, 8) float32" in own[1].attributes["compile.recompile_reason"]
        assert all(s.attributes["compile.backend"] == "thunder" and s.end_unix_ns > s.start_unix_ns for s in own)
        loop = run.find("training_loop")[0]
        for span in own:  # thunder's perf_counter timestamps, shifted to the epoch clock
            phases = span.attributes["compile.time.tracing_s"] + span.attributes["compile.time.transforms_s"]
            assert (span.end_unix_ns - span.start_unix_ns) / 1e9 == pytest.approx(phases, abs=2e-6)
            assert span.attributes["compile.time.tracing_s"] > 0
            assert loop.start_unix_ns <= span.start_unix_ns < span.end_unix_ns <= loop.end_unix_ns
    (event,) = [e for e in run.find("training_loop")[0].events if e.name == "compile_summary"]
    names = event.attributes["compile.thunder_modules"]
    hits = dict(zip(names, event.attributes["compile.thunder_cache_hits"], strict=True))
    assert hits == {name: thunder.cache_hits(tm) for name, tm in compiled.items()}
    misses = dict(zip(names, event.attributes["compile.thunder_cache_misses"], strict=True))
    assert misses == {name: thunder.cache_misses(tm) for name, tm in compiled.items()}
    assert {s.attributes["train.stage"] for s in spans} >= {"train", "validate"}


@needs_thunder
def test_checkpoint_from_thunder_training_loads_into_the_plain_model_and_back(
    telemetry: Telemetry, tmp_path: Path
) -> None:
    model = Net()
    trainer, _ = fit(telemetry, model, epochs=1)
    path = tmp_path / "thunder.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    plain = Net()
    plain.load_state_dict(state)  # strict: same keys
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in model.state_dict().items())
    back = Net()
    JitTransform(THUNDER)._compile(back)
    back.load_state_dict(plain.state_dict())
    x = torch.randn(4, 8)
    assert torch.allclose(back(x), plain(x), atol=1e-6)
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=THUNDER)
    HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(back, loader(18, 4), ckpt_path=str(path))
    assert len(back.losses) == 5  # resumed after epoch 1


@needs_thunder
def test_profile_thunder_says_once_that_it_does_nothing_on_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the NVTX transform applies")
    config = JitConfig(use_thunder=True, module_selector="layer*", profile_thunder=True)
    with pytest.warns(RuntimeWarning, match="does nothing on CPU") as caught:
        JitTransform(config)._compile(Net())
        JitTransform(config)._compile(Net())
    assert len([w for w in caught if "does nothing on CPU" in str(w.message)]) <= 1


def test_missing_thunder_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "thunder", None)
    monkeypatch.setattr(thunder_compat, "_import_error", None)  # whatever this torch made of thunder
    with pytest.raises(ImportError, match=r"pip install 'telemetry-jit\[thunder\]'"):
        import_thunder()
    with pytest.raises(ImportError, match="telemetry-jit"):
        JitTransform(THUNDER).setup(None, Net(), "fit")  # before the first step
    dynamo = JitConfig(use_thunder=True, module_selector="layer*", thunder_backend="dynamo")
    with pytest.raises(ImportError, match="telemetry-jit"):
        JitTransform(dynamo).setup(None, Net(), "fit")


@needs_thunder
def test_a_thunder_without_thunder_dynamo_fails_at_setup_naming_the_other_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "thunder.dynamo", None)
    dynamo = JitConfig(use_thunder=True, module_selector="layer*", thunder_backend="dynamo")
    with pytest.raises(ImportError, match=r"needs thunder\.dynamo\.ThunderCompiler.*thunder_backend='jit'"):
        JitTransform(dynamo).setup(None, Net(), "fit")


@pytest.mark.parametrize("backend", ["jit", "dynamo"])
def test_where_thunder_cannot_import_setup_fails_naming_the_versions_that_work(backend: str) -> None:
    config = JitConfig(use_thunder=True, module_selector="layer*", thunder_backend=backend)
    try:
        import_thunder()
    except ImportError as error:
        failure = str(error)
    else:
        pytest.skip(f"lightning-thunder imports with torch {torch.__version__}")
    for attempt in range(2):  # the same clear error every time, not a half-imported thunder's
        with pytest.raises(
            ImportError, match=r"does not import with torch .*Supported: lightning-thunder 0\.2\.x"
        ) as e:
            JitTransform(config).setup(None, Net(), "fit")  # before the first step
        assert str(e.value) == failure, attempt


@needs_thunder
def test_thunder_compiles_between_fits_are_not_counted_in_the_next_fit(telemetry: Telemetry) -> None:
    model = Net()
    _, callback = fit(telemetry, model, epochs=1)
    layer = model.model.layer0
    misses_after_first_fit = compiled_call(layer).function.stats.cache_misses
    layer(torch.randn(7, 8))  # by hand, between the fits: a shape thunder has not traced
    assert compiled_call(layer).function.stats.cache_misses == misses_after_first_fit + 1
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(16, 4))  # shapes thunder has seen
    callback.on_app_end()
    loops = telemetry.run().find("training_loop")
    second = [e for e in loops[-1].events if e.name == "compile_summary"][0].attributes
    assert second["compile.count"] == 0
    assert second["compile.thunder_cache_misses"] == [0, 0]  # both layers ran from thunder's cache
    assert all(hits > 0 for hits in second["compile.thunder_cache_hits"])
    in_second = [s for s in telemetry.run().find("compilation") if s.start_unix_ns >= loops[-1].start_unix_ns]
    assert in_second == []


@needs_thunder
def test_nemos_thunder_path_trains_with_compile_spans_and_thunder_splits_as_graph_breaks(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_print(model: Net) -> Net:
        model.model.layer1.graph_break = "print"  # a graph break for dynamo, after thunder's split
        return model

    eager = with_print(Net(graph_break="histc"))
    pl.Trainer(max_epochs=2, **TRAINER_DEFAULTS).fit(eager, loader(18, 4), loader(8, 4))
    compilers = []  # each ThunderCompiler that split a graph: thunder's own record of its splits
    split_graph = thunder_compat.split_graph

    def spy(compiler: object, *args: object) -> object:
        compilers.append(compiler)
        return split_graph(compiler, *args)

    monkeypatch.setattr(thunder_compat, "split_graph", spy)
    config = JitConfig(use_thunder=True, thunder_backend="dynamo", module_selector=None)  # NeMo's whole model
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=config)
    model = with_print(Net(graph_break="histc"))
    HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(18, 4), loader(8, 4))
    assert model.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-5)
    run = telemetry.end()

    spans = run.find("compilation")
    dynamo = [s for s in spans if s.attributes["compile.source"] == "dynamo"]
    assert len(dynamo) == len(compiles_recorded_by_torch()) > 0
    assert {s.attributes["compile.backend"] for s in dynamo} == {"thunder"}
    breaks = [e for s in dynamo for e in s.events if e.name == "graph_break"]
    by_torch = [e for e in breaks if e.attributes["graph_break.compiler"] == "dynamo"]
    assert len(by_torch) == total_graph_breaks() > 0
    splits = [e for e in breaks if e.attributes["graph_break.compiler"] == "thunder"]
    subgraphs = [info for compiler in {id(c): c for c in compilers}.values() for info in compiler.subgraph_infos]
    assert len(splits) == sum(len(info.split_reasons) for info in subgraphs) > 0
    histc_line = next(n for n, line in enumerate(Path(models_file()).read_text().splitlines(), 1) if "histc(" in line)
    for split in splits:
        assert "histc" in split.attributes["graph_break.reason"]
        assert split.attributes["graph_break.location"] == f"{models_file()}:{histc_line}"
        assert split.attributes["graph_break.counted_by_torch"] is False

    pieces = [piece for source in thunder_probe.sources_in(model) for piece in source.functions]
    thunder = [s for s in spans if s.attributes["compile.source"] == "thunder"]
    assert len(thunder) == sum(piece.stats.cache_misses for piece in pieces) >= len(pieces) > 0
    assert {s.attributes["compile.frame"] for s in thunder} == {piece.name for piece in pieces}
    assert all(piece.name.startswith("Body/graph") for piece in pieces)
    assert all(s.end_unix_ns > s.start_unix_ns for s in thunder)
    (summary,) = [e for e in run.find("training_loop")[0].events if e.name == "compile_summary"]
    assert sorted(summary.attributes["compile.thunder_modules"]) == sorted(piece.name for piece in pieces)


def models_file() -> str:
    import tests.models

    return tests.models.__file__
