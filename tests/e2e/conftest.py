"""Fixtures of the real runs: a fresh nv-one-logger provider writing to a temp file, and a clean dynamo state."""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

import telemetry_jit
from telemetry_jit import identity
from telemetry_jit.analysis.reader import TelemetryRun
from telemetry_jit.compat import nv_one_logger as nv_one_logger_compat
from telemetry_jit.compat.thunder import import_thunder
from telemetry_jit.probes import backends
from tests.e2e.dynamo_facts import reset_compile_state


@pytest.fixture
def thunder_importable() -> None:
    """Skip, saying why, where lightning-thunder does not import with this torch (docs/compatibility.md)."""
    try:
        import_thunder()
    except ImportError as error:
        pytest.skip(str(error))


needs_thunder = pytest.mark.usefixtures("thunder_importable")


@dataclass
class Telemetry:
    provider: TrainingTelemetryProvider
    path: Path

    def run(self) -> TelemetryRun:
        return telemetry_jit.read_telemetry(self.path)[-1]

    def end(self) -> TelemetryRun:
        """End the application (flushes everything) and read the file."""
        telemetry_jit.shutdown()
        return self.run()


def fresh_provider_state() -> None:
    # nv-one-logger allows one configuration per process; tests need one per test, each its own run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        telemetry_jit.shutdown()  # a session a failed test left running
    nv_one_logger_compat.forget_configuration()
    os.environ.pop(identity.RUN_ID_VARIABLE, None)


@pytest.fixture(autouse=True)
def clean_state() -> Iterator[None]:
    reset_compile_state()
    yield
    torch._dynamo.reset()


@pytest.fixture
def telemetry(tmp_path: Path) -> Iterator[Telemetry]:
    fresh_provider_state()
    path = tmp_path / "telemetry.jsonl"
    provider = telemetry_jit.configure("test-app", file=path, global_batch_size=4)
    yield Telemetry(provider, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        telemetry_jit.shutdown()
    fresh_provider_state()


def unregister_backend(name: str) -> None:
    """Forget the compiler backend a test registered by hand as ``name`` (nothing happens where there is none)."""
    backends._BACKENDS.pop(name, None)


def dashboard_builder() -> ModuleType:
    """examples/dashboard/build_dashboard.py, loaded as a module (an example, not part of the package)."""
    pytest.importorskip("grafana_foundation_sdk", reason="building the dashboard needs the test extra")
    path = Path(__file__).resolve().parents[2] / "examples" / "dashboard" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("build_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
