"""What every test shares: a process whose one-time warnings have not been said yet, and torch's
structured trace left off, as in a user's process.

``unit/`` holds fast tests of one part each (no training run); ``e2e/`` real training runs, real
compilers, real collectors and browsers, for what only they can show.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest

if importlib.util.find_spec("torch") is not None:  # the analysis tests run without torch
    import torch  # noqa: F401 - its loggers must exist before pytest's log capture looks for them

from telemetry_jit import notices

# a bug in telemetry's own hooks is caught in a user's run (said once, never the end of training); here it
# raises, so no test passes over one (subprocesses the tests start inherit it)
os.environ["TELEMETRY_JIT_STRICT"] = "1"

# pytest (>= 9.2) attaches its log capture to every logger that does not propagate, torch's
# structured-trace logger among them; torch then builds that trace at every compile, as under
# TORCH_TRACE (slower, and it fails on text that is not valid UTF-8). pytest leaves a propagating
# logger alone; torch's trace has no handler of its own then, so it stays off.
_TRACE_LOG = logging.getLogger("torch.__trace")
_TRACE_PROPAGATES = _TRACE_LOG.propagate
_TRACE_LOG.propagate = True


def pytest_unconfigure(config: pytest.Config) -> None:
    _TRACE_LOG.propagate = _TRACE_PROPAGATES


@pytest.fixture(autouse=True)
def fresh_notices() -> None:
    # facts of the process (this torch, nv-one-logger) are said once per process, as in a user's; each test is one
    # (a session's own warnings need no clearing: each session says its own)
    notices.process_notices.forget()


@pytest.fixture(autouse=True)
def in_temporary_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in a folder of its own: what a Trainer writes by default (checkpoints/,
    lightning_logs/) lands there, never in the repository."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
