"""Live console messages: slow compiles announced, fast ones quiet, recompile storms warned."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from telemetry_jit import CompileConsole, hook_trainer_cls
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.recording import progress
from tests import models
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader
from tests.words import flat


def slow_backend(graph: Any, inputs: Any) -> Any:
    time.sleep(1.3)
    return graph.forward


def test_a_slow_compile_is_announced_while_it_runs_and_timed(telemetry: Telemetry, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="telemetry_jit")
    model = Net()
    model.model.compile(backend=slow_backend)
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=1, limit_train_batches=2, **TRAINER_DEFAULTS).fit(model, loader(8, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "telemetry_jit"]
    started = [line for line in lines if line.startswith(f"telemetry-jit: compiling forward ({models.__file__}:")]
    finished = [line for line in lines if line.startswith(f"telemetry-jit: compiled forward ({models.__file__}:")]
    assert started and finished
    assert float(finished[0].split("] in ", 1)[1].split(" s", 1)[0]) >= 1.3


def test_with_a_progress_bar_messages_go_through_it(telemetry: Telemetry, capsys) -> None:
    model = Net()
    model.model.compile(backend=slow_backend)
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    options = dict(TRAINER_DEFAULTS, enable_progress_bar=True)
    HookedTrainer(max_epochs=1, limit_train_batches=1, **options).fit(model, loader(8, 4))
    assert "telemetry-jit: compiling forward" in capsys.readouterr().out


def test_fast_compiles_are_quiet_and_live_false_is_silent(telemetry: Telemetry, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="telemetry_jit")
    model = Net("print")
    model.model.compile(backend="eager")
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    finished = [r.getMessage() for r in caplog.records if r.name == "telemetry_jit" and " in " in r.getMessage()]
    # quiet below the one-second threshold (a loaded machine can make even these compiles slower)
    assert all(float(line.split("] in ", 1)[1].split(" s", 1)[0]) >= 1.0 for line in finished)
    caplog.clear()
    slow = Net()
    slow.model.compile(backend=slow_backend)
    Quiet, _ = hook_trainer_cls(pl.Trainer, telemetry.provider, live=False)
    Quiet(max_epochs=1, limit_train_batches=1, **TRAINER_DEFAULTS).fit(slow, loader(8, 4))
    assert not [r for r in caplog.records if r.name == "telemetry_jit"]


def test_a_first_steps_line_names_its_stage_as_the_summary_does(telemetry: Telemetry, caplog) -> None:
    """Validation within fit is "validation"; a run of Trainer.validate is "validate()", live and after."""
    caplog.set_level(logging.WARNING, logger="telemetry_jit")
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    model = Net()
    model.model.compile(backend=slow_backend)
    options = dict(TRAINER_DEFAULTS, max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0)
    HookedTrainer(**options).fit(model, loader(8, 4), loader(8, 4))
    alone = Net()
    alone.model.compile(backend=slow_backend)
    HookedTrainer(**options).validate(alone, loader(8, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "telemetry_jit" and "first " in r.getMessage()]
    assert [line.split(" (")[0] for line in lines] == [
        "telemetry-jit: first train step",
        "telemetry-jit: first validation step",
        "telemetry-jit: first validate() step",
    ]
    summary = flat(format_summary(telemetry.end()))
    assert "first validation step (step 1" in summary and "first validate() step (step 0" in summary


class ShapeEveryStep(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.model(x[: 1 + batch_idx % 4].repeat(1 + batch_idx, 1))  # a new batch size every step
        return super().training_step(batch, batch_idx)


@torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64)
def test_a_recompile_storm_is_warned_once_while_training(telemetry: Telemetry) -> None:
    model = ShapeEveryStep()
    model.model.compile(backend="eager")
    seen_at: list[int] = []
    caught: list[warnings.WarningMessage] = []

    class Watch(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if not seen_at and any("recompile storm" in str(w.message) for w in caught):
                seen_at.append(trainer.global_step)

    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        caught = recorded  # fills as warnings arrive
        HookedTrainer(max_epochs=1, callbacks=[Watch()], **TRAINER_DEFAULTS).fit(model, loader(80, 4))
    storm = [w for w in caught if "recompile storm" in str(w.message)]
    assert len(storm) == 1
    message = str(storm[0].message)
    # one line: the cause, torch's reason said plainly, the fix; from the user's line that calls the frame
    assert "\n" not in message and "a dimension keeps changing between calls (tensor 'x' size mismatch" in message
    assert "Fix: mark that dimension dynamic with torch._dynamo.mark_dynamic(tensor, dim)" in message
    assert "on the tensor the compiled call receives" in message
    assert "docs/fixing.md#changing-dim" in message
    # Python names the recompiling frame of the user's code as the warning's origin, not telemetry-jit's line
    forward = type(model.model).forward.__code__
    assert (storm[0].filename, storm[0].lineno) == (forward.co_filename, forward.co_firstlineno)
    assert seen_at and seen_at[0] < 20  # while training was still running


def test_console_thresholds_given_to_hook_trainer_cls_are_kept_at_every_fit(telemetry: Telemetry, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="telemetry_jit")
    console = CompileConsole(threshold_s=30.0)  # a slow compile (1.3 s) is quiet under this threshold
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider, live=console)
    for _ in range(2):  # the second setup must not rebuild the console with default thresholds
        model = Net()
        model.model.compile(backend=slow_backend)
        trainer = HookedTrainer(max_epochs=1, limit_train_batches=1, **TRAINER_DEFAULTS)
        trainer.fit(model, loader(8, 4))
        assert trainer.compile_telemetry.console is console
        assert not [r for r in caplog.records if r.name == "telemetry_jit"]
    with pytest.raises(TypeError, match="CompileConsole"):
        hook_trainer_cls(pl.Trainer, telemetry.provider, live="yes")


def test_a_long_compile_says_how_far_it_is_every_so_often_on_the_console_and_the_loop_span(
    telemetry: Telemetry, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.4)  # 30 s in a real run
    caplog.set_level(logging.WARNING, logger="telemetry_jit")
    model = Net()
    model.model.compile(backend=slow_backend)  # each compile runs at least 1.3 s
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    HookedTrainer(max_epochs=1, limit_train_batches=2, **TRAINER_DEFAULTS).fit(model, loader(8, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "telemetry_jit"]
    still = [line for line in lines if line.startswith(f"telemetry-jit: still compiling forward ({models.__file__}:")]
    assert still, lines
    # said while it ran: between the compile's first line and its last
    assert lines.index(still[0]) < next(i for i, line in enumerate(lines) if line.startswith("telemetry-jit: compiled"))
    run = telemetry.end()
    (compile_span,) = [span for span in run.find("compilation") if span.attributes["compile.id"] == "0/0"]
    ticks = list(run.events("compile_progress"))
    assert ticks and all(f"({models.__file__}:" in tick.attributes["compile.in_progress"] for tick in ticks)
    elapsed = [tick.attributes["compile.elapsed_s"] for tick in ticks]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0.4
    # torch's own region, read from the compiling thread's stack (the backend runs inside dynamo's compile)
    assert all(tick.attributes["compile.phase"] for tick in ticks), [tick.attributes for tick in ticks]
    # every tick fell inside a compile: none after its end (a later tick would be a line about a finished compile)
    first = [tick for tick in ticks if "[0/0]" in tick.attributes["compile.in_progress"]]
    assert first and all(tick.time_unix_ns <= compile_span.end_unix_ns for tick in first)
