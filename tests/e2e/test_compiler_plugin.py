"""A compiler added as a plug-in, in this one file and no other: a toy backend that "compiles" a module
once per input shape (``torch.fx.symbolic_trace``, which shares the module's parameters) and observes its
own compiles. Registered, it trains under ``HookedTrainer`` with ``JitConfig(backend="toy")``, and its
compiles are spans, recompiles with their reason, in the summary, as torch's and thunder's are."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from telemetry_jit import CompileRecord
from tests.e2e.conftest import fresh_provider_state, unregister_backend
from tests.models import TRAINER_DEFAULTS, Net, loader


class ToyObserver:
    def __init__(self) -> None:
        self.pending: list[CompileRecord] = []
        self.attached = False

    def attach(self) -> None:
        self.attached = True

    def poll(self) -> list[CompileRecord]:
        taken, self.pending = self.pending, []
        return taken

    def detach(self) -> None:
        self.attached = False


class ToyBackend:
    name, title = "toy", "toy.trace"

    def __init__(self) -> None:
        self.observer_ = ToyObserver()

    def check(self, config: Any) -> None:
        pass

    def compile(self, module: torch.nn.Module, label: str, config: Any) -> Callable[[], bool]:
        traced: dict[tuple[int, ...], Any] = {}
        code = type(module).forward.__code__

        def forward(x: torch.Tensor) -> torch.Tensor:
            shape = tuple(x.shape)
            if shape not in traced:
                start = time.time_ns()
                traced[shape] = torch.fx.symbolic_trace(module)  # traces type(module).forward
                seen = [s for s in traced if s != shape]
                self.observer_.pending.append(
                    CompileRecord(
                        source="toy",
                        compile_id=f"{label}/{len(traced) - 1}",
                        trigger="toy",
                        start_ns=start,
                        end_ns=time.time_ns(),
                        backend="toy",
                        frame=f"{label}.forward",
                        location=f"{code.co_filename}:{code.co_firstlineno}",
                        is_recompile=bool(seen),
                        recompile_reason=f"input shape {shape}, traced for {seen[0]}" if seen else "",
                    )
                )
            return traced[shape](x)

        module.forward = forward  # type: ignore[method-assign]
        return lambda: bool(traced)

    def observer(self) -> ToyObserver:
        return self.observer_


@pytest.fixture
def toy() -> Iterator[ToyBackend]:
    backend = ToyBackend()
    telemetry_jit.register_backend(backend)
    yield backend
    unregister_backend(backend.name)  # the process as it was: no observer polled in the tests after


def test_a_toy_backend_added_as_a_plug_in_trains_and_is_recorded(toy: ToyBackend, tmp_path: Path) -> None:
    fresh_provider_state()
    session = telemetry_jit.configure("toy", file=tmp_path / "t.jsonl")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
        pl.Trainer, session, jit_config=telemetry_jit.JitConfig(backend="toy")
    )  # the whole model's body
    trainer = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS)
    trainer.fit(Net(), loader(42, 4))  # 11 batches, the last of 2: a second shape
    telemetry_jit.shutdown()
    assert trainer.global_step == 11 and not toy.observer_.attached
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    compiles = run.find("compilation")
    assert [s.attributes["compile.backend"] for s in compiles] == ["toy", "toy"]
    assert [s.attributes["compile.is_recompile"] for s in compiles] == [False, True]
    assert "traced for (4, 8)" in compiles[1].attributes["compile.recompile_reason"]
    assert compiles[1].attributes["train.global_step"] == 10
    summary = telemetry_jit.format_summary(run)
    assert "compiled: 2 frame compiles (1 of them recompiles)" in summary, summary
    assert "TORCH_LOGS" not in summary  # its recompile is counted, not explained with torch's guards


def test_a_backend_nobody_registered_is_named_before_the_first_step(tmp_path: Path) -> None:
    fresh_provider_state()
    session = telemetry_jit.configure("nope", file=tmp_path / "t.jsonl")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
        pl.Trainer, session, jit_config=telemetry_jit.JitConfig(backend="nope")
    )
    with pytest.raises(LookupError, match=r"no compiler backend 'nope': registered are \[.*'torch'"):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
    telemetry_jit.shutdown()
