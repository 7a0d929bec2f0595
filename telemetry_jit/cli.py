"""The ``telemetry-jit`` command. Exit status: 0 done, 1 a file could not be read (``check``: a budget is broken),
2 a usage error or, for ``check``, an answer it cannot give, 3 (``check``) the run did not finish."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from importlib import metadata
from pathlib import Path

from telemetry_jit.analysis.check import Budget, CannotTell, Unfinished, check
from telemetry_jit.analysis.diff import diff
from telemetry_jit.analysis.fleet import Fleet, fleets
from telemetry_jit.analysis.json_output import to_json
from telemetry_jit.analysis.reader import Loaded, TelemetryRun, load
from telemetry_jit.analysis.report import REPORT, render_fleet_report, render_report
from telemetry_jit.analysis.summary import compiled_before, summarize, summary_json
from telemetry_jit.analysis.text import fitted, format_cold_start, format_diff, format_fleet, format_summary, wrapped
from telemetry_jit.analysis.trace import TRACE, read_foreign_trace, to_trace_events
from telemetry_jit.owned_files import NotOurs, OwnKind, replace_whole
from telemetry_jit.terminal import clean

PATHS_HELP = "telemetry files written by telemetry-jit, folders of them (one file per rank), or - for standard input"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return int(args.handler(args))
    except BrokenPipeError:  # `telemetry-jit summary ... | head`: the reader left, as it may
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="telemetry-jit", description="Inspect telemetry-jit files.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {metadata.version('telemetry-jit')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        if name != "diff":
            sub.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
        sub.add_argument("--run", metavar="ID", help="the run whose id starts with ID (a file may hold several)")
        return sub

    summary = command("summary", _summary, "what a run compiled, what it cost, and what to fix first")
    summary.add_argument("--all-runs", action="store_true", help="every run of each file, not only the last")
    summary.add_argument("--json", action="store_true", help="JSON for tools (schema: docs/telemetry.md)")
    summary.add_argument("--baseline", metavar="PATH", help="a warm run: explain each compile-cache miss against it")
    _rank_options(summary)
    report = command("report", _report, "a self-contained HTML report (one run, or the ranks of one)")
    report.add_argument(
        "-o", "--output", help="the HTML file (default: beside the first input, .html), or - for standard output"
    )
    _rank_options(report)
    trace = command(
        "trace", _trace, "a Chrome Trace Event / Perfetto file in absolute time, one track per run and rank"
    )
    trace.add_argument(
        "-o", "--output", help="the trace file (default: beside the first input, .trace.json), or - for standard output"
    )
    trace.add_argument(
        "--with",
        dest="merge",
        action="append",
        default=[],
        metavar="TRACE",
        help="merge another trace of the same run: tlparse's chromium_events.json, a torch.profiler export",
    )
    trace.add_argument("--all-runs", action="store_true", help="every run of each file, not only the last")
    compare = command("diff", _diff, "two runs (or the ranks of two runs) side by side")
    compare.add_argument("base", help="the run to compare with (a file or a folder of rank files)")
    compare.add_argument("new", help="the run under review")
    compare.add_argument("--json", action="store_true", help="JSON for tools")
    gate = command("check", _check, "exit 1 when a run breaks its compile budget (a CI gate; docs/ci-gate.md)")
    gate.add_argument(
        "--baseline",
        metavar="PATH",
        help="a run to compare with (for --no-new-graph-breaks and --no-new-recompile-causes; its compile-cache "
        "misses are explained against it)",
    )
    gate.add_argument("--max-graph-breaks", type=int, metavar="N")
    gate.add_argument("--max-recompiles", type=int, metavar="N")
    gate.add_argument(
        "--max-unexpected-recompiles",
        type=int,
        metavar="N",
        help="recompiles beyond the expected price of switching stages (once per frame)",
    )
    gate.add_argument(
        "--max-compile-share",
        metavar="P",
        help="percent of the loop's wall time, with its unit: 25%% (a number of 1 or less needs the %% sign)",
    )
    gate.add_argument("--no-new-graph-breaks", action="store_true", help="fail on a graph break the baseline lacks")
    gate.add_argument(
        "--no-new-recompile-causes",
        action="store_true",
        help="fail on a recompile cause (in its kind of stage) the baseline did not have; the expected price aside",
    )
    gate.add_argument("--user-code-only", action="store_true", help="graph-break budgets count only your own code")
    gate.add_argument(
        "--no-eager-fallback",
        action="store_true",
        help="fail when a frame runs eagerly after the recompile limit or a failed compile, compiling was switched "
        "off, or compiled code never ran",
    )
    gate.add_argument(
        "--no-early-stop",
        action="store_true",
        help="fail when a loop stopped before its length (max_time, should_stop, fast_dev_run, limit_train_batches)",
    )
    gate.add_argument(
        "--max-skew", type=float, metavar="S", dest="max_skew_s", help="ranks: seconds waited for the slowest in all"
    )
    gate.add_argument("--ranks-compile-alike", action="store_true", help="ranks: every rank compiles the same")
    gate.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="judge a run that did not finish (failed, interrupted, killed, records missing) on what it recorded",
    )
    return parser


def _rank_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank", type=int, metavar="N", help="with several ranks: this rank's full view")
    parser.add_argument("--per-rank", action="store_true", help="with several ranks: each rank's full view")


def _say(text: str) -> None:
    print(clean(text))


def _complain(text: str) -> None:
    print(fitted(clean(f"telemetry-jit: {text}"), sys.stderr), file=sys.stderr)


def _load(paths: Sequence[str], args: argparse.Namespace, digest: bool = True) -> Loaded:
    """The runs ``paths`` hold; ``digest``: compilations read into aggregates (bounded memory), but for trace."""
    loaded = load(paths, all_runs=getattr(args, "all_runs", False), run_id=args.run, digest=digest)
    for line in (*loaded.errors, *loaded.notes):
        _complain(line)
    return loaded


def _chosen(loaded: Loaded, args: argparse.Namespace) -> tuple[list[TelemetryRun], list[Fleet]]:
    """The runs to show in full, and the fleets to show as one (several ranks of a run)."""
    runs = loaded.runs
    if getattr(args, "rank", None) is not None:
        runs = [run for run in runs if run.rank == args.rank]
        if not runs:
            _complain(f"no rank {args.rank} in {', '.join(map(str, loaded.paths))}")
        return runs, []
    found = [] if getattr(args, "per_rank", False) else fleets(runs)
    in_fleets = {fleet.run_id for fleet in found}
    single = [run for run in runs if run.run_id not in in_fleets]
    # a fleet is shown through its own view and one representative rank: the first of its largest group
    chosen = [
        run for fleet in found for run in runs if run.run_id == fleet.run_id and run.rank == fleet.sequences[0].ranks[0]
    ]
    return single + chosen, found


def _summary(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args)
    runs, found = _chosen(loaded, args)
    status = 1 if loaded.errors else 0
    base = None
    if args.baseline:  # its last run, to compare with
        baseline = load([args.baseline], digest=True)
        for error in baseline.errors:
            _complain(error)
        if baseline.errors or not baseline.runs:
            return 1
        base = baseline.runs[-1]
    if args.json:
        said = [summary_json(run) for run in runs]
        if base is not None:
            for facts, run in zip(said, runs, strict=True):
                facts["cache_misses_explained"] = diff(base, run).cold_start.as_json()
        _say(to_json({"runs": said, "fleets": [f.as_json() for f in found]}, indent=2))
        return status
    shown = [
        "\n".join(
            [
                format_fleet(fleet),
                *wrapped(
                    f"(rank {fleet.sequences[0].ranks[0]} speaks for its group below; --rank N or --per-rank for "
                    "others)",
                    "  ",
                ),
            ]
        )
        + "\n"
        for fleet in found
    ]
    in_fleets = {fleet.run_id for fleet in found}
    for run in runs:
        explained = "\n" + format_cold_start(diff(base, run).cold_start) if base is not None else ""
        shown.append(format_summary(run, ranks_said=run.run_id not in in_fleets) + explained)
    _say("\n\n".join(shown))
    return status if runs or found else 1


def _default_output(paths: Sequence[str], suffix: str) -> Path:
    if paths[0] == "-":
        return Path(f"telemetry{suffix}")  # read from standard input: beside nothing, so here
    first = Path(paths[0])
    return first / f"report{suffix}" if first.is_dir() else first.with_name(first.name.removesuffix(".jsonl") + suffix)


def _output(args: argparse.Namespace, loaded: Loaded, suffix: str) -> Path | None:
    """Where to write: ``-o`` (``-``: standard output), else beside the first input; never over an input."""
    if args.output == "-":
        return STDOUT
    output = Path(args.output) if args.output else _default_output(args.paths, suffix)
    if any(output.resolve() == path.resolve() for path in loaded.paths if path.exists()):
        _complain(f"will not write {output} over a file it reads; name another with -o")
        return None
    return output


def _report(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args)
    runs, found = _chosen(loaded, args)
    if not runs:
        return 1
    output = _output(args, loaded, ".html")
    if output is None:
        return 2
    summary = summarize(runs[0])
    html = render_fleet_report(found[0], summary) if found else render_report(summary)
    return _write_whole(output, REPORT, html, loaded, f"wrote {_name(output)}")


def _trace(args: argparse.Namespace) -> int:
    loaded = _load(args.paths, args, digest=False)
    if not loaded.runs:
        return 1
    output = _output(args, loaded, ".trace.json")
    if output is None:
        return 2
    others = []
    for path in args.merge:
        try:
            document = read_foreign_trace(path)
        except (OSError, ValueError) as error:
            _complain(f"trace: cannot merge {path}: {error}")
            return 2
        others.append((Path(path).name, document))
    runs = len({run.run_id for run in loaded.runs})
    merged = f", with {', '.join(name for name, _ in others)}" if others else ""
    said = (
        f"wrote {_name(output)}: {runs} run(s), {len(loaded.runs)} track(s) (one per run and rank){merged}; "
        "open it in https://ui.perfetto.dev or chrome://tracing"
    )
    return _write_whole(output, TRACE, to_json(to_trace_events(loaded.runs, others)), loaded, said)


def _diff(args: argparse.Namespace) -> int:
    sides = []
    for path in (args.base, args.new):
        runs, found = _chosen(_load([path], args), args)
        if not runs:
            return 1
        sides.append(runs[0])
    result = diff(*sides)
    _say(to_json(result.as_json(), indent=2) if args.json else format_diff(result))
    return 0


def _check(args: argparse.Namespace) -> int:
    """0: within budget; 1: a budget broken (each said); 2: cannot tell; 3: the run did not finish."""
    try:
        share = None if args.max_compile_share is None else _percentage(args.max_compile_share)
        options = {field.name: getattr(args, field.name) for field in fields(Budget)}  # each under its name
        budget = Budget(**{**options, "max_compile_share": share})
    except ValueError as error:  # a budget that means nothing: before any file is read
        _complain(f"check: {error}")
        return 2
    loaded = _load(args.paths, args)
    baseline = _load([args.baseline], args) if args.baseline else None
    if loaded.errors or not loaded.runs or (baseline is not None and (baseline.errors or not baseline.runs)):
        return 2
    if loaded.doubtful_ranks:
        _complain("check: cannot tell: the files' ranks contradict each other (see above)")
        return 2
    if loaded.concurrent:
        _complain("check: cannot tell which run to judge: several processes wrote one file at once (see above)")
        return 2
    compared = baseline.runs if baseline is not None else None
    try:
        broken = check(loaded.runs, budget, baseline=compared, allow_incomplete=args.allow_incomplete)
    except CannotTell as error:
        _complain(f"check: cannot tell: {error}")
        return 2
    except Unfinished as error:
        _complain(f"check: {error}")
        return 3
    what = ", ".join(map(str, args.paths))
    for run in loaded.runs:
        found = compiled_before(run)
        if found is not None:
            _complain(f"check: {found.words()}; judged on what it compiled itself")
    explained = format_cold_start(diff(baseline.runs[-1], loaded.runs[0]).cold_start) if baseline else ""
    if explained:
        _say(explained.lstrip("\n"))
    if broken:
        _say(
            f"telemetry-jit check: {what} breaks its compile budget:\n" + "\n".join(f"  {reason}" for reason in broken)
        )
        return 1
    _say(f"telemetry-jit check: {what} is within budget.")
    return 0


def _percentage(text: str) -> float:
    """A share budget: ``25%`` (or ``25``); ``0.5`` is refused: half a percent or half the loop?"""
    written = text.strip()
    try:
        value = float(written.removesuffix("%"))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise ValueError(f"--max-compile-share takes a percentage from 0 to 100 (e.g. 25%), got {text!r}.")
    if 0 < value <= 1 and not written.endswith("%"):
        raise ValueError(
            f"--max-compile-share {text!r} is ambiguous: {value:g}% or {100 * value:g}% of the loop? Write the unit: "
            f"{value:g}% or {100 * value:g}%."
        )
    return value / 100


STDOUT = Path("-")  # `-o -`: never a file named "-" (`-o ./-` names that one)


def _name(output: Path) -> str:
    return "standard output" if output is STDOUT else str(output)


def _write_whole(output: Path, kind: OwnKind, text: str, loaded: Loaded, said: str) -> int:
    """Write ``output`` whole or not at all, only where nothing or telemetry-jit's own ``kind`` of file lies
    (owned_files: never a device, link, FIFO or a file of the user's); then say ``said``."""
    data = text.encode("utf-8", errors="replace")
    try:
        if output is STDOUT:
            sys.stdout.flush()
            buffer = getattr(sys.stdout, "buffer", None)  # a stream of text alone (a test's, an IDE's) takes the text
            if buffer is not None:
                buffer.write(data)
            else:
                sys.stdout.write(text)
            sys.stdout.flush()
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            replace_whole(output, data, kind)
    except NotOurs as refused:
        _complain(
            f"will not write over {refused}: telemetry-jit writes only a file it creates or its own {kind.name} "
            "of an earlier command. Name another path with -o (or -o - for standard output)."
        )
        return 2
    except OSError as error:
        _complain(f"could not write {_name(output)}: {error}")
        return 1
    if output is STDOUT:
        print(clean(said), file=sys.stderr)  # standard output holds the document alone
    else:
        _say(said)
    return 1 if loaded.errors else 0


if __name__ == "__main__":
    sys.exit(main())
