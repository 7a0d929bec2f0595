"""Faults injected at every call telemetry makes into code it does not own (docs/reliability.md).

Every such call goes through one guard, and every guard is a site in ``telemetry_jit.boundary.SITES``:
this suite takes its list from there, so a site added tomorrow is tested tomorrow. For each site the
callee is made to raise (and, where the call runs off the training thread within a bound, to hang past
that bound) during a real fit that reaches it, and the test asserts what a user relies on: the fit ends
with the same number of steps, the file parses, and the summary says what telemetry lost.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from nv_one_logger.core.event import ErrorEvent, Event, TelemetryDataError
from nv_one_logger.core.span import Span
from nv_one_logger.exporter.exporter import BaseExporter
from typing_extensions import override

import telemetry_jit
import telemetry_jit.exporters.otlp  # noqa: F401 - every module that declares call sites
import telemetry_jit.lightning.trainer  # noqa: F401
import telemetry_jit.loop  # noqa: F401
from telemetry_jit import boundary
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.exporters import IsolatedExporter
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import HttpReceiver
from tests.faults import injected
from tests.models import TRAINER_DEFAULTS, Net, loader
from tests.words import flat

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = 22  # two epochs of 11 batches (the last one smaller: a recompile)
# the run that reaches each site, where it is not the everyday fit
SCENARIO = {
    "exporter.close": "nv-one-logger switched off",  # telemetry closes exporters itself only then
    "lightning.all_gather": "ddp",
    "ranks.store": "ddp",  # the rank watch starts where a process group of several ranks runs
    "ranks.publish": "ddp",
    "ranks.read": "ddp",
    "compiler.observer": "thunder",  # thunder's observer: reading thunder.compile_stats
    "nv_one_logger.recorder": "fit again",  # a fit that trains nothing: its trained_nothing record
}
BOUND_S = 1.0  # the bounds the hanging callees must be cut off at, kept short here


class Quiet(BaseExporter):
    """Another team's exporter: takes every call and does nothing."""

    @override
    def export_start(self, span: Span) -> None:
        pass

    @override
    def export_stop(self, span: Span) -> None:
        pass

    @override
    def export_event(self, event: Event, span: Span) -> None:
        pass

    @override
    def export_error(self, event: ErrorEvent, span: Span) -> None:
        pass

    @override
    def export_telemetry_data_error(self, error: TelemetryDataError) -> None:
        pass


class SwitchOff(pl.Callback):
    """nv-one-logger disabling itself mid-run (as it does after an error in its own code)."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 5:
            nv_one_logger_compat.disable()


@pytest.fixture(autouse=True)
def compiling_still_compiles() -> Iterator[None]:
    """A fault must not leave the process changed: after it, torch.compile still compiles (a payoff's eager
    stance left on would make every later run eager)."""
    yield
    from telemetry_jit.compat.torch import GRAPH_BREAK_LOGGERS

    taps = [f for name in GRAPH_BREAK_LOGGERS for f in logging.getLogger(name).filters if "Log" in type(f).__name__]
    assert taps == []  # the probe's log taps came off: a tap left on would hide torch's records from the next
    counted = torch._dynamo.utils.counters["frames"]["ok"]
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    assert torch._dynamo.utils.counters["frames"]["ok"] > counted


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver(refuse_first=1)  # refuses the first spans: they wait in the backlog, then go
    yield receiver
    receiver.stop()


def fit_everything(folder: Path, endpoint: str, scenario: str = "fit") -> tuple[pl.Trainer, Path]:
    """A fit that reaches every call site: a file, an OTLP collector with metrics, another exporter, a CSV
    logger, the live console, the payoff, validation, a graph break and recompiles."""
    fresh_provider_state()
    path = folder / "telemetry.jsonl"
    session = telemetry_jit.configure(
        "faults",
        file=path,
        otlp={
            "endpoint": endpoint,
            "protocol": "http/protobuf",
            "timeout": BOUND_S,
            "schedule_delay_millis": 50,
            "export_timeout_millis": BOUND_S * 1000,
        },
        exporters=[IsolatedExporter(Quiet(), close_timeout=BOUND_S)],
        global_batch_size=4,
    )
    use_thunder = scenario == "thunder"
    jit = telemetry_jit.JitConfig(
        use_torch=not use_thunder,
        use_thunder=use_thunder,
        module_selector="layer0",
        torch_kwargs={} if use_thunder else {"backend": "eager"},
    )
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer,
        session,
        jit_config=jit,
        live=telemetry_jit.CompileConsole(threshold_s=0.0),
        payoff=telemetry_jit.PayoffSettings(settle_steps=1, block_steps=2, blocks=1),
    )
    defaults = {**TRAINER_DEFAULTS, "logger": CSVLogger(folder / "logs"), "log_every_n_steps": 1}
    callbacks = [SwitchOff()] if scenario == "nv-one-logger switched off" else []
    trainer = HookedTrainer(max_epochs=2, limit_val_batches=2, callbacks=callbacks, **defaults)
    model = Net(None if use_thunder else "print")
    trainer.fit(model, loader(42, 4), loader(8, 4))
    if scenario == "fit again":  # max_epochs reached already: this fit returns without a step
        trainer.fit(model, loader(42, 4), loader(8, 4))
    callback.on_app_end()
    telemetry_jit.shutdown()
    return trainer, path


def said_in_summary(path: Path) -> str:
    runs = telemetry_jit.read_telemetry(path)  # the file parses
    return telemetry_jit.format_summary(runs[-1])


def run_ddp(site: str, kind: str, folder: Path) -> str:
    script = ROOT / "tests" / "e2e" / "faults_ddp.py"
    result = subprocess.run(
        [sys.executable, str(script), site, kind, str(folder)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


SITES = sorted(boundary.SITES.values(), key=lambda site: site.name)


@pytest.mark.parametrize("site", SITES, ids=[site.name for site in SITES])
def test_a_callee_that_raises_costs_the_run_nothing(
    site: boundary.CallSite, tmp_path: Path, receiver: Any, request: pytest.FixtureRequest
) -> None:
    scenario = SCENARIO.get(site.name, "fit")
    if scenario == "thunder":
        request.getfixturevalue("thunder_importable")  # skips, saying why, where thunder cannot import
    if scenario == "ddp":
        out = run_ddp(site.name, "raise", tmp_path)
        assert f"hits>0 steps={STEPS}" in out and f"[{site.name}]" in out, out
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with injected(site.name, "raise") as fault:
            trainer, path = fit_everything(tmp_path, receiver.endpoint, scenario)
    assert fault.hits > 0, f"the {scenario} scenario never reached {site.name}: give the site a scenario"
    assert trainer.global_step == STEPS
    summary = flat(said_in_summary(path))
    assert f"[{site.name}]" in summary and site.callee in summary, summary


BOUNDED = [site for site in SITES if site.bound]


@pytest.mark.parametrize("site", BOUNDED, ids=[site.name for site in BOUNDED])
def test_a_callee_that_hangs_past_its_bound_costs_the_run_nothing(
    site: boundary.CallSite, tmp_path: Path, receiver: Any
) -> None:
    plain = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_everything(tmp_path / "plain", receiver.endpoint)
    plain = time.perf_counter() - plain
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        receiver.refuse(1)  # as for the plain run
        with injected(site.name, "hang", seconds=20 * BOUND_S) as fault:
            trainer, path = fit_everything(tmp_path / "hung", receiver.endpoint)
    took = time.perf_counter() - started
    assert fault.hits > 0 and trainer.global_step == STEPS
    # cut off at its bound: the whole run waits at most a few bounds more than without the hang
    assert took < plain + 5 * BOUND_S, (took, plain)
    assert "not delivered" in flat(said_in_summary(path))


def test_warnings_made_errors_do_not_make_telemetry_fatal(tmp_path: Path, receiver: Any) -> None:
    """Warnings made errors (``python -W error::RuntimeWarning``): every warning telemetry says would raise
    inside training."""

    class Strict(CSVLogger):
        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            if any("/" in key for key in metrics):
                raise ValueError("keys with '/' are refused")
            super().log_metrics(metrics, step)

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # telemetry's warnings are RuntimeWarnings
        fresh_provider_state()
        session = telemetry_jit.configure("strict", file=tmp_path / "t.jsonl")
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, session, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
        )
        trainer = HookedTrainer(max_epochs=1, **{**TRAINER_DEFAULTS, "logger": Strict(tmp_path / "logs")})
        trainer.fit(Net("print"), loader(42, 4))
        telemetry_jit.shutdown()
    assert trainer.global_step == 11


def test_a_logger_that_refuses_some_keys_gets_the_others_and_is_not_asked_again(tmp_path: Path) -> None:
    asked: list[set[str]] = []

    class Picky(CSVLogger):
        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            asked.append(set(metrics))
            if "compile/time_s" in metrics:
                raise ValueError("no time_s here")
            super().log_metrics(metrics, step)

    fresh_provider_state()
    session = telemetry_jit.configure("picky", file=tmp_path / "t.jsonl")
    HookedTrainer, _ = telemetry_jit.hook_trainer_cls(
        pl.Trainer, session, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    with pytest.warns(RuntimeWarning, match="refuses compile/time_s; telemetry-jit does not send those to it again"):
        HookedTrainer(max_epochs=2, **{**TRAINER_DEFAULTS, "logger": Picky(tmp_path / "logs")}).fit(
            Net("print"), loader(42, 4)
        )
    telemetry_jit.shutdown()
    # asked once with every figure, once with time_s alone to find the key it refuses, never again
    assert sum("compile/time_s" in keys for keys in asked) == 2
    assert sum("compile/frame_compiles" in keys for keys in asked) > 2  # the other figures went on
    logged = (tmp_path / "logs" / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    assert "compile/frame_compiles" in logged and "compile/time_s" not in logged
