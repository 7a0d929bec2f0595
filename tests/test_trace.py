"""`telemetry-jit trace`: Chrome Trace Event format, one track per rank, compiles inside loops."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl

from telemetry_jit import JitConfig, cli, hook_trainer_cls
from tests.conftest import Telemetry
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
