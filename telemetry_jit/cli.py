"""The ``telemetry-jit`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from telemetry_jit.analysis.compare import Budget, CannotTell, check, diff
from telemetry_jit.analysis.reader import TelemetryFileError, TelemetryRun, read_telemetry
from telemetry_jit.analysis.report import render_report
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.analysis.text import format_diff, format_rank_comparison, format_summary
from telemetry_jit.analysis.trace import to_trace_events


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="telemetry-jit", description="Inspect telemetry-jit files.")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print compile time, recompiles and graph breaks of a run")
    summary.add_argument("files", nargs="+", help="JSON Lines files written by telemetry-jit (one per rank)")
    summary.add_argument("--all-runs", action="store_true", help="summarize every run in a file, not only the last")
    summary.add_argument("--json", action="store_true", help="print JSON for tools (schema: docs/telemetry.md)")
    trace = commands.add_parser("trace", help="write a Chrome Trace Event / Perfetto JSON file (one track per rank)")
    trace.add_argument("files", nargs="+", help="JSON Lines files written by telemetry-jit (one per rank)")
    trace.add_argument("-o", "--output", required=True, help="the trace file to write, e.g. trace.json")
    report = commands.add_parser("report", help="write a self-contained HTML report of a run")
    report.add_argument("file", help="a JSON Lines file written by telemetry-jit")
    report.add_argument("-o", "--output", required=True, help="the HTML file to write, e.g. report.html")
    diff = commands.add_parser("diff", help="compare two runs: compile time, recompiles, graph breaks, cache")
    diff.add_argument("base", help="the run to compare with (e.g. the main branch's)")
    diff.add_argument("new", help="the run under review")
    diff.add_argument("--json", action="store_true", help="print JSON for tools instead of text")
    check = commands.add_parser(
        "check", help="exit 1 when a run breaks its compile budget (a CI gate); see docs/ci-gate.md"
    )
    check.add_argument("file", help="the run to check")
    check.add_argument("--baseline", help="a run to compare with (for --no-new-graph-breaks)")
    check.add_argument("--max-graph-breaks", type=int, metavar="N")
    check.add_argument("--max-recompiles", type=int, metavar="N")
    check.add_argument(
        "--max-unexpected-recompiles",
        type=int,
        metavar="N",
        help="recompiles beyond the expected price of switching stages (once per frame)",
    )
    check.add_argument("--max-compile-share", metavar="P", help="percent of the loop's wall time, e.g. 25 or 25%%")
    check.add_argument("--no-new-graph-breaks", action="store_true", help="fail on a graph break the baseline lacks")
    check.add_argument(
        "--user-code-only", action="store_true", help="graph-break budgets count only breaks in your own code"
    )
    args = parser.parse_args(argv)
    if args.command == "trace":
        return _trace(args.files, args.output)
    if args.command == "report":
        return _report(args.file, args.output)
    if args.command == "diff":
        return _diff(args.base, args.new, as_json=args.json)
    if args.command == "check":
        return _check(args)

    runs, status = _load_runs(args.files, all_runs=args.all_runs)
    if args.json:
        print(json.dumps({"runs": [summary_json(run) for run in runs]}, indent=2))
        return status
    for run in runs:
        print(format_summary(run))
    comparison = format_rank_comparison(runs)
    if comparison:
        print(f"\n{comparison}")
    return status


def _load_runs(paths: Sequence[str], all_runs: bool = False) -> tuple[list[TelemetryRun], int]:
    """The last run of each file (every run with ``all_runs``), and 1 if a file could not be read."""
    runs, status = [], 0
    for path in paths:
        try:
            found = read_telemetry(path)
        except (FileNotFoundError, TelemetryFileError) as error:
            print(f"telemetry-jit: {error}", file=sys.stderr)
            status = 1
            continue
        runs.extend(found if all_runs else found[-1:])
    return runs, status


def _trace(paths: Sequence[str], output: str) -> int:
    runs, status = _load_runs(paths)
    if not runs:
        return 1
    if not _write_whole(output, json.dumps(to_trace_events(runs))):
        return 1
    print(f"wrote {output}: {len(runs)} rank(s); open it in https://ui.perfetto.dev or chrome://tracing")
    return status


def _report(path: str, output: str) -> int:
    runs, status = _load_runs([path])
    if not runs:
        return 1
    if not _write_whole(output, render_report(summarize(runs[0]))):
        return 1
    print(f"wrote {output}")
    return status


def _diff(base_path: str, new_path: str, as_json: bool) -> int:
    runs, status = _load_runs([base_path, new_path])
    if status:
        return status
    result = diff(*runs)
    print(json.dumps(result.as_json(), indent=2) if as_json else format_diff(result))
    return 0


def _check(args: argparse.Namespace) -> int:
    """0: within budget; 1: a budget broken (each said); 2: cannot tell."""
    try:
        share = None if args.max_compile_share is None else _percentage(args.max_compile_share)
    except ValueError as error:
        print(f"telemetry-jit check: {error}", file=sys.stderr)
        return 2
    runs, status = _load_runs([args.file, *([args.baseline] if args.baseline else [])])
    if status:
        return 2
    budget = Budget(
        max_graph_breaks=args.max_graph_breaks,
        max_recompiles=args.max_recompiles,
        max_unexpected_recompiles=args.max_unexpected_recompiles,
        max_compile_share=share,
        no_new_graph_breaks=args.no_new_graph_breaks,
        user_code_only=args.user_code_only,
    )
    try:
        broken = check(runs[0], budget, baseline=runs[1] if args.baseline else None)
    except CannotTell as error:
        print(f"telemetry-jit check: cannot tell: {error}", file=sys.stderr)
        return 2
    if broken:
        print(f"telemetry-jit check: {args.file} breaks its compile budget:")
        print("\n".join(f"  {reason}" for reason in broken))
        return 1
    print(f"telemetry-jit check: {args.file} is within budget.")
    return 0


def _percentage(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise ValueError(f"--max-compile-share takes a percentage from 0 to 100 (e.g. 25 or 25%), got {text!r}.")
    return value / 100


def _write_whole(output: str, text: str) -> bool:
    """Write ``output`` whole or not at all: a failure (disk full, say) leaves no truncated or empty file
    behind, and an earlier file of that name as it was."""
    path = Path(output)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8", errors="replace")
        os.replace(partial, path)
    except OSError as error:
        print(f"telemetry-jit: could not write {output}: {error}", file=sys.stderr)
        return False
    finally:
        partial.unlink(missing_ok=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
