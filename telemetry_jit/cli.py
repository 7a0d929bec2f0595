"""The ``telemetry-jit`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from telemetry_jit.reader import TelemetryFileError, read_telemetry
from telemetry_jit.summary import format_rank_comparison, format_summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="telemetry-jit", description="Inspect telemetry-jit files.")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="print compile time, recompiles and graph breaks of a run")
    summary.add_argument("files", nargs="+", help="JSON Lines files written by telemetry-jit (one per rank)")
    summary.add_argument("--all-runs", action="store_true", help="summarize every run in a file, not only the last")
    args = parser.parse_args(argv)

    status = 0
    shown = []
    for path in args.files:
        try:
            runs = read_telemetry(path)
        except (FileNotFoundError, TelemetryFileError) as error:
            print(f"telemetry-jit: {error}", file=sys.stderr)
            status = 1
            continue
        for run in runs if args.all_runs else runs[-1:]:
            print(format_summary(run))
            shown.append(run)
    comparison = format_rank_comparison(shown)
    if comparison:
        print(f"\n{comparison}")
    return status


if __name__ == "__main__":
    sys.exit(main())
