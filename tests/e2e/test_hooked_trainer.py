"""hook_trainer_cls: drop-in behaviour, non-mutation, explicit calls and checkpoint spans in the file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

import telemetry_jit
from telemetry_jit import JitConfig, JitTransform, TimeEventCallback, cli, hook_trainer_cls
from telemetry_jit.compat.lightning import _GlobalStepProperty, global_step_counter
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.e2e.dynamo_facts import total_graph_breaks
from tests.models import TRAINER_DEFAULTS, Net, loader


@contextmanager
def own_provider(path: Path, **options: Any) -> Iterator[TrainingTelemetryProvider]:
    """A provider of its own for a test that needs configure() options the fixture leaves at default."""
    fresh_provider_state()
    try:
        yield telemetry_jit.configure("test-app", file=path, global_batch_size=4, **options)
    finally:
        fresh_provider_state()


def active_spans(name: str) -> list[Any]:
    return TrainingTelemetryProvider.instance().recorder.get_active_spans_by_name(name)


class Recorder(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args: object) -> None:
        self.batches += 1


def test_the_given_class_is_not_mutated(telemetry: Telemetry) -> None:
    init, save = pl.Trainer.__init__, pl.Trainer.save_checkpoint
    first, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
    second, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    assert (pl.Trainer.__init__, pl.Trainer.save_checkpoint) == (init, save)
    assert first is not second and issubclass(first, pl.Trainer) and issubclass(second, pl.Trainer)
    assert not hasattr(pl.Trainer, "nv_one_logger_callback")
    plain = pl.Trainer(**TRAINER_DEFAULTS)
    assert not any(isinstance(cb, TimeEventCallback) for cb in plain.callbacks)
    hooked = first(**TRAINER_DEFAULTS)
    assert hooked.nv_one_logger_callback is callback
    # configuration of spawned ranks, then compile summaries before the loop spans they go on end
    ours = [type(cb).__name__ for cb in hooked.callbacks[0].callbacks]
    assert ours == ["RankTelemetry", "CompileTelemetryCallback", "TimeEventCallback"]
    assert hooked.callbacks[0].callbacks[1:] == [hooked.compile_telemetry, callback]


def test_a_patch_of_the_given_class_after_hooking_is_what_its_calls_run(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fit/validate/test/predict look the given class's method up at each call, as super() would: a patch made
    # after hooking (a profiler's, a test double) runs, under telemetry's spans
    class UsersTrainer(pl.Trainer):
        pass

    HookedTrainer, _ = hook_trainer_cls(UsersTrainer, telemetry.provider)
    calls = []

    def patched(self: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(self).__name__)
        return pl.Trainer.validate(self, *args, **kwargs)

    monkeypatch.setattr(UsersTrainer, "validate", patched, raising=False)
    HookedTrainer(**TRAINER_DEFAULTS).validate(Net(), loader(8, 4), verbose=False)
    assert calls == ["HookedUsersTrainer"]
    assert len(telemetry.end().find("validation_loop")) == 1


def test_hooking_twice_starts_one_application_span(telemetry: Telemetry) -> None:
    hook_trainer_cls(pl.Trainer, telemetry.provider)
    hook_trainer_cls(pl.Trainer, telemetry.provider)
    run = telemetry.end()
    assert len(run.find("application")) == 1
    assert run.find("application")[0].end_unix_ns is not None


def test_callbacks_are_kept_single_or_list_and_jit_transform_not_duplicated(telemetry: Telemetry) -> None:
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True))
    mine = Recorder()
    single = HookedTrainer(callbacks=mine, **TRAINER_DEFAULTS)
    assert single.callbacks[0].time_events is callback and mine in single.callbacks
    assert sum(isinstance(cb, JitTransform) for cb in single.callbacks) == 1
    own = JitTransform(JitConfig(use_torch=True, module_selector="layer0"))
    trainer = HookedTrainer(callbacks=[mine, own], **TRAINER_DEFAULTS)
    transforms = [cb for cb in trainer.callbacks if isinstance(cb, JitTransform)]
    assert transforms == [own]
    trainer = HookedTrainer(callbacks=[callback, mine], **TRAINER_DEFAULTS)  # passing the callback too is harmless
    assert not any(cb is callback for cb in trainer.callbacks)  # it runs once, inside the telemetry callback
    assert trainer.callbacks[0].time_events is callback and mine in trainer.callbacks


def test_bad_arguments_are_named(telemetry: Telemetry) -> None:
    with pytest.raises(TypeError, match="Lightning Trainer class"):
        hook_trainer_cls(pl.Trainer(**TRAINER_DEFAULTS), telemetry.provider)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Lightning Trainer class"):
        hook_trainer_cls(dict, telemetry.provider)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TrainingTelemetryProvider.instance"):
        hook_trainer_cls(pl.Trainer, object())  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="matches nothing"):
        HookedTrainer, _ = hook_trainer_cls(
            pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True, module_selector="nope")
        )
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader())


class BuiltLate(pl.LightningModule):
    """Its layers built in ``configure_model`` (Lightning's way for large models: FSDP, meta-device init)."""

    def __init__(self) -> None:
        super().__init__()
        self.model: torch.nn.Module | None = None
        self.steps = 0

    def configure_model(self) -> None:
        if self.model is None:
            self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        assert self.model is not None
        return torch.nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_modules_built_in_configure_model_are_selected_compiled_and_recorded(telemetry: Telemetry) -> None:
    for selector in ("2", "3"):  # the second matches nothing: said before the first step, not after setup
        HookedTrainer, _ = hook_trainer_cls(
            pl.Trainer,
            telemetry.provider,
            jit_config=JitConfig(use_torch=True, module_selector=selector, torch_kwargs={"backend": "eager"}),
        )
        trainer, model = HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS), BuiltLate()
        if selector == "3":
            with pytest.raises(LookupError, match="module_selector '3' matches nothing"):
                trainer.fit(model, loader())
            assert model.steps == 0
            continue
        trainer.fit(model, loader())
        (transform,) = [cb for cb in trainer.callbacks if isinstance(cb, JitTransform)]
        assert transform.compiled == ["2"] and model.steps == 5
        assert trainer.compile_telemetry.last_stats.count > 0


@pytest.mark.parametrize(
    ("torch_kwargs", "torch_says"),
    [({"backend": "no_such_backend"}, "Invalid backend"), ({"mode": "max-speed"}, "Unrecognized mode")],
)
def test_arguments_torch_compile_rejects_fail_at_setup_before_any_step(
    telemetry: Telemetry, torch_kwargs: dict[str, Any], torch_says: str
) -> None:
    HookedTrainer, _ = hook_trainer_cls(
        pl.Trainer,
        telemetry.provider,
        jit_config=JitConfig(use_torch=True, module_selector="layer0", torch_kwargs=torch_kwargs),
    )
    batches: list[str] = []

    class Batches(Callback):
        def on_train_batch_start(self, *args: object) -> None:
            batches.append("train")

        def on_validation_batch_start(self, *args: object) -> None:
            batches.append("validation")

    trainer = HookedTrainer(max_epochs=1, callbacks=[Batches()], num_sanity_val_steps=2, **TRAINER_DEFAULTS)
    with pytest.raises(ValueError, match=rf"JitConfig\(torch_kwargs=.*torch.compile does not take them.*{torch_says}"):
        trainer.fit(Net(), loader(), loader(8))
    assert batches == []  # neither the sanity check nor training ran a batch


def test_explicit_calls_and_implicit_spans_land_in_the_file(telemetry: Telemetry, tmp_path: Path) -> None:
    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
    recorder = Recorder()
    callback.on_model_init_start()
    model = Net()
    callback.on_model_init_end()
    callback.on_dataloader_init_start()
    train, val = loader(16, 4), loader(8, 4)
    callback.on_dataloader_init_end()
    callback.on_optimizer_init_start()
    callback.on_optimizer_init_end()
    callback.on_load_checkpoint_start()
    callback.on_load_checkpoint_end()
    trainer = HookedTrainer(max_epochs=2, callbacks=[recorder], **TRAINER_DEFAULTS)
    trainer.fit(model, train, val)
    callback.on_testing_start()
    trainer.test(model, val, verbose=False)
    callback.on_testing_end()
    callback.on_app_end()
    run = telemetry.run()
    app = run.find("application")[0]
    for name in (
        "model_initialization",
        "data_loader_initialization",
        "optimizer_initialization",
        "checkpoint_load",
        "training_loop",
        "testing_loop",
    ):
        spans = run.find(name)
        assert len(spans) == 1, name
        assert spans[0].parent_id == app.span_id and spans[0].end_unix_ns is not None, name
    # sanity check + one validation per epoch
    assert len(run.find("validation_loop")) == 3
    assert recorder.batches == 8  # the user's callback still ran
    assert app.end_unix_ns is not None
    assert run.roots == [app]  # parent links read back both ways
    assert {span.name for span in run.spans.values() if span.parent_id == app.span_id} >= {
        "model_initialization",
        "training_loop",
        "testing_loop",
    }


def test_checkpoint_saves_automatic_and_explicit_are_spans(telemetry: Telemetry, tmp_path: Path) -> None:
    HookedTrainer, _ = hook_trainer_cls(pl.Trainer, telemetry.provider)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    options = dict(TRAINER_DEFAULTS, enable_checkpointing=True)
    trainer = HookedTrainer(max_epochs=2, callbacks=[checkpoints], default_root_dir=tmp_path, **options)
    trainer.fit(Net(), loader(8, 4))
    trainer.save_checkpoint(tmp_path / "explicit.ckpt")
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert len(saved) == 2 and (tmp_path / "explicit.ckpt").exists()
    run = telemetry.end()
    spans = run.find("checkpoint_save_sync")
    assert len(spans) == 3
    assert all(span.end_unix_ns is not None for span in spans)
    assert torch.load(tmp_path / "explicit.ckpt", weights_only=False)["global_step"] == 4


def test_works_with_lightning_cli(telemetry: Telemetry, tmp_path: Path) -> None:
    from lightning.pytorch.cli import LightningCLI

    HookedTrainer, callback = hook_trainer_cls(pl.Trainer, telemetry.provider)
    cli = LightningCLI(
        Net,
        trainer_class=HookedTrainer,
        run=False,
        args=[
            "--trainer.max_epochs=1",
            "--trainer.accelerator=cpu",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--model.width=4",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        save_config_callback=None,
    )
    assert isinstance(cli.trainer, HookedTrainer)
    assert cli.trainer.callbacks[0].time_events is callback
    cli.trainer.fit(cli.model, loader(8, 4, features=4))
    assert len(telemetry.end().find("training_loop")) == 1


def test_configure_twice_warns_and_keeps_the_first(telemetry: Telemetry) -> None:
    with pytest.warns(RuntimeWarning, match="a telemetry session is already running .* returns that session") as said:
        assert telemetry_jit.configure("again", file=None) is telemetry.provider
    assert said[0].filename == __file__  # it points at the second configure call


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"exporters": [object()]}, "takes nv-one-logger Exporter objects"),
        ({"otlp": 42}, "takes True, an endpoint, a dict of OTLPExporter arguments or an OTLPExporter"),
    ],
)
def test_bad_configure_arguments_are_named_and_leave_the_provider_configurable(
    tmp_path: Path, bad: dict[str, Any], message: str
) -> None:
    fresh_provider_state()
    try:
        with pytest.raises(TypeError, match=message):
            telemetry_jit.configure("bad", file=tmp_path / "t.jsonl", **bad)
        provider = telemetry_jit.configure("fixed", file=tmp_path / "t.jsonl")  # the corrected call works
        assert provider.config.application_name == "fixed"
        telemetry_jit.shutdown()
    finally:
        fresh_provider_state()


def test_a_long_run_keeps_the_loop_span_small_and_exports_every_update(tmp_path: Path) -> None:
    # nv-one-logger keeps each training_metrics_update on the loop span and re-formats them all every step
    path = tmp_path / "long.jsonl"
    kept_in_memory = []

    class Watch(Callback):
        def on_train_batch_end(self, *args: object) -> None:
            (loop,) = active_spans("training_loop")
            kept_in_memory.append(len(loop.events))

    with own_provider(path, log_every_n_train_iterations=2) as provider:
        HookedTrainer, callback = hook_trainer_cls(pl.Trainer, provider)
        HookedTrainer(max_epochs=3, callbacks=[Watch()], **TRAINER_DEFAULTS).fit(Net(), loader(40, 4))
        callback.on_app_end()
    assert len(kept_in_memory) == 30 and max(kept_in_memory) == 1  # the span start only
    (loop,) = telemetry_jit.read_telemetry(path)[-1].find("training_loop")
    updates = [e for e in loop.events if e.name == "training_metrics_update"]
    assert len(updates) == 15  # every second step, all in the file
    assert [e.attributes["num_iterations"] for e in updates] == list(range(2, 31, 2))
    assert loop.end_unix_ns is not None


def test_iteration_telemetry_can_be_switched_off_compile_telemetry_stays(tmp_path: Path) -> None:
    # nv-one-logger's own switches: nothing is recorded per step, the loops and compiles still are
    path = tmp_path / "t.jsonl"
    iteration_spans_seen: dict[str, list[int]] = {"training": [], "validation": []}

    class Watch(Callback):
        def on_train_batch_end(self, *args: object) -> None:
            iteration_spans_seen["training"].append(len(active_spans("training_single_iteration")))

        def on_validation_batch_end(self, *args: object) -> None:
            iteration_spans_seen["validation"].append(len(active_spans("validation_single_iteration")))

    switches = {"is_train_iterations_enabled_or_fn": False, "is_validation_iterations_enabled_or_fn": False}
    breaks_before = total_graph_breaks()
    with own_provider(path, log_every_n_train_iterations=2, **switches) as provider:
        HookedTrainer, callback = hook_trainer_cls(pl.Trainer, provider, jit_config=JitConfig(use_torch=True))
        model = Net("print")
        HookedTrainer(max_epochs=2, callbacks=[Watch()], **TRAINER_DEFAULTS).fit(model, loader(16, 4), loader(8, 4))
        callback.on_app_end()
    assert iteration_spans_seen == {"training": [0] * 8, "validation": [0] * 6}
    run = telemetry_jit.read_telemetry(path)[-1]
    (loop,) = run.find("training_loop")
    assert loop.end_unix_ns is not None
    assert not [e for e in loop.events if e.name == "training_metrics_update"]
    assert len(run.find("validation_loop")) == 3 and all(v.end_unix_ns for v in run.find("validation_loop"))
    compiles = run.find("compilation")
    breaks = [e for c in compiles for e in c.events if e.name == "graph_break"]
    assert len(breaks) == total_graph_breaks() - breaks_before > 0
    assert len(model.losses) == 8


def test_iteration_spans_when_asked_for_are_written_as_each_step_ends(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    on_disk, kept = [], []

    class Watch(Callback):
        def on_train_batch_end(self, *args: object) -> None:
            on_disk.append(path.read_text().count('"name":"training_single_iteration"'))
            kept.append(len(active_spans("training_single_iteration")))

    with own_provider(path, export_iteration_spans=True) as provider:
        HookedTrainer, callback = hook_trainer_cls(pl.Trainer, provider)
        HookedTrainer(max_epochs=2, callbacks=[Watch()], **TRAINER_DEFAULTS).fit(Net(), loader(16, 4), loader(8, 4))
        callback.on_app_end()
    run = telemetry_jit.read_telemetry(path)[-1]
    assert len(run.find("training_single_iteration")) == 8
    assert len(run.find("validation_single_iteration")) == 2 + 2 * 2  # sanity check, then each epoch
    assert on_disk == [2 * step for step in range(1, 9)]  # start and end record of each step, on disk at once
    assert kept == [0] * 8  # an ended iteration span is not kept


def test_runs_appended_to_one_file_are_summarised_last_or_all(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    for epochs in (1, 2):  # two runs of one job script, one file
        with own_provider(path) as provider:
            HookedTrainer, callback = hook_trainer_cls(pl.Trainer, provider)
            HookedTrainer(max_epochs=epochs, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
            callback.on_app_end()
    first, second = telemetry_jit.read_telemetry(path)
    assert first.run_id != second.run_id
    assert cli.main(["summary", str(path)]) == 0
    assert capsys.readouterr().out.count("telemetry-jit summary (run ") == 1
    assert cli.main(["summary", "--all-runs", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"run {first.run_id[:8]}" in out and f"run {second.run_id[:8]}" in out


class StepWatch(Callback):
    """Takes telemetry's counter of optimizer steps where the compile telemetry does (at setup) and
    compares it with ``trainer.global_step`` at every training batch."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.counter = global_step_counter(trainer)
        self.seen: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, index: int) -> None:
        self.seen.append((self.counter.completed, trainer.global_step))


class ManualNet(Net):
    """Steps its optimizer itself, every other batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        if batch_idx % 2:
            optimizer = self.optimizers()
            optimizer.step()
            optimizer.zero_grad()
        return loss


@pytest.mark.parametrize("run", ["accumulating", "manual", "resumed mid-epoch"])
def test_the_step_counter_read_each_batch_is_the_trainers_global_step(tmp_path: Path, run: str) -> None:
    # the compile telemetry reads Lightning's own counter of optimizer steps at each batch, not the property
    options: dict[str, Any] = {"max_epochs": 2}
    model: Net = ManualNet() if run == "manual" else Net()
    if run == "accumulating":
        options["accumulate_grad_batches"] = 2
    if run == "resumed mid-epoch":  # a checkpoint at step 3 of 5 batches an epoch, restored after setup
        saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
        pl.Trainer(**{**TRAINER_DEFAULTS, "enable_checkpointing": True}, max_steps=3, callbacks=[saves]).fit(
            Net(), loader()
        )
        options["ckpt_path"] = str(next(tmp_path.glob("*step=3.ckpt")))
    watch = StepWatch()
    ckpt_path = options.pop("ckpt_path", None)
    pl.Trainer(**TRAINER_DEFAULTS, callbacks=[watch], **options).fit(model, loader(), ckpt_path=ckpt_path)
    assert not isinstance(watch.counter, _GlobalStepProperty)  # Lightning's tracker, not the fallback
    assert all(counted == global_step for counted, global_step in watch.seen), watch.seen
    first_step = {"accumulating": 0, "manual": 0, "resumed mid-epoch": 3}[run]
    assert watch.seen[0][1] == first_step and watch.seen[-1][1] > first_step
