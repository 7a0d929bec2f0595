"""The analysis as terminal text: the summary, the comparison of ranks, the diff of two runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from telemetry_jit.analysis.compare import RunDiff
from telemetry_jit.analysis.diagnose import Diagnosis
from telemetry_jit.analysis.fleet import Fleet
from telemetry_jit.analysis.reader import TelemetryRun, number
from telemetry_jit.analysis.status import run_status
from telemetry_jit.analysis.summary import DDP_HEADERS, FRAME_HEADERS, THUNDER_HEADERS, summarize
from telemetry_jit.diagnosis import first_step_line, short
from telemetry_jit.identity import short_run_id
from telemetry_jit.records import Payoff
from telemetry_jit.schema import FILE_FORMAT, CompileAttr

_CELL_LIMIT = 100


def one_line(text: object, limit: int = _CELL_LIMIT) -> str:
    """``text`` fit for one terminal line: its first line, control characters shown as ``?``, at most
    ``limit`` characters (torch's reasons run to many lines, and a user's message to megabytes)."""
    first = str(text).strip().split("\n", 1)[0]
    first = "".join(c if c.isprintable() else "?" for c in first[: limit + 1])
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[one_line(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return ["  " + line for line in lines]


def format_summary(run: TelemetryRun) -> str:
    """The summary as terminal text."""
    s = summarize(run)
    source = f"run {short_run_id(run.run_id)}" if run.file_format == FILE_FORMAT else f"{run.file_format} file"
    status = run_status(run)
    lines = [
        f"telemetry-jit summary ({source}, rank {run.rank})",
        *([f"  {status.headline()}"] if not status.finished else []),
        *[f"  (this file format has {what})" for what in run.lacks],
        *format_diagnosis(s.diagnosis),
        *([f"  compile payoff: {s.payoff_sentence}"] if s.payoff is not None else []),
        *([f"    {net_line(s.payoff)}"] if s.payoff is not None and s.payoff.measured else []),
        f"  {s.loop_name} wall time: {s.wall_ms / 1000:.2f} s",
        f"  compile time: {s.compile_ms / 1000:.2f} s ({s.share} of it) in {len(s.compiles)} compilations",
        f"  recompilations: {len(s.recompiles)}    graph breaks: {len(s.breaks)}",
    ]
    if s.warm_start.hits or s.warm_start.misses:
        lines.append(f"  compile cache: {s.warm_start.line}")
    lines += [f"  compile cache bypassed: {one_line(reason, 200)}" for reason in s.warm_start.bypasses[:5]]
    if s.warm_start.unavailable:
        lines.append(f"  (the torch of this run did not record compile.{', compile.'.join(s.warm_start.unavailable)})")
    if run.lost_records:
        lines.append(
            f"  incomplete: {run.lost_records} telemetry record(s) could not be written (see the run's warnings)"
        )
    lines += [f"  telemetry lost: {loss}" for loss in health_losses(run)]
    if s.fallbacks:
        lines.append(f"  fell back to eager: {len(s.fallbacks)} (recompile limit hit: {s.limit_hits})")
    if s.errors:
        first = one_line(s.errors[0].attributes.get(CompileAttr.FAILURE), limit=200)
        lines.append(f"  failed compilations: {len(s.errors)}, first: {first}")
    if not s.compiles:
        return "\n".join([*lines, "  no compilation happened in this run"])
    lines += ["", "  per frame:", *_table(FRAME_HEADERS, s.frame_rows)]
    if s.thunder_rows:
        lines += ["", "  thunder cache:", *_table(THUNDER_HEADERS, s.thunder_rows)]
    if s.diagnosis.causes:
        lines += ["", "  recompiles by cause:", *_table(CAUSE_HEADERS, cause_rows(s.diagnosis))]
    if s.diagnosis.breaks:
        lines += ["", "  graph breaks:", *_table(BREAK_HEADERS, break_rows(s.diagnosis))]
    if s.ddp_rows:
        lines += [
            "",
            f"  DDP optimizer splits: {s.ddp_splits} (graphs cut at DDP gradient-bucket boundaries, not graph breaks)",
            *_table(DDP_HEADERS, s.ddp_rows),
        ]
    return "\n".join(lines)


def health_losses(run: TelemetryRun) -> list[str]:
    """What telemetry could not do in the run, as its file's last record says: calls into others' code that
    failed, and what each exporter did not deliver."""
    health = run.health or {}
    losses = []
    for name, failed in (health.get("failed_calls") or {}).items():
        if isinstance(failed, dict):
            count = int(number(failed.get("count")))
            losses.append(
                f"{failed.get('callee') or name} failed {count} time{'s' if count != 1 else ''} "
                f"({one_line(failed.get('first_error', ''), 160)}) [{name}]"
            )
    for exporter, counts in (health.get("exporters") or {}).items():
        if not isinstance(counts, dict):
            continue
        dropped = int(number(counts.get("spans_dropped"))) + int(number(counts.get("calls_dropped")))
        failed = int(number(counts.get("calls_failed")))
        if dropped or failed:
            total = int(number(counts.get("spans")))
            of = f" of {total}" if total else ""
            losses.append(f"{one_line(exporter, 120)}: {dropped}{of} not delivered, {failed} calls failed")
    return losses


def net_line(payoff: Payoff) -> str:
    """The end of the loop's account: time won or lost over its steps."""
    verb = "won" if payoff.net_s >= 0 else "lost"
    return (
        f"net over the loop's {payoff.steps} steps: {abs(payoff.net_s):.1f} s {verb} (measured from step "
        f"{payoff.measured_at_step}, {payoff.blocks * payoff.block_steps} of them run eagerly)"
    )


CAUSE_HEADERS = ("cause", "recompiles", "compile s", "first step", "torch's reason")
BREAK_HEADERS = ("your line", "in code of", "breaks at", "count", "type")


def diagnosis_items(diagnosis: Diagnosis) -> list[list[str]]:
    """What to fix first, ranked (recompile causes by the compile seconds they cost, then graph breaks,
    the user's own first): each a headline and its details (where, the fix, torch's documentation)."""
    items: list[list[str]] = []
    for row in diagnosis.causes:
        if not row.unexpected:
            continue
        where = _listed(row.frames)
        steps = f"at step {row.steps[0]}" if len(row.steps) == 1 else f"at steps {_listed(map(str, row.steps))}"
        title = row.title if row.cause != "stage_switch" else "a frame recompiled when its stage came back"
        reason = f" ({one_line(row.reasons[0], 90)})" if row.reasons and row.cause != "stage_switch" else ""
        plural = "s" if row.unexpected > 1 else ""
        items.append(
            [
                f"{row.unexpected} recompile{plural}, {row.compile_ms / 1000:.1f} s: {title}{reason}",
                f"{steps} in {where}",
                f"fix: {row.fix}",
            ]
        )
    for group in diagnosis.breaks:
        times = f"{group.count} graph break{'s' if group.count > 1 else ''}"
        if group.owner == "user":
            head = f"{times} in your code at {short(group.location)}: {group.type}"
        else:
            reached = f", reached from your line {short(group.user_location)}" if group.user_location else ""
            head = f"{times} inside {group.owner} ({short(group.location)}){reached}: {group.type}"
        items.append([head, f"fix: {group.fix}", *([f"docs: {group.doc_url}"] if group.doc_url else [])])
    return items


def diagnosis_notes(diagnosis: Diagnosis) -> list[str]:
    """What needs no fixing (the expected price), the first steps, and what the file could not tell."""
    why = {
        "stage_switch": "when training and validation/test alternate (grad mode changed): once per frame",
        "shared_code": "for other callers of one function in its first step (layers of one class): once per kind",
    }
    notes = [
        f"expected: {row.count} recompile{'s' if row.count > 1 else ''}, {row.compile_ms / 1000:.1f} s, "
        f"{why[row.cause]}, nothing to fix"
        for row in diagnosis.causes
        if row.cause in why and not row.unexpected
    ]
    notes += [
        first_step_line(step.stage, step.global_step, step.wall_ms, step.compile_ms, step.phases_s)
        for step in diagnosis.first_steps
        if step.compile_ms
    ]
    return notes + [f"(this file has {what})" for what in diagnosis.lacks]


def format_diagnosis(diagnosis: Diagnosis, limit: int = 8) -> list[str]:
    """The summary's first lines: what to fix first, then the expected price and the first steps."""
    items, lines = diagnosis_items(diagnosis), []
    if items:
        lines.append("  what to fix first (each cause explained in docs/fixing.md):")
        for number, (head, *details) in enumerate(items[:limit], start=1):
            lines.append(f"  {number:2d}. {one_line(head, 160)}")
            lines += [f"      {one_line(detail, 300)}" for detail in details]
        if len(items) > limit:
            lines.append(f"      ... and {len(items) - limit} more below")
    lines += [f"  {note}" for note in diagnosis_notes(diagnosis)]
    return [*lines, ""] if lines else []


def cause_rows(diagnosis: Diagnosis) -> list[tuple[object, ...]]:
    return [
        (
            f"{row.cause} (expected)" if row.cause == "stage_switch" and not row.unexpected else row.cause,
            row.count,
            f"{row.compile_ms / 1000:.2f}",
            row.steps[0] if row.steps else "",
            row.reasons[0] if row.reasons else "",
        )
        for row in diagnosis.causes
    ]


def break_rows(diagnosis: Diagnosis) -> list[tuple[object, ...]]:
    return [
        (short(group.user_location) or "?", group.owner, short(group.location), group.count, group.type)
        for group in diagnosis.breaks
    ]


def _listed(names: Iterable[str], shown: int = 2) -> str:
    names = list(names)
    listed = ", ".join(names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def format_fleet(fleet: Fleet, limit: int = 6) -> str:
    """Many ranks of one run on one screen: spreads, the odd ranks by name, the compile skew."""
    ranks = len(fleet.ranks)
    time, count = fleet.compile_s, fleet.compilations
    lines = [
        f"telemetry-jit summary (run {short_run_id(fleet.run_id)}, {ranks} ranks)",
        f"  compile time per rank: min {time.low:.2f} s (rank {time.low_rank}), median {time.median:.2f} s, "
        f"max {time.high:.2f} s (rank {time.high_rank})",
        f"  compilations per rank: min {count.low:.0f} (rank {count.low_rank}), median {count.median:.0f}, "
        f"max {count.high:.0f} (rank {count.high_rank})",
    ]
    if fleet.skews:
        worst = fleet.skews[0]
        lines.append(
            f"  compile skew: {fleet.total_skew_ms / 1000:.2f} s of waiting over the {len(fleet.skews)} compiles every "
            f"rank did; the longest {worst.wait_ms / 1000:.2f} s at {worst.compile_id} {worst.frame}, rank "
            f"{worst.last_rank} last"
        )
        if fleet.waits_as_last:
            laggards = ", ".join(f"rank {rank} ({n}x)" for rank, n in fleet.waits_as_last.most_common(3))
            lines.append(f"    last to finish most often: {laggards}")
    main, *odd = fleet.sequences
    if not odd:
        lines.append(f"  compiled alike: all {ranks} ranks ({main.what})")
    else:
        lines.append(
            f"  compiled alike: {len(main.ranks)} of {ranks} ranks ({main.what}); {len(odd)} other group(s), which "
            "can desynchronise collectives and hang:"
        )
        for group in odd[:limit]:
            lines.append(f"    {_ranks(group.ranks)}: {group.what}; {group.difference}")
        if len(odd) > limit:
            lines.append(f"    ... and {len(odd) - limit} more groups (--json lists them)")
    if len(fleet.caches) > 1 or fleet.caches[0].what != "no compile-cache lookups":
        cache_groups = "; ".join(f"{_ranks(group.ranks)} {group.what}" for group in fleet.caches[:limit])
        lines.append(f"  compile cache: {cache_groups}")
    return "\n".join(lines)


def _ranks(ranks: list[int], shown: int = 8) -> str:
    listed = ", ".join(map(str, ranks[:shown]))
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}{more}"


def _speedup(payoff: Payoff | None) -> str:
    return f"{payoff.speedup:.2f}x" if payoff is not None and payoff.measured else "not measured"


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.0f}%"


def format_diff(result: RunDiff) -> str:
    """The two runs side by side, as terminal text."""
    base, new = result.base, result.new
    rows = [
        ("compile time", f"{base.compile_ms / 1000:.2f} s", f"{new.compile_ms / 1000:.2f} s"),
        ("compile share", f"{100 * base.compile_share:.1f}%", f"{100 * new.compile_share:.1f}%"),
        ("compilations", str(base.compiles), str(new.compiles)),
        ("recompilations", str(base.recompiles), str(new.recompiles)),
        ("  unexpected", str(base.unexpected_recompiles), str(new.unexpected_recompiles)),
        ("graph breaks", str(sum(base.graph_breaks.values())), str(sum(new.graph_breaks.values()))),
        ("cache hit rate", _rate(base.cache_hit_rate), _rate(new.cache_hit_rate)),
    ]
    if base.payoff is not None or new.payoff is not None:
        rows.append(("compile speedup", _speedup(base.payoff), _speedup(new.payoff)))
    lines = ["telemetry-jit diff (base -> new)"]
    lines += [f"  {side}: {status.headline()}" for side, status in result.statuses() if not status.finished]
    lines += [f"  {name:<16}{b:>12}  ->  {n}" for name, b, n in rows]
    if result.cache_effect:
        lines += [
            "",
            f"  the compilations differ only where the compile caches served graphs (cache hits {base.cache_hits} -> "
            f"{new.cache_hits}): the same frames compiled for the same reasons, so this is the caches' doing, not a "
            "code change (compare runs with the caches in the same state: both warm, or "
            "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for both)",
        ]
    for title, causes in (("new recompiles, by cause", result.new_causes), ("fixed recompiles", result.fixed_causes)):
        if causes:
            lines += ["", f"  {title}:", *[f"    {cause}: {n}" for cause, n in sorted(causes.items())]]
    for title, counter in (
        ("new graph breaks", result.new_graph_breaks),
        ("fixed graph breaks", result.fixed_graph_breaks),
    ):
        if counter:
            lines += [
                "",
                f"  {title}:",
                *[f"    {loc}  {n}x  {reason}" for (loc, reason), n in sorted(counter.items())],
            ]
    lines += ["", "  per frame (compiles, recompiles, compile time):"]
    for frame, b, n in result.frames():
        lines.append(
            f"    {one_line(frame)}: {b.compiles}, {b.recompiles}, {b.compile_ms / 1000:.2f} s"
            f"  ->  {n.compiles}, {n.recompiles}, {n.compile_ms / 1000:.2f} s"
        )
        for reason in n.recompile_reasons.keys() - b.recompile_reasons.keys():
            lines.append(f"      new recompile reason: {reason}")
    return "\n".join(lines)
