"""`telemetry-jit trace`: Chrome Trace Event format, one track per rank, compiles inside loops."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import lightning.pytorch as pl
import pytest

from telemetry_jit import JitConfig, cli, hook_trainer_cls
from tests.e2e.browser import CHROMIUM, chromium
from tests.e2e.conftest import Telemetry
from tests.models import TRAINER_DEFAULTS, Net, loader

pytestmark = pytest.mark.any_torch

REQUIRED = {"name", "ph", "ts", "pid", "tid"}
# the format's event types: ours are X, i and M; torch's compile trace adds B and E, a profile flows (s, f)
PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "R", "c"}


def validate_trace_event_format(document: dict) -> list[dict]:
    """The checks the Trace Event Format (JSON Object Format) asks of each event."""
    assert isinstance(document["traceEvents"], list)
    for event in document["traceEvents"]:
        assert set(event) >= REQUIRED, event
        assert event["ph"] in PHASES
        assert isinstance(event["pid"], (int, str)) and isinstance(event["tid"], (int, str))  # a profile names some
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
    assert {name.split()[3] for name in names} == {"0", "1"}  # "run <id> rank <R> <node>"
    tracks = json.loads(output.read_text())["otherData"]["runs"]
    assert [track["rank"] for track in tracks] == [0, 1] and len({track["pid"] for track in tracks}) == 2
    for pid in (track["pid"] for track in tracks):
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


TRACED_FIT = """
import sys, torch, lightning.pytorch as pl, telemetry_jit
sys.path.insert(0, sys.argv[1])
from tests.models import TRAINER_DEFAULTS, Net, loader

class Profiled(Net):
    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 3:
            self.profiler = torch.profiler.profile()
            self.profiler.__enter__()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 3:
            self.profiler.__exit__(None, None, None)
            self.profiler.export_chrome_trace("profile.json")

session = telemetry_jit.configure("traced", file="t.jsonl", global_batch_size=4)
config = telemetry_jit.JitConfig(use_torch=True, torch_kwargs={"backend": "aot_eager"})
HookedTrainer, callback = telemetry_jit.hook_trainer_cls(pl.Trainer, session, jit_config=config, live=False)
HookedTrainer(max_epochs=1, **TRAINER_DEFAULTS).fit(Profiled("print"), loader(18, 4), loader(8, 4))
callback.on_app_end()
"""


# tlparse's binary beside this Python (its environment need not be on PATH), else on PATH
TLPARSE = next((str(p) for p in (Path(sys.executable).parent / "tlparse",) if p.exists()), shutil.which("tlparse"))


@pytest.mark.skipif(TLPARSE is None, reason="needs tlparse (pip install tlparse; the test extra has it)")
def test_the_trace_overlays_torchs_compile_trace_and_a_profile_of_the_same_run(tmp_path: Path) -> None:
    """Absolute time: torch's own compile events (TORCH_TRACE through tlparse) fall inside the compile span
    of the same compile id, and a torch.profiler export of one step lands inside that step, on the run's pid."""
    script = tmp_path / "fit.py"
    script.write_text(TRACED_FIT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "torch_trace")}
    subprocess.run([sys.executable, str(script), str(root)], cwd=tmp_path, env=env, check=True, capture_output=True)
    (log,) = (tmp_path / "torch_trace").iterdir()
    subprocess.run([str(TLPARSE), str(log), "-o", str(tmp_path / "tl"), "--no-browser", "--overwrite"], check=True)
    output = tmp_path / "merged.json"
    chromium_events = tmp_path / "tl" / "chromium_events.json"
    argv = [
        "trace",
        str(tmp_path / "t.jsonl"),
        "--with",
        str(chromium_events),
        "--with",
        str(tmp_path / "profile.json"),
    ]
    assert cli.main([*argv, "-o", str(output)]) == 0
    document = json.loads(output.read_text())
    events = validate_trace_event_format(document)
    assert "Unix epoch" in document["otherData"]["time_origin"]
    (ours,) = document["otherData"]["runs"]
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == ours["pid"] and e.get("tid") == 1]
    compiles = {
        e["args"]["compile.id"]: e
        for e in spans
        if e["name"] == "compilation" and e["args"].get("compile.trigger") == "dynamo"
    }
    torchs = {
        (e["name"], e["ph"], e["args"]["compile_id"]): e["ts"]
        for e in json.loads(chromium_events.read_text())
        if e.get("name") in ("dynamo", "entire_frame_compile") and "compile_id" in e.get("args", {})
    }
    assert {("entire_frame_compile", "B", c) for c in compiles} <= set(torchs)  # tlparse's ids are compile.id
    for compile_id, span in compiles.items():  # as docs/tlparse.md says: entire_frame_compile lies inside,
        begin, end = (torchs["entire_frame_compile", ph, compile_id] for ph in ("B", "E"))
        assert span["ts"] - 1 <= begin <= end <= span["ts"] + span["dur"] + 1, compile_id
        assert torchs["dynamo", "B", compile_id] <= begin  # dynamo's own event starts before it (and the span)
    tracks = {e["pid"] for e in events if e["name"] == "process_name" and "chromium_events.json" in e["args"]["name"]}
    assert len(tracks) == 1 and min(tracks) > 2**22  # no process's pid: Linux gives none above 2**22
    profiled = [e for e in events if e.get("cat") == "cpu_op"]
    assert profiled and {e["pid"] for e in profiled} == {ours["pid"]}  # the same process: one track group
    steps = [e for e in events if e["name"] == "training_loop" and e["pid"] == ours["pid"]]
    assert all(steps[0]["ts"] - 2_000_000 <= e["ts"] <= steps[0]["ts"] + steps[0]["dur"] for e in profiled)
    assert any(e["name"] == "process_name" and "chromium_events.json" in e["args"]["name"] for e in events)
