"""Ranks out of step, said live (docs/distributed.md): real jobs of 2 and 4 processes (torchrun, and a
SLURM-like start), gloo on CPU, each step all-reducing its gradients (tests/e2e/out_of_step_loop.py).

- a rank that recompiles with a slow backend while the others wait in ``all_reduce`` is named, with its
  frame, its cause and the ranks waiting, while it still compiles and within the stated delay;
- a rank-dependent branch is named as a graph no other rank compiled;
- a rank killed mid-run is named by the rank whose ``all_reduce`` failed, whose own error is unchanged, and
  nothing hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.runs import EventRecord, TelemetryRun
from telemetry_jit.recording.out_of_step import STALL_MIN_S
from telemetry_jit.schema import JitEventName, RanksAttr
from tests.e2e.conftest import fresh_provider_state
from tests.e2e.test_torchrun import _free_port, _without_launcher

LOOP = Path(__file__).with_name("out_of_step_loop.py")
HEARTBEAT_S = 0.5
SLOW_S = 9.0


def _environment() -> dict[str, str]:
    return {**_without_launcher(), "TELEMETRY_JIT_HEARTBEAT_S": str(HEARTBEAT_S)}


def _torchrun(ranks: int, mode: str, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), str(LOOP), str(out), mode]
    result = subprocess.run(
        [*command, str(SLOW_S)], capture_output=True, text=True, timeout=600, env=_environment(), cwd=out.parent
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _said(out: Path, rank: int = 0) -> list[EventRecord]:
    run = _run(out, rank)
    return [
        event for span in run.spans.values() for event in span.events if event.name == JitEventName.RANKS_OUT_OF_STEP
    ]


def _run(out: Path, rank: int) -> TelemetryRun:
    return telemetry_jit.read_telemetry(out.with_name(f"{out.stem}.rank{rank}{out.suffix}"))[-1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_compiling_while_the_others_wait_is_named_while_it_compiles(ranks: int, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = _torchrun(ranks, "stall", out)
    last = ranks - 1
    recompile = next(
        span for span in _run(out, last).find("compilation") if span.attributes.get("compile.is_recompile")
    )
    events = _said(out)
    stall = next(e for e in events if e.attributes[RanksAttr.KIND] == "stall")
    said = stall.attributes
    assert said[RanksAttr.RANKS] == [last] and said[RanksAttr.WAITING] == ranks - 1
    assert said[RanksAttr.STEP] == 4 and said[RanksAttr.STAGE] == "train"
    line = said[RanksAttr.LINE]
    assert f"rank {last} has been compiling forward" in line, line
    assert "size mismatch at index 0. expected 8, actual 5" in line, line  # the cause
    waits = "1 rank waits" if ranks == 2 else f"{ranks - 1} ranks wait"
    assert f"while {waits} at step 4" in line, line
    # said while it still compiled, within the delay (the longest compile so far was well under 2 s) and a scan
    assert recompile.start_unix_ns < stall.time_unix_ns < recompile.end_unix_ns
    assert STALL_MIN_S <= said[RanksAttr.SECONDS] < STALL_MIN_S + 3 * HEARTBEAT_S + 1.0
    assert (stall.time_unix_ns - recompile.start_unix_ns) / 1e9 < STALL_MIN_S + 3 * HEARTBEAT_S + 1.0
    assert line in result.stderr  # on the console, live
    ended = next(e for e in events if e.attributes[RanksAttr.KIND] == "stall_ended").attributes
    assert abs(ended[RanksAttr.SECONDS] - (recompile.end_unix_ns - recompile.start_unix_ns) / 1e9) < 1.0
    assert ended[RanksAttr.WAITING_RANKS] == list(range(last))
    # the graph only that rank compiled (the smaller batch's), said once
    divergent = [e.attributes for e in events if e.attributes[RanksAttr.KIND] == "divergent_graph"]
    assert [d[RanksAttr.RANKS] for d in divergent] == [[last]], divergent
    # every rank trained to the end
    assert all(len(_run(out, rank).find("compilation")) >= 1 for rank in range(ranks))


def test_a_rank_dependent_branch_is_named_as_a_graph_no_other_rank_compiled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    result = _torchrun(2, "diverge", out)
    events = [e.attributes for e in _said(out)]
    assert [e[RanksAttr.KIND] for e in events] == ["divergent_graph"], events  # no stall: the compile was quick
    said = events[0]
    assert said[RanksAttr.RANKS] == [1] and said[RanksAttr.STEP] == 3 and said[RanksAttr.WHAT] == "forward"
    assert "self.branch" in said[RanksAttr.WHY]
    assert "rank 1 compiled a graph for forward at step 3 that no other rank compiled" in result.stderr
    # the fleet view shows it on one screen, and --json gives it
    capsys.readouterr()
    assert cli.main(["summary", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "ranks out of step" in text and "rank 1 compiled a graph for forward at step 3" in text, text
    assert cli.main(["summary", str(tmp_path), "--json"]) == 0
    fleet = json.loads(capsys.readouterr().out)["fleets"][0]
    assert [f["kind"] for f in fleet["out_of_step"]] == ["divergent_graph"], fleet["out_of_step"]
    assert fleet["out_of_step"][0]["ranks"] == [1] and fleet["out_of_step"][0]["step"] == 3


def _start_slurm_like(mode: str, out: Path) -> list[tuple[int, str]]:
    """Each rank its own process (no agent to tear the others down): their exit codes and standard errors."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = _environment()
    ranks = [
        subprocess.Popen(
            [sys.executable, str(LOOP), str(out), mode, str(SLOW_S), address],
            env={**env, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(r), "SLURM_NTASKS": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=out.parent,
        )
        for r in range(2)
    ]
    errors = [rank.communicate(timeout=120)[1] for rank in ranks]  # nothing hangs
    return [(rank.returncode, error) for rank, error in zip(ranks, errors, strict=True)]


def test_a_killed_rank_is_named_and_nothing_hangs(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    (code0, stderr0), (code1, _) = _start_slurm_like("kill", out)
    assert code1 == -9 and code0 == 1
    # training's own error, unchanged: gloo's, from all_reduce
    assert "all_reduce" in stderr0 and "RuntimeError" in stderr0, stderr0[-3000:]
    said = [e.attributes for e in _said(out)]
    gone = next(e for e in said if e[RanksAttr.KIND] == "not_ended")
    assert gone[RanksAttr.RANKS] == [1] and gone[RanksAttr.WHY].startswith("RuntimeError")
    assert "rank 1 had not ended" in gone[RanksAttr.LINE] and "at step 4" in gone[RanksAttr.LINE]


def test_a_killed_store_host_costs_the_other_rank_nothing_but_its_own_error(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    (code0, _), (code1, stderr1) = _start_slurm_like("kill-store", out)
    assert code0 == -9 and code1 == 1
    assert "all_reduce" in stderr1 and "RuntimeError" in stderr1, stderr1[-3000:]
    assert "telemetry-jit" not in stderr1.split("Traceback", 1)[1]  # no telemetry error among training's
    run = _run(out, 1)  # its file ends whole: the run's end and its account written
    assert run.find("application")[0].end_unix_ns is not None


def test_without_a_process_group_nothing_is_published(tmp_path: Path) -> None:
    fresh_provider_state()
    telemetry_jit.configure("alone", file=tmp_path / "t.jsonl")
    threads: set[str] = set()
    compiled = torch.compile(torch.nn.Linear(4, 1), backend="eager")
    with telemetry_jit.CompileTelemetry() as telemetry:
        for step in range(3):
            telemetry.step(step)
            compiled(torch.randn(2, 4))
            threads |= {thread.name for thread in threading.enumerate()}
    telemetry_jit.shutdown()
    assert not any(name.startswith("telemetry-jit heartbeat") for name in threads), threads
    assert not any(name.startswith("telemetry-jit rank watcher") for name in threads), threads


def test_a_setting_that_cannot_mean_anything_is_refused_before_training(tmp_path: Path) -> None:
    fresh_provider_state()
    telemetry_jit.configure("bad", file=tmp_path / "t.jsonl")
    os.environ["TELEMETRY_JIT_STALL_DELAY_S"] = "soon"
    try:
        match = r"TELEMETRY_JIT_STALL_DELAY_S='soon': give a number of seconds"
        with pytest.raises(ValueError, match=match), telemetry_jit.CompileTelemetry():
            pass
    finally:
        del os.environ["TELEMETRY_JIT_STALL_DELAY_S"]
        telemetry_jit.shutdown()
