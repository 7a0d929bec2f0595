"""A real 2-process DDP training on CPU (gloo): every rank records its own compile telemetry."""

from __future__ import annotations

import csv
import json
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import telemetry_jit
from telemetry_jit import cli
from tests.e2e.otlp_receivers import GrpcReceiver
from tests.words import flat

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    import torch
    import telemetry_jit
    sys.path.insert(0, {root!r})
    from tests.models import Net, loader, TRAINER_DEFAULTS

    class RankOneRecompiles(Net):
        def training_step(self, batch, batch_idx):
            if self.global_rank == 1 and batch_idx == 1:
                self(batch[0][:3])  # a shape only rank 1 sees: a recompile only rank 1 does
            return super().training_step(batch, batch_idx)

    def main():
        provider = telemetry_jit.configure(
            "ddp-test", file={path!r}, otlp={{"endpoint": {endpoint!r}, "protocol": "grpc"}}
        )
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, provider,
            jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "aot_eager"}}),
        )
        from lightning.pytorch.loggers import CSVLogger
        logger = CSVLogger({logs!r}, name="ddp")
        trainer = HookedTrainer(
            max_epochs=2, strategy={strategy!r}, devices=2, **{{**TRAINER_DEFAULTS, "logger": logger}}
        )
        trainer.compile_telemetry.skew_warning_s = 0.0  # any difference in compile time is said
        trainer.compile_telemetry.log_figures_per_rank = True
        trainer.fit(RankOneRecompiles("print"), loader(32, 4))
        callback.on_app_end()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_process_ddp_records_every_rank(strategy: str, tmp_path: Path, capsys) -> None:
    receiver = GrpcReceiver()
    try:
        script = tmp_path / "train.py"
        path = tmp_path / "t.jsonl"
        script.write_text(
            SCRIPT.format(
                root=str(ROOT), path=str(path), endpoint=receiver.endpoint, strategy=strategy, logs=str(tmp_path)
            )
        )
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={"OTEL_BSP_SCHEDULE_DELAY": "50", **__import__("os").environ, "PYTHONWARNINGS": "always"},
        )
    finally:
        receiver.stop()
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ranks compiled a different number of times" in result.stderr
    assert re.search(r"and for [0-9.]+ s longer on rank [01] \([0-9.]+ s\) than on rank [01]", result.stderr)

    files = [tmp_path / "t.rank0.jsonl", tmp_path / "t.rank1.jsonl"]
    runs = [telemetry_jit.read_telemetry(file)[-1] for file in files]
    assert [run.rank for run in runs] == [0, 1]
    # said by rank 0's rank watcher, on the console and in its file: the graph only rank 1 compiled
    said = [e.attributes for s in runs[0].spans.values() for e in s.events if e.name == "ranks_out_of_step"]
    assert [(e["ranks.kind"], e["ranks.ranks"], e["ranks.global_step"]) for e in said] == [
        ("divergent_graph", [1], 1)
    ], said
    # the layer class Net calls twice (on the batch, on activations) recompiles once for each caller: one
    # finding in torch's words of the entry that says what changed
    line = "rank 1 compiled 2 graphs for forward at step 1 that no other rank compiled (recompile: tensor 'x' size"
    assert line in result.stderr
    assert runs[0].run_id == runs[1].run_id  # one run, two ranks
    counts = [len(run.find("compilation")) for run in runs]
    assert counts[1] > counts[0] > 0
    for rank, file in enumerate(files):
        records = [json.loads(line) for line in file.read_text().splitlines()]
        spans = [r for r in records if r["kind"] in ("span", "event", "error")]
        assert all(r["rank"] == rank and r["local_rank"] == rank and r["node"] == socket.gethostname() for r in spans)
        assert all(r["world_size"] == 2 for r in records if r["kind"] == "span")
    for run in runs:
        (loop,) = run.find("training_loop")
        (summary,) = [e for e in loop.events if e.name == "compile_summary"]
        assert summary.attributes["compile.count_by_rank"] == counts
        # each rank's compile time, as that rank recorded it
        for rank, other in enumerate(runs):
            spent = sum(span.attributes["compile.duration_ms"] for span in other.find("compilation"))
            assert summary.attributes["compile.time_ms_by_rank"][rank] == pytest.approx(spent, abs=0.01)

    # rank zero's logger holds every rank's figures at the loop's end
    with open(tmp_path / "ddp" / "version_0" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    for rank in (0, 1):
        logged = [
            float(row[f"compile/rank{rank}/compilations"]) for row in rows if row[f"compile/rank{rank}/compilations"]
        ]
        assert logged[-1] == counts[rank]

    # OTLP: both ranks' spans side by side in one trace
    received = receiver.received.spans()
    assert {s.attributes["telemetry_jit.rank"] for s in received} == {0, 1}
    assert len({s.trace_id for s in received if s.attributes["telemetry_jit.world_size"] == 2}) == 1
    # each process is its own service instance (semantic conventions): each rank, and ddp_spawn's launcher
    instances = {(s.resource["service.instance.id"], s.resource["process.pid"]) for s in received}
    assert len({i for i, _ in instances}) == len({pid for _, pid in instances}) == len(instances) >= 2
    assert len({s.resource["telemetry_jit.run_id"] for s in received}) == 1
    compiles = [s for s in received if s.name == "compilation"]
    assert sorted(s.attributes["telemetry_jit.rank"] for s in compiles) == [0] * counts[0] + [1] * counts[1]
    # what rank 0's watcher said, as a span of its own: delivered while the job ran, not at its end
    said_over_otlp = [s for s in received if s.name == "ranks_out_of_step"]
    assert [(s.attributes["telemetry_jit.rank"], s.attributes["telemetry_jit.ranks.kind"]) for s in said_over_otlp] == [
        (0, "divergent_graph")
    ]
    assert said_over_otlp[0].attributes["telemetry_jit.ranks.ranks"] == [1]

    # and the CLI points the difference out from the two files
    assert cli.main(["summary", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert f"compilations per rank: min {counts[0]:.0f} (rank 0), median" in out and f"max {counts[1]} (rank 1)" in out
    # rank 1 saw an extra shape: it compiled unlike rank 0, and the fleet view says where it first differs
    assert "1 other group(s), which can desynchronise collectives and hang:" in out
    assert f"rank 1: {counts[1]} compilations" in out and "more compiles, from" in out
    assert "ranks out of step (said live by rank 0)" in out
    # both rank files: the job, whole; one rank's file alone is one rank of two, never a whole run (its records say
    # world_size 2)
    assert cli.main(["check", *map(str, files), "--max-recompiles", "100"]) == 0
    capsys.readouterr()
    assert cli.main(["check", str(files[0]), "--max-recompiles", "100"]) == 3
    err = flat(capsys.readouterr().err)
    assert "is missing run " in err and ": rank 1 of 2 (its records say world_size 2" in err, err


SPLIT_SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import lightning.pytorch as pl
    import torch._dynamo.utils
    import telemetry_jit
    sys.path.insert(0, {root!r})
    from tests.e2e import dynamo_facts
    from tests.models import Body, Net, loader, TRAINER_DEFAULTS

    class WideBody(Body):
        def forward(self, x):
            for index in range(4):  # 4 MiB of weights: DDP's 1 MiB first bucket makes DDPOptimizer split
                x = getattr(self, f"layer{{index}}")(x)
            print("", end="")  # and one graph break in user code
            return self.head(x)

    def main():
        provider = telemetry_jit.configure("ddp-split", file={path!r})
        HookedTrainer, callback = telemetry_jit.hook_trainer_cls(
            pl.Trainer, provider,
            jit_config=telemetry_jit.JitConfig(use_torch=True, torch_kwargs={{"backend": "aot_eager"}}),
        )
        net = Net(width=512, layers=4)
        net.model.__class__ = WideBody
        trainer = HookedTrainer(max_epochs=1, strategy="ddp", devices=2, limit_train_batches=3, **TRAINER_DEFAULTS)
        trainer.fit(net, loader(16, 4, features=512))
        callback.on_app_end()
        seen_by_torch = {{
            "compiles": [[m.compile_id, m.is_forward] for m in dynamo_facts.compiles_recorded_by_torch()],
            "graph_breaks": dynamo_facts.total_graph_breaks(),
        }}
        with open(f"torch.rank{{trainer.global_rank}}.json", "w") as file:
            json.dump(seen_by_torch, file)

    if __name__ == "__main__":
        main()
    """
)


def test_ddp_optimizer_splits_are_reported_apart_from_graph_breaks(tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(SPLIT_SCRIPT.format(root=str(ROOT), path=str(tmp_path / "t.jsonl")))
    print_line = (
        script.read_text().splitlines().index('        print("", end="")  # and one graph break in user code') + 1
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "DDPOptimizer used bucket cap" not in result.stderr + result.stdout  # the console is left as it was

    files = [tmp_path / "t.rank0.jsonl", tmp_path / "t.rank1.jsonl"]
    for rank, file in enumerate(files):
        torch_saw = json.loads((tmp_path / f"torch.rank{rank}.json").read_text())
        run = telemetry_jit.read_telemetry(file)[-1]
        compiles = run.find("compilation")
        assert sorted(
            (s.attributes["compile.id"], s.attributes["compile.trigger"] != "lazy_backward") for s in compiles
        ) == sorted((compile_id, forward) for compile_id, forward in torch_saw["compiles"])
        (split,) = [(s, e) for s in compiles for e in s.events if e.name == "ddp_graph_split"]
        span, event = split
        # every subgraph DDPOptimizer made compiles its own backward: torch's count of those is the truth
        backward_graphs = [
            c for c, forward in torch_saw["compiles"] if c == span.attributes["compile.id"] and not forward
        ]
        assert event.attributes["ddp.subgraphs"] == len(backward_graphs) == 2
        assert event.attributes["ddp.splits"] == span.attributes["compile.ddp_graph_splits"] == 1
        assert event.attributes["ddp.bucket_cap_bytes"] == 25 * 2**20  # DDP's default bucket_cap_mb
        breaks = [e for s in compiles for e in s.events if e.name == "graph_break"]
        assert len(breaks) == torch_saw["graph_breaks"] == 1
        assert breaks[0].attributes["graph_break.location"] == f"{script}:{print_line}"
        (loop,) = run.find("training_loop")
        (summary,) = [e for e in loop.events if e.name == "compile_summary"]
        assert summary.attributes["compile.ddp_graph_splits"] == 1
        assert summary.attributes["compile.graph_break_count"] == 1

    assert cli.main(["summary", str(files[0])]) == 0
    out = capsys.readouterr().out
    assert "; 1 graph break" in flat(out) and "; 1 graph breaks" not in flat(out)
    assert "DDP optimizer splits: 1" in out
    assert cli.main(["report", str(files[0]), "-o", str(tmp_path / "report.html")]) == 0
    report = (tmp_path / "report.html").read_text()
    assert (
        '<table id="ddp-splits">' in report
        and '<td class="">0/0</td><td class="num">1</td>' in report.split('id="ddp-splits"')[1]
    )
