"""A readable summary of the compile telemetry in a run, for terminals."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from telemetry_jit.reader import SpanRecord, TelemetryRun
from telemetry_jit.schema import JitEventName, JitSpanName


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return ["  " + line for line in lines]


def _total_ms(spans: Sequence[SpanRecord]) -> float:
    return sum(span.duration_ms or 0.0 for span in spans)


def format_summary(run: TelemetryRun) -> str:
    compiles = sorted(run.find(JitSpanName.COMPILATION.value), key=lambda s: s.start_unix_ns)
    loops = run.find("training_loop") or run.find("validation_loop") or run.find("application")
    wall_ms = _total_ms(loops)
    compile_ms = _total_ms(compiles)
    recompiles = [s for s in compiles if s.attributes.get("compile.is_recompile")]
    breaks = [e for s in compiles for e in s.events if e.name == JitEventName.GRAPH_BREAK.value]
    share = f"{100 * compile_ms / wall_ms:.1f}%" if wall_ms else "n/a"
    lines = [
        f"telemetry-jit summary (run {run.run_id[:8]}, rank {run.rank})",
        f"  {loops[0].name if loops else 'run'} wall time: {wall_ms / 1000:.2f} s",
        f"  compile time: {compile_ms / 1000:.2f} s ({share} of it) in {len(compiles)} compilations",
        f"  recompilations: {len(recompiles)}    graph breaks: {len(breaks)}",
    ]
    fallbacks = [s for s in compiles if s.attributes.get("compile.fell_back_to_eager")]
    if fallbacks:
        limit_hits = sum(any(e.is_error for e in s.events) for s in fallbacks)
        lines.append(f"  fell back to eager: {len(fallbacks)} (recompile limit hit: {limit_hits})")
    errors = [s for s in compiles if s.attributes.get("compile.failed") and s not in fallbacks]
    if errors:
        lines.append(f"  failed compilations: {len(errors)}, first: {errors[0].attributes.get('compile.failure')}")
    if not compiles:
        return "\n".join([*lines, "  no compilation happened in this run"])

    per_frame: dict[tuple[str, str], list[SpanRecord]] = defaultdict(list)
    for span in compiles:
        key = (str(span.attributes.get("compile.frame") or "?"), str(span.attributes.get("compile.location") or ""))
        per_frame[key].append(span)
    rows = [
        (
            frame,
            _short(location),
            len(spans),
            sum(bool(s.attributes.get("compile.is_recompile")) for s in spans),
            sum(int(s.attributes.get("compile.graph_breaks", 0)) for s in spans),
            f"{_total_ms(spans):.1f}",
        )
        for (frame, location), spans in sorted(per_frame.items(), key=lambda item: -_total_ms(item[1]))
    ]
    lines += ["", "  per frame:", *_table(("frame", "location", "compiles", "recompiles", "breaks", "ms"), rows)]

    summaries = [e.attributes for loop in loops for e in loop.events if e.name == JitEventName.COMPILE_SUMMARY.value]
    thunder_rows = [
        row
        for summary in summaries
        for row in zip(
            summary.get("compile.thunder_modules", []),
            summary.get("compile.thunder_cache_misses", []),
            summary.get("compile.thunder_cache_hits", []),
            strict=False,
        )
    ]
    if thunder_rows:
        lines += ["", "  thunder cache:", *_table(("module", "misses", "hits"), thunder_rows)]

    reasons = Counter(str(s.attributes.get("compile.recompile_reason") or "unknown") for s in recompiles)
    if reasons:
        lines += ["", "  top recompile reasons:"]
        lines += [f"    {count}x  {reason}" for reason, count in reasons.most_common(5)]

    where = Counter(
        (
            str(e.attributes.get("graph_break.location") or "unknown location"),
            str(e.attributes.get("graph_break.reason")),
        )
        for e in breaks
    )
    if where:
        rows = [(_short(location), count, reason) for (location, reason), count in where.most_common(10)]
        lines += ["", "  graph breaks:", *_table(("location", "count", "reason"), rows)]
    return "\n".join(lines)


def _short(location: str, keep: int = 2) -> str:
    path, _, line = location.rpartition(":")
    parts = path.split("/")
    return ("/".join(parts[-keep:]) + f":{line}") if path else location


def format_rank_comparison(runs: list[TelemetryRun]) -> str | None:
    """Point out ranks of one run that compiled a different number of times than rank 0."""
    by_run: dict[str, dict[int, int]] = defaultdict(dict)
    for run in runs:
        by_run[run.run_id][run.rank] = len(run.find(JitSpanName.COMPILATION.value))
    lines = []
    for run_id, counts in by_run.items():
        if len(counts) < 2:
            continue
        reference = counts.get(0, next(iter(counts.values())))
        differing = {rank: count for rank, count in sorted(counts.items()) if count != reference}
        listed = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(counts.items()))
        if differing:
            lines.append(
                f"run {run_id[:8]}: ranks compiled a different number of times ({listed}). Ranks that recompile "
                "differently can desynchronise collectives and hang."
            )
        else:
            lines.append(f"run {run_id[:8]}: all {len(counts)} ranks compiled {reference} times.")
    return "\n".join(lines) or None
