"""How fast, and in how much memory, the commands read big inputs (prints figures; not a test).

    python benchmarks/reading.py [--ranks 1000] [--size-mb 1024] [--mixed]

1. ``--ranks`` rank files of one run, made from a real run's file (``tests/data/answers.jsonl``: the
   demo Transformer run, 19 compilations), one rank compiling less and finishing each compile later:
   the wall time and peak memory of ``telemetry-jit summary FOLDER`` (a fresh process).
2. One file of ``--size-mb`` MB: that real run's records, then per-iteration spans as a long run with
   ``export_iteration_spans=True`` writes them, then the run's records again. Side by side, each in a
   fresh process: a bare ``json.loads`` of every line (the floor any reader that parses the file pays),
   and ``telemetry-jit summary FILE``; wall time and peak memory (``ru_maxrss``) of each.
3. With ``--mixed``, one file of ``--size-mb`` MB holding every kind of record the file exporter writes:
   the run's records copied again and again, each copy with spans (loops, compilations), events and
   compile ids of its own and recompile reasons never seen before, between per-iteration spans; the peak
   memory of each command on it (``summary``, ``summary --json``, ``report``, ``trace``, ``diff``,
   ``check``) and of ``read_telemetry``, each in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "answers.jsonl"
BARE_PASS = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


def measured(command: list[str], allowed: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """Wall seconds and peak resident MB of one fresh process (exiting with a status in ``allowed``)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) not in allowed:
        raise SystemExit(f"{' '.join(command)} failed")
    return time.perf_counter() - started, usage.ru_maxrss / 1024


def rank_files(folder: Path, ranks: int) -> None:
    records = [json.loads(line) for line in RUN.read_text().splitlines()]
    last_compile = [r["span_id"] for r in records if r.get("name") == "compilation"][-1]
    odd = ranks // 2
    for rank in range(ranks):
        lines = []
        for record in records:
            if rank == odd and record.get("name") == "compilation":
                if record["span_id"] == last_compile:
                    continue
                record = {**record, "end_unix_ns": record.get("end_unix_ns", 0) + 700_000_000}
            lines.append(json.dumps({**record, "rank": rank, "world_size": ranks}, separators=(",", ":")))
        (folder / f"run.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def big_file(path: Path, size_mb: int) -> int:
    lines = RUN.read_text().splitlines(keepends=True)
    identity = json.loads(lines[0])
    stamp = {key: identity[key] for key in ("run", "rank", "local_rank", "world_size", "node", "pid")}
    written = 0
    with path.open("w") as out:
        out.writelines(lines[: len(lines) // 2])
        number = 0
        while written < size_mb * 2**20:
            start = 1_795_000_000_000_000_000 + number * 1_000_000
            span = {"span_id": f"iteration-{number:09d}", "parent_id": None, "name": "training_single_iteration"}
            block = json.dumps({"kind": "span_start", **span, "start_unix_ns": start, **stamp}, separators=(",", ":"))
            block += "\n" + json.dumps(
                {
                    "kind": "span",
                    **span,
                    "start_unix_ns": start,
                    "end_unix_ns": start + 900_000,
                    "attributes": {},
                    **stamp,
                },
                separators=(",", ":"),
            )
            out.write(block + "\n")
            written += len(block) + 2
            number += 2
        out.writelines(lines[len(lines) // 2 :])
    return number


_IDS = re.compile(r'("(?:span_id|parent_id)":")([^"]+)')
_FRAME_ID = re.compile(r'("compile\.id":")(\d+)/')
_REASON = re.compile(r'("compile\.recompile_reason":")')
_TIME = re.compile(r'(_unix_ns":)(\d+)')
_NAME = re.compile(r'"name":"[a-z_]+"')


def _copied(line: str, copy: int) -> str:
    """A record of the run as its ``copy``-th copy: its own span ids, compile ids and reasons, 100 s later."""
    line = _IDS.sub(lambda m: f"{m[1]}{m[2]}-{copy}", line)
    line = _FRAME_ID.sub(lambda m: f"{m[1]}{int(m[2]) + copy * 1000}/", line)
    line = _REASON.sub(lambda m: f"{m[1]}copy {copy}: ", line)
    return _TIME.sub(lambda m: f"{m[1]}{int(m[2]) + copy * 100_000_000_000}", line)


def mixed_file(path: Path, size_mb: int) -> int:
    """The run's records copied until ``path`` holds ``size_mb`` MB, each copy its own spans, compile ids and
    reasons, a per-iteration span after each span's start (see the module's doc); returns the number of copies."""
    lines = RUN.read_text().splitlines()
    written = copy = 0
    with path.open("w") as out:
        out.write(lines[0] + "\n")  # run_start once
        while written < size_mb * 2**20:
            block = []
            for line in lines[1:]:
                block.append(_copied(line, copy))
                if '"kind":"span_start"' in line:
                    own = f"iteration-{copy}-{len(block)}"
                    iteration = _IDS.sub(lambda m, own=own: f"{m[1]}{own}", block[-1], count=1)
                    block.append(_NAME.sub('"name":"training_single_iteration"', iteration, count=1))
            text = "\n".join(block) + "\n"
            out.write(text)
            written += len(text)
            copy += 1
    return copy


COMMANDS = {
    "summary": ["summary", "{file}"],
    "summary --json": ["summary", "--json", "{file}"],
    "report": ["report", "-o", "{folder}/out.html", "{file}"],
    "trace": ["trace", "-o", "{folder}/out.trace.json", "{file}"],
    "diff": ["diff", "{file}", "{file}"],
    "check": ["check", "--baseline", "{file}", "--no-new-graph-breaks", "{file}"],
}
READ_TELEMETRY = "import sys\nfrom telemetry_jit import read_telemetry\nread_telemetry(sys.argv[1])\n"


def mixed(folder: Path, size_mb: int) -> None:
    path = folder / "mixed.jsonl"
    copies = mixed_file(path, size_mb)
    print(f"one {path.stat().st_size / 2**20:.0f} MB file of mixed records ({copies} copies of a run's records):")
    for name, arguments in COMMANDS.items():
        filled = [argument.format(file=path, folder=folder) for argument in arguments]
        wall, peak = measured([sys.executable, "-m", "telemetry_jit", *filled], allowed=(0, 1))
        print(f"  telemetry-jit {name + ':':16} {wall:7.2f} s, peak {peak:5.0f} MB")
    wall, peak = measured([sys.executable, "-c", READ_TELEMETRY, str(path)])
    print(f"  {'read_telemetry(FILE):':30} {wall:7.2f} s, peak {peak:5.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--mixed", action="store_true", help="only the file of mixed records (3.)")
    args = parser.parse_args()
    if args.mixed:
        with tempfile.TemporaryDirectory() as folder:
            mixed(Path(folder), args.size_mb)
        return
    summary = [sys.executable, "-m", "telemetry_jit", "summary"]
    with tempfile.TemporaryDirectory() as folder:
        ranks = Path(folder) / "ranks"
        ranks.mkdir()
        rank_files(ranks, args.ranks)
        wall, peak = measured([*summary, str(ranks)])
        print(f"{args.ranks} rank files: telemetry-jit summary FOLDER {wall:.2f} s, peak {peak:.0f} MB")
        big = Path(folder) / "big.jsonl"
        records = big_file(big, args.size_mb)
        size = big.stat().st_size / 2**20
        bare = measured([sys.executable, "-c", BARE_PASS, str(big)])
        ours = measured([*summary, str(big)])
        print(f"one {size:.0f} MB file ({records} per-iteration records added to a real run):")
        print(f"  bare json.loads of every line:  {bare[0]:6.2f} s, peak {bare[1]:5.0f} MB")
        print(f"  telemetry-jit summary FILE:     {ours[0]:6.2f} s, peak {ours[1]:5.0f} MB")
        print(f"  summary / bare pass: {ours[0] / bare[0]:.2f} of the time")


if __name__ == "__main__":
    main()
