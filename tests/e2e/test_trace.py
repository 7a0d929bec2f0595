"""`telemetry-jit trace`: Chrome Trace Event format, one track per rank, compiles inside loops."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
import urllib.parse
from pathlib import Path

import lightning.pytorch as pl
import pytest

from telemetry_jit import JitConfig, cli, hook_trainer_cls
from tests.e2e.browser import CHROMIUM, chromium
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader

REQUIRED = {"name", "ph", "ts", "pid", "tid"}


def validate_trace_event_format(document: dict) -> list[dict]:
    """The checks the Trace Event Format (JSON Object Format) asks of each event."""
    assert isinstance(document["traceEvents"], list)
    for event in document["traceEvents"]:
        assert set(event) >= REQUIRED, event
        assert event["ph"] in {"X", "i", "M"}
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in {"g", "p", "t"}
        json.dumps(event.get("args", {}))
    return document["traceEvents"]


def test_trace_nests_compiles_under_loops_one_track_per_rank(telemetry: Telemetry, tmp_path: Path, monkeypatch) -> None:
    HookedTrainer, callback = hook_trainer_cls(
        pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4), loader(8, 4))
    callback.on_app_end()
    second = tmp_path / "t.rank1.jsonl"  # a second rank's file: same run, rank 1
    lines = telemetry.path.read_text().splitlines()
    second.write_text("\n".join(line.replace('"rank":0', '"rank":1') for line in lines) + "\n")
    output = tmp_path / "trace.json"
    assert cli.main(["trace", str(telemetry.path), str(second), "-o", str(output)]) == 0
    events = validate_trace_event_format(json.loads(output.read_text()))
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {name.split()[1] for name in names} == {"0", "1"}
    for pid in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        loops = [e for e in spans if e["name"] in ("training_loop", "validation_loop")]
        compiles = [e for e in spans if e["name"] == "compilation"]
        assert compiles
        for compile_event in compiles:  # inside a loop, so viewers nest it there
            assert any(
                loop["ts"] <= compile_event["ts"]
                and compile_event["ts"] + compile_event["dur"] <= loop["ts"] + loop["dur"]
                for loop in loops
            )
        assert any(e["ph"] == "i" and e["name"] == "graph_break" and e["pid"] == pid for e in events)


SPEEDSCOPE = (
    Path(__file__).resolve().parents[2] / ".node-speedscope" / "node_modules" / "speedscope" / "dist" / "release"
)


@pytest.mark.skipif(
    CHROMIUM is None or not SPEEDSCOPE.exists(), reason="needs Debian's chromium and speedscope (.ci/run installs both)"
)
def test_trace_loads_in_speedscope(telemetry: Telemetry, tmp_path: Path) -> None:
    """speedscope, a real Trace Event consumer, imports the file in headless Chromium."""
    HookedTrainer, callback = hook_trainer_cls(
        pl.Trainer, telemetry.provider, jit_config=JitConfig(use_torch=True, torch_kwargs={"backend": "eager"})
    )
    HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Net("print"), loader(18, 4))
    callback.on_app_end()
    site = tmp_path / "site"
    shutil.copytree(SPEEDSCOPE, site)
    assert cli.main(["trace", str(telemetry.path), "-o", str(site / "trace.json")]) == 0
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        result = subprocess.run(
            chromium(
                tmp_path / "profile",
                "--virtual-time-budget=8000",
                "--dump-dom",
                f"{base}/index.html#profileURL={urllib.parse.quote(base + '/trace.json', safe='')}",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
    console = [line for line in result.stderr.splitlines() if ":CONSOLE:" in line and "GL" not in line]
    assert any("Importing as Trace Event Format profile" in line for line in console), console
    assert not [line for line in console if "rror" in line or "ailed" in line], console
    assert "<title>trace.json - speedscope</title>" in result.stdout
