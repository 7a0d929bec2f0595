"""Telemetry never takes a training run down: broken exporters, a misconfigured provider, errors
during compilation, interrupts, resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider
from typing_extensions import override

import telemetry_jit
from telemetry_jit.analysis.runs import run_status
from telemetry_jit.exporters import IsolatedExporter
from telemetry_jit.lightning.time_events import TimeEventCallback
from telemetry_jit.recording.recorder import CompileRecorder
from tests.e2e.conftest import Telemetry, fresh_provider_state
from tests.e2e.dynamo_facts import compiles_recorded_by_torch
from tests.models import TRAINER_DEFAULTS, Block, Net, loader

ROOT = Path(__file__).resolve().parents[2]
JIT = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
RELEASE = threading.Event()


class BrokenExporter(BaseExporter):
    """Raises, hangs or crawls on every export call."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.calls = 0

    def _misbehave(self) -> None:
        self.calls += 1
        if self.mode == "raise":
            raise OSError("disk on fire")
        if self.mode == "hang":
            RELEASE.wait()
        if self.mode == "slow":
            time.sleep(0.2)

    @override
    def export_start(self, span: Span) -> None:
        self._misbehave()

    @override
    def export_stop(self, span: Span) -> None:
        self._misbehave()

    @override
    def export_event(self, event: Event, span: Span) -> None:
        self._misbehave()

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        self._misbehave()

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        self._misbehave()


def train(trainer_cls: type[pl.Trainer], epochs: int = 2) -> list[float]:
    torch._dynamo.reset()
    model = Net("print")
    trainer_cls(max_epochs=epochs, **TRAINER_DEFAULTS).fit(model, loader(18, 4), loader(8, 4))
    return model.losses


def plain_losses() -> list[float]:
    model = Net("print")
    model.model.compile(backend="eager")
    torch._dynamo.reset()
    pl.Trainer(max_epochs=2, **TRAINER_DEFAULTS).fit(model, loader(18, 4), loader(8, 4))
    return model.losses


@pytest.mark.any_torch
@pytest.mark.parametrize("mode", ["raise", "hang", "slow"])
def test_a_broken_exporter_changes_nothing_for_training_or_the_other_exporters(mode: str, tmp_path: Path) -> None:
    started = time.perf_counter()
    expected = plain_losses()
    plain_seconds = time.perf_counter() - started
    RELEASE.clear()
    broken = BrokenExporter(mode)
    exporter = IsolatedExporter(broken, max_queue_size=50, close_timeout=0.5) if mode == "hang" else broken
    fresh_provider_state()
    provider = telemetry_jit.configure("faults", file=tmp_path / "t.jsonl", exporters=[exporter])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, provider, jit_config=JIT)
            started = time.perf_counter()
            losses = train(HookedTrainer)
            seconds = time.perf_counter() - started
            callback.on_app_end()
    finally:
        RELEASE.set()
        fresh_provider_state()
    assert losses == expected
    assert broken.calls > 0
    # on the training thread, the slow exporter would add 0.2 s for each of its ~34 calls here: ~7 s
    assert seconds < plain_seconds + 4
    ours = [w for w in caught if "IsolatedExporter" in str(w.message)]
    assert 1 <= len(ours) <= 3  # configure() isolated it; each kind of trouble is reported once
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    assert run.find("compilation") and run.find("training_loop")[0].end_unix_ns is not None
    assert run.find("application")[0].end_unix_ns is not None


def test_a_failure_while_recording_a_compile_costs_one_warning(telemetry: Telemetry, monkeypatch) -> None:
    expected = plain_losses()

    def broken(*args: Any) -> None:
        raise KeyError("a telemetry bug")

    monkeypatch.setattr(telemetry_jit.recording.compile_spans, "record_attributes", broken)
    compiled_before = len(compiles_recorded_by_torch())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
        losses = train(HookedTrainer)
    assert losses == expected
    ours = [w for w in caught if "recording a compilation span" in str(w.message)]
    assert len(ours) == 1 and "a telemetry bug" in str(ours[0].message)
    run = telemetry.end()
    assert run.find("training_loop")[0].end_unix_ns is not None
    (loop,) = run.find("training_loop")
    (summary,) = [e for e in loop.events if e.name == "compile_summary"]
    assert summary.attributes["compile.count"] == len(compiles_recorded_by_torch()) - compiled_before > 0


def break_(monkeypatch: pytest.MonkeyPatch, owner: type, method: str) -> None:
    """A bug in ``owner.method``: it raises, under its own name."""

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("a telemetry bug")

    broken.__qualname__ = f"{owner.__name__}.{method}"
    monkeypatch.setattr(owner, method, broken)


# telemetry's own code where a fit reaches it: its start, every step (the sanity check's first), a loop's
# end, a time event at every validation step; with the hook that says it
OWN_CODE = {
    "recording starts": (CompileRecorder, "start", "CompileTelemetryCallback.setup"),
    "every step": (CompileRecorder, "batch_started", "CompileTelemetryCallback.on_validation_batch_start"),
    "a loop's summary": (CompileRecorder, "emit_summary", "CompileTelemetryCallback.on_train_end"),
    "a time event": (TimeEventCallback, "on_validation_batch_end", "TimeEventCallback.on_validation_batch_end"),
}


@pytest.mark.any_torch
@pytest.mark.parametrize("where", OWN_CODE)
def test_a_bug_in_telemetrys_own_hooks_costs_one_warning_not_the_run(
    where: str, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, method, hook = OWN_CODE[where]
    expected = plain_losses()
    monkeypatch.delenv("TELEMETRY_JIT_STRICT")  # as in a user's process: the bug is caught
    break_(monkeypatch, owner, method)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
        losses = train(HookedTrainer)
    assert losses == expected  # every step ran, and trained as without telemetry
    ours = [str(w.message) for w in caught if "telemetry-jit's own code" in str(w.message)]
    assert len(ours) == 1 and f"failed in {hook} (KeyError: 'a telemetry bug')" in ours[0], ours
    run = telemetry.end()
    # the hooks after the failed one still ran: the loop spans end, the file is whole
    assert run.find("training_loop")[0].end_unix_ns is not None
    assert run.find("application")[0].end_unix_ns is not None
    assert "[telemetry.own_code]" in telemetry_jit.format_summary(run)


@pytest.mark.any_torch
def test_a_bug_behind_an_explicit_call_costs_one_warning_and_every_explicit_call_is_guarded(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TELEMETRY_JIT_STRICT")
    break_(monkeypatch, TimeEventCallback, "_explicit")
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_model_init_start()  # the user's own call, as in nv-one-logger
        callback.on_model_init_end()
    ours = [str(w.message) for w in caught if "telemetry-jit's own code" in str(w.message)]
    assert len(ours) == 1 and "failed in TimeEventCallback.on_model_init_start" in ours[0], ours
    # what the user, or HookedTrainer.save_checkpoint, calls in the middle of training
    explicit = [name for name in vars(TimeEventCallback) if name.startswith("on_") and not hasattr(pl.Callback, name)]
    assert "on_save_checkpoint_start" in explicit and "on_app_end" in explicit
    assert [name for name in explicit if not hasattr(getattr(TimeEventCallback, name), "__wrapped__")] == []


@pytest.mark.any_torch
def test_a_bug_in_telemetrys_own_code_raises_where_telemetry_jit_strict_asks(telemetry: Telemetry, monkeypatch) -> None:
    monkeypatch.setenv("TELEMETRY_JIT_STRICT", "1")  # telemetry-jit's tests, or a user reporting the bug
    break_(monkeypatch, CompileRecorder, "emit_summary")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
    with pytest.raises(KeyError, match="a telemetry bug"):
        train(HookedTrainer)


@pytest.mark.any_torch
def test_a_setting_that_cannot_mean_anything_stops_fit_before_training(telemetry: Telemetry, monkeypatch) -> None:
    """A user's setting is the user's to fix: it passes the guard that catches telemetry's own bugs."""
    monkeypatch.delenv("TELEMETRY_JIT_STRICT")
    monkeypatch.setenv("TELEMETRY_JIT_HEARTBEAT_S", "often")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
    model = Net("print")
    with pytest.raises(ValueError, match="TELEMETRY_JIT_HEARTBEAT_S='often': give a number of seconds"):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    assert model.losses == []


def loop_hooks(loop: str, telemetry: Telemetry) -> tuple[Callable[[], Any], Callable[[int], Any], Callable[[], Any]]:
    """How a plain loop, or a Fabric loop, tells compile telemetry it starts, steps and ends."""
    if loop == "plain":
        recorder = telemetry_jit.CompileTelemetry(telemetry.provider)
        return recorder.__enter__, recorder.step, lambda: recorder.__exit__(None, None, None)
    fabric = L.Fabric(
        accelerator="cpu", devices=1, callbacks=[telemetry_jit.FabricCompileTelemetry(telemetry.provider)]
    )
    return (
        lambda: fabric.call("on_train_start", fabric),
        lambda step: fabric.call("on_train_batch_start", step),
        lambda: fabric.call("on_train_end"),
    )


@pytest.mark.any_torch
@pytest.mark.parametrize("loop", ["plain", "fabric"])
def test_a_bug_in_telemetrys_own_code_in_a_plain_loop_or_fabric_costs_one_warning(
    loop: str, telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TELEMETRY_JIT_STRICT")
    losses: dict[bool, list[float]] = {False: [], True: []}
    for broken in (False, True):
        if broken:  # every step, and the loop's end
            break_(monkeypatch, CompileRecorder, "batch_started")
            break_(monkeypatch, CompileRecorder, "emit_summary")
        torch.manual_seed(0)
        model = torch.compile(Block(), backend="eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        start, step, end = loop_hooks(loop, telemetry)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start()
            for index in range(6):
                step(index)
                loss = model(torch.full((4, 8), float(index))).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses[broken].append(loss.item())
            end()
    assert losses[True] == losses[False]
    ours = [str(w.message) for w in caught if "telemetry-jit's own code" in str(w.message)]
    assert len(ours) == 1 and "(KeyError: 'a telemetry bug')" in ours[0], ours


@pytest.mark.any_torch
def test_provider_not_configured_warns_once_and_training_runs() -> None:
    fresh_provider_state()
    expected = plain_losses()
    with pytest.warns(
        RuntimeWarning, match="not configured.*training runs as usual.*telemetry_jit.configure"
    ) as caught:
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, TrainingTelemetryProvider.instance(), jit_config=JIT
        )
        callback.on_model_init_start()
        callback.on_model_init_end()
        losses = train(HookedTrainer)
        callback.on_app_end()
    assert losses == expected
    assert len([w for w in caught if "not configured" in str(w.message)]) == 1


@pytest.mark.any_torch
def test_configured_after_the_trainer_was_built(tmp_path: Path) -> None:
    fresh_provider_state()
    with pytest.warns(RuntimeWarning, match="not configured"):
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, TrainingTelemetryProvider.instance(), jit_config=JIT
        )
    provider = telemetry_jit.configure("late", file=tmp_path / "t.jsonl")
    with pytest.warns(RuntimeWarning, match="configured after hook_trainer_cls"):
        train(HookedTrainer, epochs=1)
    callback.on_app_end()
    fresh_provider_state()
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    (app,) = run.find("application")
    assert run.find("training_loop")[0].parent_id == app.span_id
    assert run.find("compilation") and provider is not None


class RaisesOnShortBatch(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.linear(x))
        if x.shape[0] == 2:  # traced by dynamo when the short batch forces a recompile
            raise RuntimeError("bad batch of 2")
        return h


def test_exception_while_compiling_reaches_the_user_and_closes_the_span(telemetry: Telemetry) -> None:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        telemetry.provider,
        jit_config=telemetry_jit.JitConfig(use_torch=True, module_selector="layer0", torch_kwargs={"backend": "eager"}),
    )
    model = Net()
    model.model.layer0 = RaisesOnShortBatch()
    with pytest.raises(RuntimeError, match="^bad batch of 2$"):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    run = telemetry.run()  # before app end: everything up to the failure is in the file
    spans = sorted(run.find("compilation"), key=lambda s: s.start_unix_ns)
    assert len(spans) == len(compiles_recorded_by_torch())
    failed = spans[-1]
    assert failed.end_unix_ns is not None and failed.attributes["compile.failed"]
    (error,) = [e for e in failed.events if e.is_error]
    assert "RuntimeError: bad batch of 2" in error.attributes["error_message"]
    (loop,) = run.find("training_loop")
    assert loop.end_unix_ns is not None and any(e.is_error for e in loop.events)


def test_compilation_failing_behaves_exactly_as_torch_and_is_recorded(telemetry: Telemetry) -> None:
    def failure(hooked: bool) -> BaseException:
        torch._dynamo.reset()
        model = Net("print")
        model.model.compile(backend="eager", fullgraph=True)
        trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider)[0] if hooked else pl.Trainer
        with pytest.raises(Exception) as info:
            trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(8, 4))
        return info.value

    plain, hooked = failure(False), failure(True)
    assert type(hooked) is type(plain) and str(hooked) == str(plain)
    spans = telemetry.run().find("compilation")
    failed = [s for s in spans if s.attributes["compile.failed"]]
    assert failed and str(plain).split("\n")[0] in failed[-1].attributes["compile.failure"]
    assert any(e.is_error for e in failed[-1].events)


def broken_backend(graph: Any, inputs: Any) -> Any:
    raise ValueError("backend exploded")


def test_a_backend_that_raises(telemetry: Telemetry) -> None:
    model = Net()
    model.model.compile(backend=broken_backend)
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider)
    with pytest.raises(Exception, match="backend exploded"):
        HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(8, 4))
    failed = [s for s in telemetry.run().find("compilation") if s.attributes["compile.failed"]]
    assert failed and "backend exploded" in failed[0].attributes["compile.failure"]
    assert failed[0].attributes["compile.backend"] == "broken_backend"


INTERRUPTED = textwrap.dedent(
    """
    import os, signal, sys, time
    import lightning.pytorch as pl
    import telemetry_jit
    sys.path.insert(0, {root!r})
    from tests.models import Net, loader, TRAINER_DEFAULTS

    class Interrupted(Net):
        def training_step(self, batch, batch_idx):
            if self.global_step == 6:
                if {how!r} == "keyboard":
                    raise KeyboardInterrupt
                print("READY", flush=True)
                time.sleep(5)  # Lightning acts on SIGTERM when the step returns
            return super().training_step(batch, batch_idx)

    provider = telemetry_jit.configure("interrupted", file={path!r})
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "eager"}}))
    HookedTrainer(max_epochs=5, **TRAINER_DEFAULTS).fit(Interrupted("print"), loader(18, 4))
    """
)


@pytest.mark.any_torch
@pytest.mark.parametrize("how", ["keyboard", "sigterm"])
def test_interrupt_closes_open_spans_and_leaves_the_file_intact(how: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    script = tmp_path / "train.py"
    script.write_text(INTERRUPTED.format(root=str(ROOT), path=str(path), how=how))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if how == "sigterm":
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.stdout.readline().strip() != "READY":
            pass
        os.kill(process.pid, signal.SIGTERM)
    process.communicate(timeout=240)
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)
    run = telemetry_jit.read_telemetry(path)[-1]
    for name in ("application", "training_loop", "compilation"):
        assert run.find(name) and all(span.end_unix_ns is not None for span in run.find(name)), name
    ended = "KeyboardInterrupt" if how == "keyboard" else r"SIGTERM\w*"  # Lightning's exception for SIGTERM
    assert re.match(rf"this run INTERRUPTED: {ended} \(at train step \d+\)", run_status(run).headline())


def test_resume_from_checkpoint_keeps_counting(telemetry: Telemetry, tmp_path: Path) -> None:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
    options = dict(TRAINER_DEFAULTS, enable_checkpointing=True)
    first = HookedTrainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="last")], **options)
    first.fit(Net("print"), loader(18, 4))
    before = len(compiles_recorded_by_torch())
    torch._dynamo.reset()
    resumed = Net("print")
    HookedTrainer(max_epochs=2, **options).fit(resumed, loader(18, 4), ckpt_path=str(tmp_path / "last.ckpt"))
    assert len(resumed.losses) == 5  # only the second epoch ran
    callback.on_app_end()
    loops = telemetry.run().find("training_loop")
    counts = [next(e for e in loop.events if e.name == "compile_summary").attributes["compile.count"] for loop in loops]
    assert counts == [before, len(compiles_recorded_by_torch()) - before]
    steps = [s.attributes["train.global_step"] for s in telemetry.run().find("compilation")]
    assert min(steps[before:]) >= 5  # the resumed fit starts at the restored step


def test_nothing_exported_holds_tensor_data_or_environment_values(telemetry: Telemetry, monkeypatch) -> None:
    monkeypatch.setenv("MY_API_TOKEN", "tok-9f8e7d6c5b")
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, telemetry.provider, jit_config=JIT)
    model = Net("item")
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(model, loader(18, 4))
    callback.on_app_end()
    text = telemetry.path.read_text()
    assert "tok-9f8e7d6c5b" not in text
    assert "tensor(" not in text
    weight = f"{model.model.head.weight.flatten()[0].item():.6f}"
    assert weight not in text


@pytest.mark.any_torch
def test_reader_rejects_binary_garbage_clearly(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(os.urandom(4096).replace(b"\n", b"x") + b"\n" + os.urandom(100))
    with pytest.raises(telemetry_jit.analysis.reader.TelemetryFileError, match="not a telemetry-jit"):
        telemetry_jit.read_telemetry(garbage)


@pytest.mark.any_torch
def own_forward() -> Any:
    """A Block's forward as a code object of its own."""
    namespace: dict[str, Any] = {}
    exec("def forward(self, x):\n    return torch.tanh(self.linear(x))\n", {"torch": torch}, namespace)
    return namespace["forward"]


def test_two_fits_in_two_threads_both_train_one_records_and_the_other_says_why(telemetry: Telemetry) -> None:
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        telemetry.provider,
        jit_config=telemetry_jit.JitConfig(use_torch=True, module_selector="layer0", torch_kwargs={"backend": "eager"}),
    )
    trainers = [HookedTrainer(max_epochs=2, **TRAINER_DEFAULTS) for _ in range(2)]
    errors: list[BaseException] = []
    started = threading.Barrier(2)

    def fit(trainer: pl.Trainer) -> None:
        try:
            model = Net()
            # its own forward: dynamo keeps compiled code per code object, so with one shared forward whichever
            # thread called first would compile it for both, and the recording fit might compile nothing
            model.model.layer0.__class__ = type("OwnBlock", (type(model.model.layer0),), {"forward": own_forward()})
            started.wait()
            trainer.fit(model, loader(32, 4))
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=fit, args=(trainer,)) for trainer in trainers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert errors == []
    assert all(trainer.state.finished and trainer.global_step == 16 for trainer in trainers)  # both trained
    concurrent = [w for w in said if "already running in another thread" in str(w.message)]
    assert len(concurrent) == 1  # the one that did not record, said once
    assert not [w for w in said if "switched telemetry off" in str(w.message)]  # telemetry stayed on
    callback.on_app_end()
    run = telemetry.end()
    (loop,) = run.find("training_loop")  # one fit recorded, and its loop span ended
    assert loop.end_unix_ns is not None and run.find("compilation")


FORK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import telemetry_jit

    def train():
        model = torch.compile(torch.nn.Linear(4, 1), backend="eager")
        with telemetry_jit.CompileTelemetry() as telemetry:
            for step, batch in enumerate((8, 8, 5)):
                telemetry.step(step)
                model(torch.randn(batch, 4)).sum().backward()

    telemetry_jit.configure("fork", file=sys.argv[1])
    child = os.fork()
    train()
    if child == 0:
        sys.exit(0)  # a normal exit: atexit handlers run in the child too
    _, status = os.waitpid(child, 0)
    telemetry_jit.shutdown()
    compiles = len(torch._dynamo.utils.get_compilation_metrics())
    json.dump({"child_status": status, "compiles": compiles}, open(sys.argv[2], "w"))
    """
)


@pytest.mark.any_torch
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_after_configure_records_nothing_and_says_so(tmp_path: Path) -> None:
    script, path, facts = tmp_path / "fork.py", tmp_path / "t.jsonl", tmp_path / "facts.json"
    script.write_text(FORK_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(path), str(facts)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(facts.read_text())
    assert seen["child_status"] == 0
    assert result.stderr.count("was forked from pid") == 1  # the child said it, once
    records = [json.loads(line) for line in path.read_text().splitlines()]
    ended = [r for r in records if r["kind"] == "span" and r["name"] == "application"]
    assert len(ended) == 1  # the application span ended once, by the parent: the child wrote nothing
    run = telemetry_jit.read_telemetry(path)[-1]
    (application,) = run.find("application")  # ended once, by the parent
    assert application.end_unix_ns is not None
    assert len(run.find("compilation")) == seen["compiles"]  # the parent's compiles, not the child's added
