"""A run leaves the process as it found it: the environment variables telemetry-jit set for the run's other
processes are gone again, and nothing is printed after the end-of-run account, OpenTelemetry's own late lines
about an export still failing (a collector that accepts and never answers) included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import telemetry_jit
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.otlp_receivers import MisbehavingCollector
from tests.e2e.test_otlp_exporter import JIT
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh() -> None:
    fresh_provider_state()
    yield
    fresh_provider_state()


def test_a_hooked_fit_leaves_the_environment_as_it_found_it(tmp_path: Path) -> None:
    before = dict(os.environ)
    session = telemetry_jit.configure("as-found", file=tmp_path / "t.jsonl")
    trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
    trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(8, 4))
    telemetry_jit.shutdown()
    assert (tmp_path / "t.jsonl").read_text().count("\n") > 3  # it did record
    assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())


def test_a_compile_telemetry_loop_leaves_the_environment_as_it_found_it(tmp_path: Path) -> None:
    before = dict(os.environ)
    telemetry_jit.configure("as-found", file=tmp_path / "t.jsonl")
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    with telemetry_jit.CompileTelemetry() as telemetry:  # it started the application: its end ends the session
        for step in range(2):
            telemetry.step(step)
            compiled(torch.randn(2, 4)).sum().backward()
    assert '"compilation"' in (tmp_path / "t.jsonl").read_text()
    assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())


def test_a_run_id_given_by_the_user_is_left_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEMETRY_JIT_RUN_ID", "my-run")
    telemetry_jit.configure("as-found", file=tmp_path / "t.jsonl")
    telemetry_jit.shutdown()
    assert os.environ["TELEMETRY_JIT_RUN_ID"] == "my-run"
    assert '"my-run"' in (tmp_path / "t.jsonl").read_text()


FIT_THEN_WAIT = textwrap.dedent(
    """
    import sys, time
    import lightning.pytorch as pl
    import telemetry_jit
    from tests.e2e.test_otlp_exporter import JIT
    from tests.models import TRAINER_DEFAULTS, Net, loader

    endpoint, protocol, path = sys.argv[1:4]
    otlp = {"endpoint": endpoint, "protocol": protocol, "timeout": 1}
    session = telemetry_jit.configure("late-lines", file=path, otlp=otlp)
    trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
    trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net(), loader(12, 4))
    print("ACCOUNT-NEXT", file=sys.stderr, flush=True)
    telemetry_jit.shutdown()
    time.sleep(4)  # OpenTelemetry's export, given up on at close, ends (and logs) meanwhile
    """
)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_nothing_is_printed_after_the_end_of_run_account(protocol: str, tmp_path: Path) -> None:
    collector = MisbehavingCollector("black-hole")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    environment.update(OTEL_BSP_SCHEDULE_DELAY="50", PYTHONWARNINGS="always")
    environment.pop("TELEMETRY_JIT_RUN_ID", None)
    try:
        ran = subprocess.run(
            [sys.executable, "-c", FIT_THEN_WAIT, collector.endpoint(protocol), protocol, str(tmp_path / "t.jsonl")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=environment,
            timeout=240,
        )
    finally:
        collector.stop()
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert collector.connections > 0
    at_close = ran.stderr.split("ACCOUNT-NEXT", 1)[1]
    account = at_close.rfind("dropped")
    assert account >= 0 and "spans delivered" in at_close, ran.stderr[-3000:]
    after = at_close[account:].split("\n", 1)[1] if "\n" in at_close[account:] else ""
    assert not after.strip(), f"printed after the account:\n{after}"
    # OpenTelemetry's own lines (ours quote its reason, inside a sentence of their own)
    assert not [line for line in ran.stderr.splitlines() if line.startswith("Failed to export")], ran.stderr[-3000:]
