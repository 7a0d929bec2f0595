"""Shared fixtures: a fresh nv-one-logger provider writing to a temp file, and a clean dynamo state."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch._dynamo.utils as dynamo_utils
from nv_one_logger.core.internal.singleton import SingletonMeta
from nv_one_logger.training_telemetry.api.training_telemetry_provider import TrainingTelemetryProvider

import telemetry_jit
from telemetry_jit.exporters import identity
from telemetry_jit.reader import TelemetryRun


@dataclass
class Telemetry:
    provider: TrainingTelemetryProvider
    path: Path

    def run(self) -> TelemetryRun:
        return telemetry_jit.read_telemetry(self.path)[-1]

    def end(self) -> TelemetryRun:
        """End the application (flushes everything) and read the file."""
        from telemetry_jit.configure import _end_application

        _end_application(self.provider)
        return self.run()


def fresh_provider_state() -> None:
    # nv-one-logger allows one configuration per process; tests need one per test, each its own run.
    SingletonMeta._instances.clear()
    os.environ.pop(identity.RUN_ID_VARIABLE, None)
    identity.reset()


@pytest.fixture(autouse=True)
def clean_state() -> Iterator[None]:
    identity.reset()
    torch._dynamo.reset()
    dynamo_utils.clear_compilation_metrics()
    dynamo_utils.set_compilation_metrics_limit(100_000)
    dynamo_utils.counters.clear()
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
        from telemetry_jit.configure import _end_application

        _end_application(provider)
    fresh_provider_state()
