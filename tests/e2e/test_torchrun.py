"""Real 2-process jobs as launchers start them: ``torchrun --nproc_per_node 2`` and a SLURM-like
start (each rank its own process with only SLURM's variables), training an FSDP2 model
(``fully_shard``, gloo on CPU) under ``torch.compile`` in a plain loop. Each job gets one run id by
itself, every rank's counts equal torch's, and FSDP's graph breaks are attributed to torch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit import cli
from telemetry_jit.analysis.runs import TelemetryRun
from tests.e2e.otlp_receivers import GrpcReceiver

LOOP = Path(__file__).with_name("fsdp_loop.py")
RUN_ID_JOB = Path(__file__).with_name("run_id_job.py")
LOSS_LINE = next(n for n, line in enumerate(LOOP.read_text().splitlines(), 1) if "# LOSS LINE" in line)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _out_of_step(run: TelemetryRun) -> list[str]:
    """What the rank watcher said in this run: its lines."""
    return [e.attributes["ranks.line"] for s in run.spans.values() for e in s.events if e.name == "ranks_out_of_step"]


def _without_launcher() -> dict[str, str]:
    """This process's environment without a run id or launcher variables: each job must find its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TELEMETRY_JIT_", "SLURM_", "TORCHELASTIC_"))}


def _launch(launcher: str, out: Path) -> str:
    """Start the job; the run id the launcher gives it."""
    env = _without_launcher()
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(LOOP), str(out)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)
        assert result.returncode == 0, result.stderr[-4000:]
        return "torchrun-"
    address = f"tcp://127.0.0.1:{_free_port()}"
    ranks = [
        subprocess.Popen(
            [sys.executable, str(LOOP), str(out), address],
            env={
                **env,
                "SLURM_JOB_ID": "4242",
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank),
                "SLURM_NTASKS": "2",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=out.parent,
        )
        for rank in range(2)
    ]
    for rank in ranks:
        _, stderr = rank.communicate(timeout=600)
        assert rank.returncode == 0, stderr[-4000:]
    return "slurm-4242.0"


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_a_launched_fsdp2_job_is_one_run_with_torchs_counts_on_every_rank(
    launcher: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    run_id = _launch(launcher, out)
    files = [tmp_path / f"t.rank{rank}.jsonl" for rank in range(2)]
    runs = [telemetry_jit.read_telemetry(file)[-1] for file in files]
    assert [run.rank for run in runs] == [0, 1]
    assert runs[0].run_id == runs[1].run_id and runs[0].run_id.startswith(run_id)  # no TELEMETRY_JIT_RUN_ID set
    for rank, run in enumerate(runs):
        torch_saw = json.loads(Path(f"{out}.torch.rank{rank}.json").read_text())
        compiles = run.find("compilation")
        assert len(compiles) == torch_saw["compiles"] > 0
        breaks = [e for span in compiles for e in span.events if e.name == "graph_break"]
        assert len(breaks) == torch_saw["graph_breaks"] > 0
        # FSDP's hooks break the graph inside torch; the line that led there is the user's loss line
        inside = [b for b in breaks if "_fully_shard" in b.attributes["graph_break.location"]]
        assert inside and all(b.attributes["graph_break.owner"] == "torch" for b in inside)
        assert all(b.attributes["graph_break.user_location"].endswith(f"fsdp_loop.py:{LOSS_LINE}") for b in inside)
        # the second block compiles the shared Block.forward again for activations: the expected price
        shared = [s for s in compiles if s.attributes.get("compile.recompile_cause") == "shared_code"]
        assert shared and all(s.attributes["compile.recompile_expected"] for s in shared)
        assert all(s.attributes["train.global_step"] == 0 for s in shared)
    assert _out_of_step(runs[0]) == []  # ranks that compile alike: the rank watcher has nothing to say

    assert cli.main(["summary", str(tmp_path)]) == 0
    out_text = capsys.readouterr().out
    assert f"(run {run_id}" in out_text and ", 2 ranks)" in out_text
    assert "compiled alike: all 2 ranks" in out_text
    assert "for other callers of one function in its first batch" in out_text


def test_lightnings_model_parallel_strategy_on_two_cpu_processes_is_exact_on_every_rank(tmp_path: Path) -> None:
    """Lightning's ModelParallelStrategy runs on CPU (gloo); its FSDP2 sharding under HookedTrainer."""
    out = tmp_path / "t.jsonl"
    script = Path(__file__).with_name("model_parallel_fit.py")
    env = _without_launcher()
    result = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    runs = [telemetry_jit.read_telemetry(tmp_path / f"t.rank{rank}.jsonl")[-1] for rank in range(2)]
    assert [run.rank for run in runs] == [0, 1] and runs[0].run_id == runs[1].run_id
    for rank, run in enumerate(runs):
        torch_saw = json.loads(Path(f"{out}.torch.rank{rank}.json").read_text())
        compiles = run.find("compilation")
        assert len(compiles) == torch_saw["compiles"] > 0
        breaks = [e for span in compiles for e in span.events if e.name == "graph_break"]
        assert len(breaks) == torch_saw["graph_breaks"] > 0
        # the print in Block.forward is the user's; a torch release may also break inside FSDP2's hooks (2.15 does)
        assert {b.attributes["graph_break.owner"] for b in breaks} <= {"user", "torch"}
        assert any(b.attributes["graph_break.owner"] == "user" for b in breaks)
    assert _out_of_step(runs[0]) == []


def test_two_torchrun_jobs_at_one_address_without_an_id_are_two_runs_and_two_traces(tmp_path: Path) -> None:
    """Every plain ``torchrun`` on a host meets at one MASTER_ADDR:MASTER_PORT: that is no job's id. The first rank
    to configure makes one, the others read it from torchrun's own store; the environment is left as found."""
    port, receiver = _free_port(), GrpcReceiver()
    try:
        for job in ("first", "second"):
            (tmp_path / job).mkdir()
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--master_port",
                str(port),
            ]
            command += [str(RUN_ID_JOB), str(tmp_path / job / "t.jsonl"), receiver.endpoint]
            env = {**_without_launcher(), "OTEL_METRICS_EXPORTER": "none"}
            result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path / job)
            assert result.returncode == 0, result.stderr[-4000:]
    finally:
        receiver.stop()
    ids = {
        job: {telemetry_jit.read_telemetry(tmp_path / job / f"t.rank{rank}.jsonl")[-1].run_id for rank in (0, 1)}
        for job in ("first", "second")
    }
    assert [len(found) for found in ids.values()] == [1, 1]  # each job: one id, shared by its ranks
    first, second = (found.pop() for found in ids.values())
    assert first != second and first.startswith("torchrun-") and second.startswith("torchrun-")
    traces: dict[str, set[str]] = {}
    for span in receiver.received.spans():
        traces.setdefault(span.resource["telemetry_jit.run_id"], set()).add(span.trace_id)
    assert set(traces) == {first, second}
    assert [len(traces[first]), len(traces[second])] == [1, 1] and traces[first] != traces[second]
