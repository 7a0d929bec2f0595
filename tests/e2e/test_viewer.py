"""A real trace viewer, no containers: Arize Phoenix receives a training run's spans over OTLP and
gives them back through its own REST API."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import lightning.pytorch as pl
import pytest

import telemetry_jit
from telemetry_jit.exporters import OTLPExporter
from tests.e2e.conftest import fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = Path(os.environ.get("TELEMETRY_JIT_PHOENIX", ROOT / ".venv-phoenix" / "bin" / "phoenix"))
PROJECT = "telemetry-jit-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spans_in(base: str) -> list[dict]:
    try:
        with urllib.request.urlopen(f"{base}/v1/projects/{PROJECT}/spans?limit=1000", timeout=10) as response:
            return json.load(response).get("data", [])
    except urllib.error.HTTPError as error:
        if error.code == 404:  # the project appears with its first span
            return []
        raise


def flat(attributes: dict, prefix: str = "") -> dict:
    """Phoenix nests dotted attribute names (``compile.id`` -> ``{"compile": {"id": ...}}``)."""
    out = {}
    for key, value in attributes.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


PORTS: dict[str, int] = {}  # a running Phoenix's base address -> its gRPC port


def base_for(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port`` (Linux's /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


@pytest.fixture
def phoenix(tmp_path: Path):
    if not PHOENIX.exists():
        pytest.skip(f"Arize Phoenix is not installed at {PHOENIX} (.ci/run installs it in .venv-phoenix)")
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
    }
    PORTS[base_for(port)] = grpc_port
    server = subprocess.Popen([str(PHOENIX), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = base_for(port)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("Phoenix did not start within 180 s")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_phoenix_shows_a_training_runs_compile_spans(phoenix: str, tmp_path: Path) -> None:
    fresh_provider_state()
    exporter = OTLPExporter(
        f"{phoenix}/v1/traces", protocol="http/protobuf", resource_attributes={"openinference.project.name": PROJECT}
    )
    provider = telemetry_jit.configure("viewer-test", file=tmp_path / "t.jsonl", otlp=exporter)
    HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
        pl.Trainer, provider, jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4))
    callback.on_app_end()
    fresh_provider_state()
    written = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]

    deadline, spans = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(spans) < len(written.spans):
        spans = spans_in(phoenix)
        time.sleep(0.5)
    assert sorted(s["name"] for s in spans) == sorted(s.name for s in written.spans.values())
    by_id = {s["context"]["span_id"]: s for s in spans}
    compiles = [s for s in spans if s["name"] == "compilation"]
    by_compile_id = {flat(s["attributes"])["telemetry_jit.compile.id"]: flat(s["attributes"]) for s in compiles}
    for span in written.find("compilation"):  # under OpenTelemetry's names (docs/telemetry.md, "Names over OTLP")
        shown = by_compile_id[span.attributes["compile.id"]]
        for name in ("compile.frame", "compile.location", "compile.recompile_reason", "train.global_step"):
            assert shown.get(f"telemetry_jit.{name}", "") == span.attributes[name], name
    assert all(by_id[s["parent_id"]]["name"] in ("training_loop", "validation_loop") for s in compiles)
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    breaks = [flat(e["attributes"]) for s in compiles for e in s["events"] if e["name"] == "graph_break"]
    assert breaks and all("tests/models.py:" in b["telemetry_jit.graph_break.location"] for b in breaks)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_phoenix_keeps_its_ui_on_loopback_but_its_grpc_receiver_on_every_interface(phoenix: str) -> None:
    """What docs/viewer.md says: PHOENIX_HOST=127.0.0.1 binds the UI and OTLP/HTTP to loopback, while the
    gRPC receiver listens on every interface whatever PHOENIX_HOST says."""
    http = listening(int(phoenix.rsplit(":", 1)[1]))
    grpc = listening(PORTS[phoenix])
    assert http == {"0100007F"}  # 127.0.0.1 only
    assert grpc and grpc <= {"00000000000000000000000000000000", "00000000"}  # [::] or 0.0.0.0: every interface
