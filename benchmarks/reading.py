"""How fast, and in how much memory, the commands read big inputs (prints figures; not a test).

    python benchmarks/reading.py [--size-mb 32] [--rounds 3] [--shape runs|frames|breaks|run ...]
                                 [--summary-only] [--ranks 1000] [--iterations]

Each shape is one file of ``--size-mb`` MB (``--size-mb 1024``: the 1 GB figures), made from the record
shapes of a real run's file (``tests/data/answers.jsonl``: the demo Transformer run, 19 compilations) under
a temporary folder (``TMPDIR``, /tmp), deleted once measured:

- many runs: one-line runs never seen before (a file every job appends to), then the real run;
- many frames: the real run, each of its compilations of a frame never seen before;
- many breaks: the real run, each of its compilations breaking at a line never seen before;
- one huge run: the real run's records copied again and again, each copy with spans (loops,
  compilations), events, compile ids and recompile reasons of its own, between per-iteration spans.

Per shape, in ``--rounds`` paired rounds (the machine's load weighs on both alike), each in a fresh
process: a bare ``json.loads`` of every line (the floor any reader that parses the file pays) and
``telemetry-jit summary FILE``; the median time ratio and each one's peak resident memory (``ru_maxrss`` of
the child, by ``os.wait4``); then the peak memory of ``summary --json``, ``report``, ``trace``, ``diff`` and
``check`` on the file, once each. One markdown table row per shape (docs/benchmarks.md, "Reading big inputs").

``--ranks N``: also N rank files of one run, one rank compiling less and finishing each compile later (the
time and peak memory of ``summary FOLDER``). ``--iterations``: also one file of per-iteration spans as a long
run with ``export_iteration_spans=True`` writes them, between the run's records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def _template(line: str, **fields: str) -> str:
    """``line`` (one record of the run) with each field's value replaced by a ``{name}`` placeholder."""
    record = json.loads(line)
    for name, placeholder in fields.items():
        where = record["attributes"] if "." in name else record
        where[name] = placeholder
    text = json.dumps(record, separators=(",", ":")).replace("{", "{{").replace("}", "}}")
    for placeholder in fields.values():
        text = text.replace(json.dumps(placeholder), json.dumps(placeholder).replace("<", "{").replace(">", "}"))
    return text


def _shaped(path: Path, size_mb: int, block: Callable[[int], str], inside: bool = True) -> int:
    """The run's opening records, ``block(n)`` for n = 0, 1, ... until ``path`` holds ``size_mb`` MB, then the run's
    closing records (``inside``: the blocks are inside the run; else the whole run after them); returns the number
    of blocks."""
    lines = RUN.read_text().splitlines(keepends=True)
    written = number = 0
    with path.open("w") as out:
        out.writelines(lines[:5] if inside else ())  # run_start, application, its events, the training loop's start
        while written < size_mb * 2**20:
            text = block(number)
            out.write(text)
            written += len(text)
            number += 1
        out.writelines(lines[46:] if inside else lines)  # compile_summary, the loops' and application's ends
    return number


def runs_file(path: Path, size_mb: int) -> int:
    """Many runs: ``run_start`` records of runs never seen before, one line each (a file every job appends to),
    then the real run (the last started: the one shown)."""
    start = _template(RUN.read_text().splitlines()[0], run="<n:012x>", pid="<n>")
    start = start.replace('"{n}"', "{n}")
    return _shaped(path, size_mb, lambda n: start.format(n=n) + "\n", inside=False)


def _compile_line(**fields: str) -> str:
    """A frame's first compile, its span id and compile id the block's own."""
    line = _template(RUN.read_text().splitlines()[5], span_id="<n>-c", **fields) + "\n"
    return line.replace('"compile.id":"0/0"', '"compile.id":"{n}/0"')


def frames_file(path: Path, size_mb: int) -> int:
    """Many frames: one run whose every compilation is of a frame never seen before (its name, file and id)."""
    line = _compile_line(**{"compile.frame": "forward_<n>", "compile.location": "/src/model_<n>.py:<n>"})
    return _shaped(path, size_mb, lambda n: line.format(n=n))


def breaks_file(path: Path, size_mb: int) -> int:
    """Many graph breaks: one run's compilations of one frame, each breaking at a line never seen before."""
    lines = RUN.read_text().splitlines()
    compile_line = _compile_line()
    event = _template(lines[6], span_id="<n>-c", **{"graph_break.location": "/src/layers_<n>.py:<n>"}) + "\n"
    return _shaped(path, size_mb, lambda n: compile_line.format(n=n) + event.format(n=n))


SHAPES: dict[str, tuple[str, Callable[[Path, int], int]]] = {
    "many runs": ("runs", runs_file),
    "many frames": ("frames", frames_file),
    "many breaks": ("breaks", breaks_file),
    "one huge run": ("copies of the run", mixed_file),
}


COMMANDS = {
    "summary": ["summary", "{file}"],
    "summary --json": ["summary", "--json", "{file}"],
    "report": ["report", "-o", "{folder}/out.html", "{file}"],
    "trace": ["trace", "-o", "{folder}/out.trace.json", "{file}"],
    "diff": ["diff", "{file}", "{file}"],
    "check": ["check", "--baseline", "{file}", "--no-new-graph-breaks", "{file}"],
}


def shapes(folder: Path, size_mb: int, rounds: int, every_command: bool, only: list[str]) -> None:
    """Per shape: ``summary`` and a bare pass in paired rounds (the time ratio's median, each one's peak memory),
    then each other command's peak memory once; a markdown table, a row per shape as it is done."""
    names = [name for name in COMMANDS if name != "summary"] if every_command else []
    print(f"| shape ({size_mb} MB) | records | bare pass | `summary` | ratio | `summary` peak | bare peak |", end="")
    print("".join(f" `{name}` peak |" for name in names))
    print("|---|---|---|---|---|---|---|" + "---|" * len(names))
    for shape, (unit, make) in SHAPES.items():
        if only and shape.split()[-1] not in only:
            continue
        path = folder / "shape.jsonl"
        count = make(path, size_mb)
        bare_s, ours_s, ratios, bare_mb, ours_mb = [], [], [], 0.0, 0.0
        for _ in range(rounds):  # paired: the machine's load of the moment weighs on both alike
            bare = measured([sys.executable, "-c", BARE_PASS, str(path)])
            ours = measured([sys.executable, "-m", "telemetry_jit", "summary", str(path)], allowed=(0, 1))
            bare_s.append(bare[0])
            ours_s.append(ours[0])
            ratios.append(ours[0] / bare[0])
            bare_mb, ours_mb = max(bare_mb, bare[1]), max(ours_mb, ours[1])
        row = f"| {shape} | {count:,} {unit} | {statistics.median(bare_s):.2f} s | {statistics.median(ours_s):.2f} s | "
        row += f"{statistics.median(ratios):.2f}x (max {max(ratios):.2f}x) | {ours_mb:.0f} MB | {bare_mb:.0f} MB |"
        for name in names:
            filled = [argument.format(file=path, folder=folder) for argument in COMMANDS[name]]
            row += f" {measured([sys.executable, '-m', 'telemetry_jit', *filled], allowed=(0, 1))[1]:.0f} MB |"
        print(row, flush=True)
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=32, help="each shape's file (1024: the 1 GB figures)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds of summary and the bare pass")
    parser.add_argument("--summary-only", action="store_true", help="no other command's peak memory")
    parser.add_argument("--shape", action="append", default=[], choices=["runs", "frames", "breaks", "run"])
    parser.add_argument("--ranks", type=int, default=0, help="also: this many rank files of one run (1.)")
    parser.add_argument("--iterations", action="store_true", help="also: a file of per-iteration spans (2.)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        shapes(Path(folder), args.size_mb, args.rounds, every_command=not args.summary_only, only=args.shape)
    if args.ranks:
        with tempfile.TemporaryDirectory() as folder:
            ranks = Path(folder)
            rank_files(ranks, args.ranks)
            wall, peak = measured([sys.executable, "-m", "telemetry_jit", "summary", str(ranks)])
            print(f"{args.ranks} rank files: telemetry-jit summary FOLDER {wall:.2f} s, peak {peak:.0f} MB")
    if args.iterations:
        with tempfile.TemporaryDirectory() as folder:
            big = Path(folder) / "big.jsonl"
            records = big_file(big, args.size_mb)
            size = big.stat().st_size / 2**20
            bare = measured([sys.executable, "-c", BARE_PASS, str(big)])
            ours = measured([sys.executable, "-m", "telemetry_jit", "summary", str(big)])
            print(f"one {size:.0f} MB file ({records} per-iteration records added to a real run):")
            print(f"  bare json.loads of every line:  {bare[0]:6.2f} s, peak {bare[1]:5.0f} MB")
            print(f"  telemetry-jit summary FILE:     {ours[0]:6.2f} s, peak {ours[1]:5.0f} MB")


if __name__ == "__main__":
    main()
