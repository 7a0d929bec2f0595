"""Causes from all of torch's evidence, checked against torch's own record and by applying the fix the product names
in a second run: every cache entry's failed guard, attributed to the caller it was made for (a GAN whose generator
and discriminator share one compiled ``Sequential.forward``), torch's own shape decisions (a size it fixed while
compiling is never advised ``dynamic=True``), and the backward graphs only the compiles that built one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import telemetry_jit
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.analysis.summary import summarize
from tests.e2e import dynamo_facts
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.e2e.test_truth import said
from tests.models import TRAINER_DEFAULTS
from tests.words import flat

AOT = {"backend": "aot_eager"}


class TorchTrace(logging.Handler):
    """torch's structured trace (what ``TORCH_TRACE`` writes and tlparse reads), kept in memory: each record's
    metadata, with the compile id it belongs to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", {})
        compile_id = f"{metadata.get('frame_id')}/{metadata.get('frame_compile_id')}"
        self.records.append((compile_id, metadata))

    def compiles_holding(self, name: str) -> set[str]:
        return {compile_id for compile_id, metadata in self.records if name in metadata}


@pytest.fixture
def torch_trace() -> Iterator[TorchTrace]:
    from torch._logging._internal import trace_log

    handler, level = TorchTrace(), trace_log.level
    trace_log.setLevel(logging.DEBUG)  # as TORCH_TRACE sets it
    trace_log.addHandler(handler)
    yield handler
    trace_log.removeHandler(handler)
    trace_log.setLevel(level)


class ConditionalGAN(pl.LightningModule):
    """Manual optimization: ``toggle_optimizer`` flips which network's parameters need gradients at every step;
    under bf16-mixed the generator's images are bfloat16 beside the loader's float32 ones; generator and
    discriminator are two ``torch.compile``'d Sequentials sharing ``Sequential.forward``; the discriminator's step
    runs the generator again, frozen (an inference graph). ``cast``: the fix for the dtype, fake images made float32."""

    def __init__(self, cast: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.cast = cast
        self.label = torch.nn.Embedding(3, 4)
        self.generator = torch.compile(
            torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 12)), **AOT
        )
        self.discriminator = torch.compile(
            torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)), **AOT
        )

    def fake(self, labels: torch.Tensor) -> torch.Tensor:
        images = self.generator(torch.cat([torch.randn(len(labels), 4), self.label(labels).detach()], 1))
        return images.float() if self.cast else images

    def training_step(self, batch: Any, batch_idx: int) -> None:
        real, labels = batch
        g, d = self.optimizers()  # type: ignore[misc]
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        self.toggle_optimizer(g)
        self.manual_backward(bce(self.discriminator(self.fake(labels)), ones))
        g.step()
        g.zero_grad()
        self.untoggle_optimizer(g)
        self.toggle_optimizer(d)
        fake = self.fake(labels)  # the generator frozen: an inference graph
        self.manual_backward(bce(self.discriminator(real), ones) + bce(self.discriminator(fake), zeros))
        d.step()
        d.zero_grad()
        self.untoggle_optimizer(d)

    def configure_optimizers(self) -> Any:
        generator = [*self.generator.parameters(), *self.label.parameters()]
        return torch.optim.SGD(generator, lr=0.01), torch.optim.SGD(self.discriminator.parameters(), lr=0.01)


def images(drop_last: bool = False) -> DataLoader:
    """38 images in batches of 16: the last batch holds 6."""
    x = torch.randn(38, 12, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 3, (38,), generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(x, labels), batch_size=16, drop_last=drop_last)


def fit_gan(telemetry: Telemetry, cast: bool = False, drop_last: bool = False) -> TelemetryRun:
    trainer = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)[0]
    trainer(max_epochs=2, precision="bf16-mixed", **TRAINER_DEFAULTS).fit(ConditionalGAN(cast), images(drop_last))
    return telemetry.end()


def run_again(tmp_path: Path, name: str) -> Telemetry:
    """A second run after a fix, as a new process has it: its own file, torch's caches and counters empty."""
    fresh_provider_state()
    dynamo_facts.reset_compile_state()
    path = tmp_path / f"{name}.jsonl"
    return Telemetry(telemetry_jit.configure(name, file=path), path)


def torch_recompiles() -> list[str]:
    """torch's own record: the compile ids of the frame recompiles it made."""
    return [
        str(m.compile_id)
        for m in dynamo_facts.compiles_recorded_by_torch()
        if m.is_forward is not False and not str(m.compile_id).endswith("/0")
    ]


def causes(run: TelemetryRun) -> dict[tuple[str, bool], int]:
    counts: dict[tuple[str, bool], int] = {}
    for row in summarize(run).causes:
        counts[(row.cause, bool(row.expected))] = counts.get((row.cause, bool(row.expected)), 0) + row.count
    return counts


TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.skipif(
    TORCH_RELEASE < (2, 13),
    reason="checked on torch 2.13 and 2.15; on 2.8 torch's trace holds a backward graph in all 8 frame compiles where "
    "the product counts 4, and the recompiles differ (4 last_batch): open in issue 63",
)
def test_every_entrys_guard_names_the_gans_fixable_recompiles_and_each_named_fix_removes_them(
    telemetry: Telemetry, tmp_path: Path, torch_trace: TorchTrace
) -> None:
    run = fit_gan(telemetry)
    # torch's own record of which compiles built a backward graph (tlparse's aot_backward_graph) and which an
    # inference graph only (the generator frozen by toggle_optimizer): the summary counts the first, never the second
    built = torch_trace.compiles_holding("aot_backward_graph")
    inference = torch_trace.compiles_holding("aot_inference_graph")
    # (torch 2.8's trace names no aot_inference_graph: there only the count below is checked)
    assert not inference & built
    digest = summarize(run).digest
    assert digest.backward_graphs + digest.backward_within == len(built), (built, inference)
    recompiles = torch_recompiles()
    found = causes(run)
    # the last batch (6 of 16) recompiles the generator, trainable and frozen, and the discriminator: each entry
    # made for that call failed on "size mismatch at index 0. expected 16, actual 6"; the discriminator's third
    # call hits torch's recompile limit (8), which names the last batch as what led there
    assert found.get(("last_batch", False)) == 3 and found.get(("recompile_limit", False)) == 1, found
    # the discriminator's bfloat16 fakes after its float32 images, with the same parameters trainable: its entry
    # fails on "dtype mismatch" alone; its first float32 call (parameters trainable now) is the expected price
    assert found.get(("tensor_property", False)) == 1, found
    assert found.get(("trainable_params", True)) == 2 and found.get(("shared_code", True)) == 1, found
    assert ("changing_dim", False) not in found  # never the generator's entry ("index 1. expected 8, actual 12")
    assert sum(found.values()) == len(recompiles) == 8
    rows = {row.cause: row for row in summarize(run).causes}
    assert rows["last_batch"].reasons == ["tensor 'args[0]' size mismatch at index 0. expected 16, actual 6"]
    assert rows["tensor_property"].reasons == ["tensor 'args[0]' dtype mismatch. expected Float, actual BFloat16"]
    assert rows["recompile_limit"].behind == {"last_batch": 1}
    assert "what to fix first" in flat(telemetry_jit.format_summary(run))
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "5")[0] == 0
    assert said("check", str(telemetry.path), "--max-unexpected-recompiles", "4")[0] == 1

    # the fix named for the dtype: a cast. torch no longer recompiles for it, and the discriminator, no longer
    # at the limit, stays compiled for its last batch
    cast = run_again(tmp_path, "cast")
    cast_causes = causes(fit_gan(cast, cast=True))
    assert cast_causes == {
        ("shared_code", True): 1,
        ("trainable_params", True): 2,
        ("last_batch", False): 4,
    }, cast_causes
    assert len(torch_recompiles()) == 7
    assert "tensor_property in train: 1" in said("diff", str(telemetry.path), str(cast.path))[1]

    # then the fix named for the last batch: drop_last. torch recompiles only the expected price
    dropped = run_again(tmp_path, "dropped")
    expected_only = {("shared_code", True): 1, ("trainable_params", True): 2}
    assert causes(fit_gan(dropped, cast=True, drop_last=True)) == expected_only
    assert len(torch_recompiles()) == 3
    assert said("check", str(dropped.path), "--max-unexpected-recompiles", "0")[0] == 0


class UNet(torch.nn.Module):
    """Down, up and a skip connection: inductor fixes the image's height and width to one size while it compiles
    them dynamic (``set_replacement s0 = 24 (range_refined_to_singleton)``); aot_eager keeps them dynamic."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.down1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.down2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.out = torch.nn.Conv2d(16, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.down1(x))
        b = torch.relu(self.down2(torch.nn.functional.max_pool2d(a, 2)))
        return self.out(torch.cat([self.up(b), a], 1))


def test_a_size_torch_fixed_while_compiling_it_dynamic_is_specialized_and_never_advised_dynamic(
    telemetry: Telemetry, torch_trace: TorchTrace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # every cache layer empty
    model = torch.compile(UNet(), backend="inductor")
    # inductor decides the sizes as it lowers the graph: compiled afresh, whatever this machine's cache holds
    caches = {"fx_graph_cache": False, "fx_graph_remote_cache": False}
    # nor AOTAutograd's cache (a hit lowers nothing), nor the sizes an earlier process saw change (torch's
    # profile-guided dynamic shapes, kept on disk: compiled dynamic from the first call, nothing recompiles)
    pgo = ("automatic_dynamic_local_pgo", "automatic_dynamic_remote_pgo")
    fresh = {name: False for name in pgo if hasattr(torch._dynamo.config, name)}
    with (
        torch._inductor.config.patch(caches),
        torch._functorch.config.patch(enable_autograd_cache=False),
        torch._dynamo.config.patch(fresh),
        telemetry_jit.CompileTelemetry(telemetry.provider, live=False) as loop,
    ):
        for step, size in enumerate((16, 24, 32)):  # an image size per batch
            loop.step(step)
            model(torch.randn(2, 3, size, size)).mean().backward()
    run = telemetry.end()
    # torch's own record: the structured trace's specializations, in each recompile
    specialized = {
        compile_id: metadata["symbolic_shape_specialization"]
        for compile_id, metadata in torch_trace.records
        if "symbolic_shape_specialization" in metadata
    }
    spans = {s.attributes["compile.id"]: s.attributes for s in run.find("compilation")}
    if not specialized:  # this torch fixed none of the sizes: the product says none either, and there is no advice
        assert [a.get("compile.specialized") for a in spans.values() if a.get("compile.specialized")] == []
        pytest.skip(f"torch {torch.__version__} fixed none of this U-Net's sizes (its trace has no specialization)")
    assert set(specialized) == {"0/1", "0/2"}, (specialized, [a.get("compile.specialized") for a in spans.values()])
    for compile_id in ("0/1", "0/2"):
        fixed = spans[compile_id]["compile.specialized"]
        assert any(item.startswith("L['x'].size()[2] = ") and "range_refined_to_singleton" in item for item in fixed)
    rows = summarize(run).causes
    assert [(row.cause, row.count) for row in rows] == [("specialized", 2)]
    text = flat(telemetry_jit.format_summary(run))
    assert "dynamic=True does not help" in text and "mark_dynamic (torch refuses" in text
    assert "compile with dynamic=True" not in text and "mark that dimension dynamic" not in text
