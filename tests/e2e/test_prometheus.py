"""OTEL_METRICS_EXPORTER=prometheus scraped by a real Prometheus server (Debian's ``prometheus``) on loopback: every
PromQL query the dashboard and the docs give reads the run's figures back."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

import telemetry_jit
from tests.e2e.conftest import dashboard_builder, fresh_provider_state
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "exporters.md", ROOT / "docs" / "telemetry.md", ROOT / "examples" / "dashboard" / "README.md"]
JIT = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Prometheus:
    """Our own Prometheus on a free loopback port, its data in a temp folder (never the packaged service's)."""

    def __init__(self, tmp_path: Path, target_port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("Debian's prometheus is not installed (scripts/install.sh --test-tools installs it)")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: telemetry-jit\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = (tmp_path / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).close()
                return
            except OSError:
                assert self.process.poll() is None, (tmp_path / "prometheus.log").read_text()
                time.sleep(0.2)
        raise AssertionError("Prometheus did not become ready in 30 s")

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        answer = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}))
        assert answer["status"] == "success", (promql, answer)
        return answer["data"]["result"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


@pytest.fixture
def exporter_port(monkeypatch: pytest.MonkeyPatch) -> int:
    port = _free_port()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    return port


@pytest.fixture
def prometheus(tmp_path: Path, exporter_port: int) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path, exporter_port)
    yield server
    server.stop()


def _fit(tmp_path: Path) -> None:
    fresh_provider_state()
    session = telemetry_jit.configure("prometheus-app", file=tmp_path / "t.jsonl", global_batch_size=4)
    trainer_cls = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=JIT)[0]
    # Net("print"): a graph break in forward, and recompiles (a last batch of another size, grad mode)
    trainer_cls(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4))


def test_every_promql_query_reads_the_runs_figures_from_a_real_prometheus(
    prometheus: Prometheus, exporter_port: int, tmp_path: Path
) -> None:
    board = dashboard_builder()
    try:
        _fit(tmp_path)
        fitted = time.time()
        # the process stays up until Prometheus has scraped what the fit recorded
        scraped = "max(timestamp(telemetry_jit_compilations_total))"
        deadline = time.monotonic() + 30
        while not (result := prometheus.query(scraped, time.time())) or float(result[0]["value"][1]) <= fitted:
            assert time.monotonic() < deadline, "Prometheus never scraped telemetry-jit's endpoint after the fit"
            time.sleep(0.2)
        at = time.time()
    finally:
        telemetry_jit.shutdown()
        fresh_provider_state()
    with pytest.raises(OSError):  # the session's end stopped serving
        urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=2)
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    (loop,) = run.find("training_loop")
    (summary,) = [e.attributes for e in loop.events if e.name == "compile_summary"]
    compiles = run.find("compilation")
    assert summary["compile.recompile_count"] > 0 and summary["compile.graph_break_count"] > 0

    def by_frame(promql: str) -> dict[str, float]:
        series = prometheus.query(promql, at)
        assert {s["metric"]["telemetry_jit_rank"] for s in series} == {"0"}, promql
        return {s["metric"]["telemetry_jit_compile_frame"]: float(s["value"][1]) for s in series}

    compilations = by_frame(board.PROMQL["compilations by frame and rank"])
    assert sum(compilations.values()) == summary["compile.count"] == len(compiles)
    frames = {s.attributes["compile.frame"] for s in compiles}
    assert compilations == {f: len([s for s in compiles if s.attributes["compile.frame"] == f]) for f in frames}
    assert sum(by_frame(board.PROMQL["recompiles by frame and rank"]).values()) == summary["compile.recompile_count"]
    breaks = by_frame(board.PROMQL["graph breaks by frame and rank"])
    assert sum(breaks.values()) == summary["compile.graph_break_count"]
    (seconds,) = prometheus.query(board.PROMQL["compile seconds by rank"], at)
    assert seconds["metric"] == {"telemetry_jit_rank": "0"}
    assert float(seconds["value"][1]) == pytest.approx(summary["compile.total_time_ms"] / 1000, abs=1e-4)
    (skew,) = prometheus.query(board.PROMQL["compile skew between ranks"], at)
    assert float(skew["value"][1]) == 0.0  # one rank
    for name, alert in board.ALERTS.items():  # accepted by Prometheus, and quiet below its threshold
        assert prometheus.query(alert, at) == [], name
    # every PromQL query the docs and the README give is one of these, run above
    given = {*board.PROMQL.values(), *board.ALERTS.values()}
    for doc in DOCS:
        for query in re.findall(r"`([^`]*telemetry_jit_\w+[^`]*)`", doc.read_text()):
            if "(" in query:  # a query, not a metric's name
                assert query in given, f"{doc.name}: {query!r} is no query the tests run against Prometheus"


def test_a_port_in_use_costs_a_warning_naming_it_not_the_run(
    exporter_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", exporter_port))
        taken.listen()
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                _fit(tmp_path)
        finally:
            telemetry_jit.shutdown()
            fresh_provider_state()
    messages = [str(w.message) for w in said if "Prometheus" in str(w.message)]
    assert len(messages) == 1, messages
    assert f"127.0.0.1:{exporter_port}" in messages[0] and "OTEL_EXPORTER_PROMETHEUS_PORT" in messages[0]
    run = telemetry_jit.read_telemetry(tmp_path / "t.jsonl")[-1]
    assert run.find("compilation"), "training and its telemetry went on"
