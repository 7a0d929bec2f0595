"""The analysis in words: the answers the terminal and the HTML report both say (what to fix first, what needs no
fixing, the figures with their units and denominators, the tables' rows), and the terminal's text: printable lines
wrapped (never mid-word) within the terminal's width, at most 118 columns; a table too wide wraps its widest cells, or
shows a field a line. A table cell is cut at 100 characters (torch's reasons run to megabytes); ``--json`` and the
report hold the whole text."""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from telemetry_jit.analysis.cold_start import ColdStart, warm_start_lines
from telemetry_jit.analysis.diff import RunDiff, cause_words
from telemetry_jit.analysis.digest import EXPECTED, Fallback
from telemetry_jit.analysis.fleet import Fleet, OutOfStepSaid, out_of_step_said
from telemetry_jit.analysis.runs import TelemetryRun, number
from telemetry_jit.analysis.summary import LOOP_WORDS, STAGE_WORDS, RunSummary, summarize
from telemetry_jit.breaks import gist
from telemetry_jit.identity import short_run_id
from telemetry_jit.records import Payoff, first_step_line
from telemetry_jit.schema import FILE_FORMAT
from telemetry_jit.terminal import counted, possessive, rank_list, shown

_CELL_LIMIT = 100
_WIDTH = 118  # running text's width on a wide terminal, or where the width is not known (a pipe, a file)
_MIN_COLUMN = 16  # a table column is not wrapped narrower than its header, its longest word or this


def terminal_width(stream: TextIO | None = None) -> int | None:
    """``COLUMNS``, else the terminal width of ``stream`` (standard output by default); ``None`` for a pipe or a
    file."""
    if stream is None:
        columns = shutil.get_terminal_size(fallback=(0, 0)).columns
    elif os.environ.get("COLUMNS", "").strip().isdigit():
        columns = int(os.environ["COLUMNS"])
    else:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns if stream.isatty() else 0
        except (OSError, ValueError, AttributeError):  # closed, or a stream with no descriptor (captured)
            columns = 0
    return columns if columns > 0 else None


def fitted(text: str, stream: TextIO) -> str:
    """``text``, each of its lines wrapped to ``stream``'s terminal (continuations two deeper); as it is for a
    pipe or a file, which tools read whole."""
    columns = terminal_width(stream)
    if columns is None:
        return text
    return "\n".join(
        line
        for part in text.split("\n")
        # a path longer than the terminal stays whole, on a line of its own: one to copy, not two halves
        for line in textwrap.wrap(
            part, max(columns, 20), subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
        or [part]
    )


def one_line(text: object, limit: int = _CELL_LIMIT) -> str:
    """``text``'s first line, control characters shown as ``?``, at most ``limit`` characters."""
    first = str(text).strip().split("\n", 1)[0]
    first = "".join(c if c.isprintable() else "?" for c in first[: limit + 1])
    return first if len(first) <= limit else first[: limit - 1] + "…"


def wrapped(text: object, indent: str, width: int | None = None) -> list[str]:
    """``text`` (up to 4,000 characters) as printable lines within ``width``, the first after ``indent``, the
    others two deeper."""
    if width is None:
        columns = terminal_width()
        width = _WIDTH if columns is None else max(min(_WIDTH, columns), 20)
    printable = "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split())[:4000])
    rest = " " * (len(indent) + 2)
    return textwrap.wrap(
        printable, width=width, initial_indent=indent, subsequent_indent=rest, break_on_hyphens=False
    ) or [indent]


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(h) for h in headers], *[[one_line(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    columns = terminal_width() or 10**6  # a pipe or a file: no table is too wide (a cell holds 100 characters)
    room = columns - 2 - 2 * (len(widths) - 1)  # the indent, the gaps
    if sum(widths) > room:
        fitting = _narrowed(cells, widths, room)
        if fitting is None:
            return _rows_one_field_a_line(cells, columns)
        widths = fitting
    lines = []
    for index, row in enumerate(cells):
        # a cell no wider than its column (stripped, one line, printable) stays whole
        parts = [textwrap.wrap(c, w, break_on_hyphens=False) or [""] for c, w in zip(row, widths, strict=True)]
        for depth in range(max(len(part) for part in parts)):
            texts = [part[depth] if depth < len(part) else "" for part in parts]
            lines.append("  ".join(t.ljust(width) for t, width in zip(texts, widths, strict=True)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return ["  " + line for line in lines]


def _narrowed(cells: list[list[str]], widths: list[int], room: int) -> list[int] | None:
    """Widths within ``room``, the one with most to give narrowed first; ``None`` if the floors do not fit."""
    # how narrow each column may be: its header and longest word (up to _MIN_COLUMN) stay whole
    longest = [max(len(word) for row in cells for word in row[i].split() or [""]) for i in range(len(widths))]
    floors = [min(width, max(len(cells[0][i]), min(longest[i], _MIN_COLUMN))) for i, width in enumerate(widths)]
    if sum(floors) > room:
        return None
    widths = list(widths)
    while sum(widths) > room:
        widest = max(range(len(widths)), key=lambda i: widths[i] - floors[i])
        widths[widest] -= 1
    return widths


def _rows_one_field_a_line(cells: list[list[str]], width: int) -> list[str]:
    """A table too wide however wrapped: a field a line."""
    headers, *rows = cells
    lines: list[str] = []
    for row in rows:
        for index, (header, cell) in enumerate(zip(headers, row, strict=True)):
            lines += wrapped(f"{header}: {cell}", "  - " if index == 0 else "    ", width)
    return lines


def _fitted(lines: list[str]) -> str:
    """The lines as one text, each line longer than the terminal wrapped under its own indent."""
    columns = terminal_width()
    if columns is None:
        return "\n".join(lines)
    fitted: list[str] = []
    for line in lines:
        if len(line) <= columns:
            fitted.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        fitted += wrapped(line.strip(), indent, max(columns, 20))
    return "\n".join(fitted)


FRAME_HEADERS = ("frame", "location", "frame compiles", "recompiles", "backward graphs", "breaks", "compile s")
CAUSE_HEADERS = ("cause", "where", "recompiles", "compile s", "first step", "torch's reason")
BREAK_HEADERS = ("breaks at", "in code of", "count", "your lines", "type")
THUNDER_HEADERS = ("module", "misses", "hits")
DDP_HEADERS = ("frame", "compile", "splits", "bucket cap MB")
_EXPECTED_WHY = {
    "stage_switch": "when calls with and without gradients alternate (grad mode changed): once per frame",
    "module_mode": "when modules switch between train() and eval() (their training flag changed): once per frame",
    "shared_code": "for other callers of one function in its first batch (layers of one class): once per kind",
    "inference_mode": (
        "when validate/test/predict run outside fit under inference mode: once per frame "
        "(Trainer(inference_mode=False) avoids them)"
    ),
    "tuner": "in the Tuner's trials, which change the batch size (or learning rate) on purpose",
    "trainable_params": "when which parameters train changed (layers frozen or unfrozen): once per frame and change",
}


@dataclass(frozen=True)
class Item:
    """One thing to fix: its headline and the lines under it."""

    head: str
    details: tuple[str, ...]


def listed(names: Iterable[object], shown: int = 3, total: int | None = None) -> str:
    """The first ``shown`` of ``names`` and how many more (of ``total``, where ``names`` holds only the first)."""
    texts = [str(name) for name in names]
    text = ", ".join(texts[:shown])
    count = max(total or 0, len(texts))
    return text + (f" and {count - shown} more" if count > shown else "")


def where_words(stages: list[str], loaders: list[int]) -> str:
    words = listed(STAGE_WORDS.get(stage, stage) for stage in stages)
    return words + (f", dataloader {listed(loaders)}" if loaders else "")


def which_loops(summary: RunSummary, loops: Iterable[str]) -> str:
    """``training loop 1 of 2`` where the run holds several loops, ``""`` otherwise."""
    numbers = summary.loop_numbers(loops)
    if not numbers:
        return ""
    noun = LOOP_WORDS[summary.loop_name].removeprefix("the ") + ("s" if len(numbers) > 1 else "")
    return f"{noun} {listed(numbers, 5)} of {summary.loop_count}"


def fix_first(summary: RunSummary) -> list[Item]:
    """What to fix first: modules compiled to no effect, recompile causes by cost (training's and evaluation's
    apart: their fixes differ), then graph breaks, the user's own first, each with the user's lines that led there."""
    items = [Item(found.words(), (f"fix: {found.fix()}",)) for found in summary.not_compiled]
    items += [Item(words, ()) for words in summary.not_run]
    for row in summary.causes:
        if not row.unexpected:
            continue
        steps = f"step {row.steps[0]}" if row.step_count <= 1 else f"steps {listed(row.steps, total=row.step_count)}"
        title = row.title if row.cause != "stage_switch" else "a frame recompiled when its grad mode came back"
        reason = f" ({row.reasons[0]})" if row.reasons and row.cause != "stage_switch" else ""
        loops = which_loops(summary, row.loops)
        if loops and summary.loop_count not in summary.loop_numbers(row.loops):
            loops += ", none in the last"  # whether the latest loop still has it: what a user who fixed it asks
        where = f"at {steps} in {where_words(row.stages, row.loaders)}{f' ({loops})' if loops else ''}"
        head = f"{counted(row.unexpected, 'recompile')}, {row.compile_ms / 1000:.1f} s: {title}{reason}"
        items.append(Item(head, (f"{where}: {listed(row.frames, 2)}", f"fix: {row.fix}")))
    for group in summary.breaks:
        times = counted(group.count, "graph break")
        if group.owner == "user":
            head = f"{times} in your code at {shown(group.location)}: {group.type}"
        else:
            lines = listed(shown(line) for line in group.user_locations)
            reached = f", reached from your line{'s' if len(group.user_locations) > 1 else ''} {lines}" if lines else ""
            head = f"{times} inside {group.owner} ({shown(group.location)}){reached}: {group.type}"
        loops = which_loops(summary, group.loops)  # where compiling found them: code compiled once runs in later loops
        found = [f"found compiling {loops}"] if loops else []
        docs = [f"docs: {group.doc_url}"] if group.doc_url else []
        items.append(Item(head, (*found, f"fix: {group.fix}", *docs)))
    return items


def notes(summary: RunSummary) -> list[str]:
    """What was compiled before the run, the expected price, the first steps, what the file could not tell."""
    lines = [summary.compiled_before.words()] if summary.compiled_before is not None else []
    expected: dict[str, tuple[int, float]] = {}  # one line a cause, its stages together
    for row in summary.causes:
        if row.cause in _EXPECTED_WHY and not row.unexpected:
            count, ms = expected.get(row.cause, (0, 0.0))
            expected[row.cause] = (count + row.count, ms + row.compile_ms)
    for cause, (count, ms) in expected.items():
        lines.append(
            f"expected: {counted(count, 'recompile')}, {ms / 1000:.1f} s, {_EXPECTED_WHY[cause]}, nothing to fix"
        )
    for step in summary.first_steps:
        if step.compile_ms:
            loops = which_loops(summary, [step.loop])
            lines.append(
                first_step_line(step.stage, step.global_step, step.wall_ms, step.compile_ms, step.phases_s, loops)
            )
    return lines + [f"(this file has {what})" for what in summary.lacks if what not in summary.run.lacks]


def figure_lines(summary: RunSummary) -> list[str]:
    """The figures, each with its unit and, for a share, its denominator."""
    d = summary.digest
    loop = summary.loop_words
    lines = []
    if summary.share is not None:
        lines.append(
            f"compiling: {summary.compile_in_loop_ms / 1000:.2f} s of {possessive(loop)} "
            f"{summary.wall_ms / 1000:.2f} s ({100 * summary.share:.1f}% of it)"
        )
    outside = summary.outside_ms
    if outside:
        parts = ", ".join(f"{STAGE_WORDS.get(stage, stage)} {ms / 1000:.2f} s" for stage, ms in outside.items())
        whole = (  # the share of what the line says: the compiling outside the loop, over the application
            f"; {100 * sum(outside.values()) / summary.application_ms:.1f}% of the application's "
            f"{summary.application_ms / 1000:.2f} s"
            if summary.application_ms > 0
            else ""
        )
        lines.append(f"compiling outside {loop}: {sum(outside.values()) / 1000:.2f} s ({parts}){whole}")
    # an attempt torch refused at the recompile limit compiled nothing: counted apart (torch's record, and --json's
    # frame_compiles, hold it among the frame compiles and recompiles)
    refused = min(d.limit_hits, d.recompiles)
    compiled = f"{counted(d.frame_compiles - refused, 'frame compile')} ({d.recompiles - refused} of them recompiles)"
    if d.backward_graphs:
        compiled += f" and {counted(d.backward_graphs, 'backward graph')}"
    if d.backward_within:  # torch compiled these backward graphs within their frame's compile: no span of their own
        more = " more" if d.backward_graphs else ""
        within = "its frame compile" if d.backward_within == 1 else "their frame compiles"
        graphs = counted(d.backward_within, "backward graph").replace(" ", f"{more} ", 1)  # "2 more backward graphs"
        within = f"{graphs} compiled within {within}, with dynamic shapes"
        compiled += f" (and {within})" if d.backward_graphs else f" and {within}"  # one aside, never two in a row
    if d.backward_within_unknown:  # torch 2.8 records no input shapes: a count of those would be a guess
        frames = counted(d.backward_within_unknown, "frame compile")
        compiled += (
            f" (not counted: backward graphs compiled within any of {frames} while training, as torch does with "
            "dynamic shapes; the torch of this run did not record compile.input_shapes)"
        )
    if d.backward_loaded:  # loaded from the compile cache with their forward graphs: no span of their own either
        graphs = counted(d.backward_loaded, "backward graph")
        within = "its frame compile" if d.backward_loaded == 1 else "their frame compiles"
        compiled += f" (and {graphs} loaded from the compile cache within {within})"
    if d.thunder_compiles:
        compiled += f", {counted(d.thunder_compiles, 'thunder compile')}"
    if refused:
        compiled += (
            f"; {counted(refused, 'more attempt')} refused at the recompile limit, which compiled nothing (the frame "
            "runs eagerly)"
        )
    lines.append(f"compiled: {compiled}, {d.compile_ms / 1000:.2f} s in all; {counted(d.break_count, 'graph break')}")
    if d.warm_start.lookups:
        lines.append(f"compile cache: {d.warm_start.line}")
    if d.cache_ledger.loaded_hits:  # from the look-ups themselves: torch 2.8 counts no local hits on its spans
        lines.append(
            f"compile cache: {d.cache_ledger.loaded_hits} graph(s) from loaded cache artifacts "
            "(torch.compiler.load_cache_artifacts)"
        )
    lines += [f"compile cache bypassed: {reason}" for reason in d.warm_start.bypasses[:5]]
    if d.warm_start.unavailable:
        lines.append(f"(the torch of this run did not record compile.{', compile.'.join(d.warm_start.unavailable)})")
    lines += d.resources.lines() + warm_start_lines(d.residual, d.warm_start.hits, d.warm_start.misses)
    if summary.run.lost_records:
        lines.append(f"incomplete: {summary.run.lost_records} telemetry record(s) could not be written")
    lines += [f"telemetry lost: {loss}" for loss in health_losses(summary.run)]
    if d.fallback_count:
        lines.append(f"fell back to eager: {d.fallback_count} (recompile limit hit: {d.limit_hits})")
        lines += [f"  {fallback_line(fallback, summary.last_step)}" for fallback in summary.fallbacks[:5]]
    if d.failed:
        lines.append(f"failed compilations: {d.failed}, first: {d.first_failure_graph}: {gist(d.first_failure)}")
    return lines


def fallback_line(fallback: Fallback, last_step: int | None = None) -> str:
    """``forward (model.py:12) runs eagerly from step 3 on (12 steps since; ...): ...; costs ...``, as known."""
    why = "it hit the recompile limit" if fallback.limit_hit else "compiling it failed"
    stage = STAGE_WORDS.get(fallback.stage, fallback.stage)
    since = f"{last_step - fallback.step} steps since; " if last_step is not None and last_step >= fallback.step else ""
    frame = fallback.shown or fallback.frame
    line = f"{frame} runs eagerly from step {fallback.step} on ({since}{why}, in {stage}): {fallback.reason}"
    return line + (f"; {fallback.cost.words()}" if fallback.cost is not None else "")


def health_losses(run: TelemetryRun) -> list[str]:
    """What telemetry could not do, as the file's last record says: failed calls, undelivered exports."""
    health = run.health or {}
    losses = []
    for name, failed in (health.get("failed_calls") or {}).items():
        if isinstance(failed, dict):
            times = counted(int(number(failed.get("count"))), "time")
            losses.append(f"{failed.get('callee') or name} failed {times} ({failed.get('first_error', '')}) [{name}]")
    for exporter, counts in (health.get("exporters") or {}).items():
        if not isinstance(counts, dict):
            continue
        dropped = int(number(counts.get("spans_dropped"))) + int(number(counts.get("calls_dropped")))
        failed = int(number(counts.get("calls_failed")))
        if dropped or failed:
            total = int(number(counts.get("spans")))
            of = f" of {total}" if total else ""
            losses.append(f"{exporter}: {dropped}{of} not delivered, {failed} calls failed")
        metrics_failed = int(number(counts.get("metric_exports_failed")))
        if metrics_failed:  # the other signal: metrics (a backend that takes traces only refuses every export)
            exports = int(number(counts.get("metric_exports")))
            losses.append(f"{exporter}: {metrics_failed} of {counted(exports, 'metric export')} failed")
    return losses


def net_line(payoff: Payoff) -> str:
    """The end of the loop's account: time won or lost over its steps."""
    verb = "won" if payoff.net_s >= 0 else "lost"
    return (
        f"net over the loop's {payoff.steps} steps: {abs(payoff.net_s):.1f} s {verb} (measured from step "
        f"{payoff.measured_at_step}, {payoff.blocks * payoff.block_steps} of them run eagerly)"
    )


def frame_rows(summary: RunSummary) -> list[tuple[object, ...]]:
    return [
        (
            row.frame,
            shown(row.location),
            row.compiles,
            row.recompiles,
            row.backward_graphs,
            row.breaks,
            f"{row.compile_ms / 1000:.2f}",
        )
        for row in summary.digest.frame_rows()
    ]


def cause_rows(summary: RunSummary) -> list[tuple[object, ...]]:
    return [
        (
            row.cause + EXPECTED if not row.unexpected else row.cause,
            where_words(row.stages, row.loaders),
            row.count,
            f"{row.compile_ms / 1000:.2f}",
            row.steps[0] if row.steps else "",
            row.reasons[0] if row.reasons else "",
        )
        for row in summary.causes
    ]


def break_rows(summary: RunSummary) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = [
        (
            shown(group.location),
            group.owner,
            group.count,
            listed(shown(line) for line in group.user_locations),
            group.type,
        )
        for group in summary.breaks
    ]
    d = summary.digest
    if d.breaks_not_grouped:  # past the places kept: counted in one row
        rows.append((f"(places past the first {d.max_rows})", "", d.breaks_not_grouped, "", ""))
    return rows


def format_summary(run: TelemetryRun, limit: int = 8, ranks_said: bool = True) -> str:
    """The summary as terminal text (``ranks_said`` false: a fleet view said what the rank watcher said)."""
    s = summarize(run)
    source = f"run {short_run_id(run.run_id)}" if run.file_format == FILE_FORMAT else f"{run.file_format} file"
    lines = [f"telemetry-jit summary ({source}, rank {run.rank})"]
    if not s.status.finished:
        lines += wrapped(s.status.headline(), "  ")
    lines += [line for note in s.status.notes() for line in wrapped(note, "  ")]
    lines += [f"  (this file format has {what})" for what in run.lacks]
    items = fix_first(s)
    if items:
        lines.append("  what to fix first (each cause explained in docs/fixing.md):")
        for index, item in enumerate(items[:limit], start=1):
            lines += [*wrapped(item.head, f"  {index:2d}. "), *_indented(item.details, "      ")]
        if len(items) > limit:
            lines.append(f"      ... and {len(items) - limit} more below")
    lines += _indented(notes(s), "  ")
    if ranks_said:
        lines += _out_of_step_lines(out_of_step_said(run), limit)
    if s.payoff is not None:
        lines += wrapped(f"compile payoff: {s.payoff_sentence}", "  ")
        if s.payoff.measured:
            lines += wrapped(net_line(s.payoff), "    ")
    lines += ["", f"  {s.loop_words}: {s.wall_ms / 1000:.2f} s of wall time"]
    lines += _indented(figure_lines(s), "  ")
    if not s.digest.compilations:
        return _fitted([*lines, "  no compilation happened in this run"])
    lines += ["", "  per frame:", *_table(FRAME_HEADERS, frame_rows(s))]
    if s.thunder_rows:
        lines += ["", "  thunder cache:", *_table(THUNDER_HEADERS, s.thunder_rows)]
    if s.causes:
        lines += ["", "  recompiles by cause:", *_table(CAUSE_HEADERS, cause_rows(s))]
    if s.breaks:
        lines += ["", "  graph breaks:", *_table(BREAK_HEADERS, break_rows(s))]
    if s.digest.ddp:
        lines += [
            "",
            f"  DDP optimizer splits: {s.digest.ddp_splits} (graphs cut at DDP gradient-bucket boundaries, not graph "
            "breaks)",
            *_table(DDP_HEADERS, s.digest.ddp),
        ]
    return _fitted(lines)


def format_fleet(fleet: Fleet, limit: int = 6) -> str:
    """Many ranks of one run on one screen: spreads, the odd ranks by name, the compile skew."""
    ranks = len(fleet.ranks)
    time, count = fleet.compile_s, fleet.compilations
    lines = [
        f"telemetry-jit summary (run {short_run_id(fleet.run_id)}, {ranks} ranks)",
        f"  compile time per rank: min {time.min:.2f} s (rank {time.min_rank}), median {time.median:.2f} s, "
        f"max {time.max:.2f} s (rank {time.max_rank})",
        f"  compilations per rank: min {count.min:.0f} (rank {count.min_rank}), median {count.median:.0f}, "
        f"max {count.max:.0f} (rank {count.max_rank})",
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
    lines += _out_of_step_lines(fleet.out_of_step, limit)
    main, *odd = fleet.sequences
    if not odd:
        lines.append(f"  compiled alike: all {ranks} ranks ({main.what})")
    else:
        lines.append(
            f"  compiled alike: {len(main.ranks)} of {ranks} ranks ({main.what}); {len(odd)} other group(s), which "
            "can desynchronise collectives and hang:"
        )
        lines += [f"    {rank_list(group.ranks)}: {group.what}; {group.difference}" for group in odd[:limit]]
        if len(odd) > limit:
            lines.append(f"    ... and {len(odd) - limit} more groups (--json lists them)")
    if len(fleet.caches) > 1 or fleet.caches[0].what != "no compile-cache lookups":
        cache_groups = "; ".join(f"{rank_list(group.ranks)} {group.what}" for group in fleet.caches[:limit])
        lines.append(f"  compile cache: {cache_groups}")
        lines += _indented(f"{rank_list(g.ranks)}: {g.difference}" for g in fleet.caches[1:limit] if g.difference)
    return _fitted(lines)


_OUT_OF_STEP = {  # kind -> what one is, what several are
    "stall": ("stall (ranks compiling while others waited)", "stalls (ranks compiling while others waited)"),
    "divergent_graph": ("graph only some ranks compiled", "graphs only some ranks compiled"),
    "silent": ("silence (a rank not heard from)", "silences (a rank not heard from)"),
    "not_ended": ("word on ranks that had not ended", "words on ranks that had not ended"),
}


def _out_of_step_lines(said: list[OutOfStepSaid], limit: int) -> list[str]:
    """What the rank watcher said live, by kind, the longest stalls first."""
    if not said:
        return []
    by_kind: dict[str, list[OutOfStepSaid]] = {}
    for item in said:
        by_kind.setdefault("stall" if item.kind.startswith("stall") else item.kind, []).append(item)
    counts = ", ".join(
        f"{len(items)} {_OUT_OF_STEP.get(kind, (kind, kind))[len(items) > 1]}" for kind, items in by_kind.items()
    )
    watchers = rank_list(sorted({item.said_by for item in said}))
    lines = [f"  ranks out of step (said live by {watchers}): {counts}"]
    for items in by_kind.values():
        lines += _indented(item.line for item in items[:limit])
        if len(items) > limit:
            lines.append(f"    ... and {len(items) - limit} more (--json lists them)")
    return lines


def _indented(texts: Iterable[str], indent: str = "    ") -> list[str]:
    """Each text wrapped under ``indent``."""
    return [line for text in texts for line in wrapped(text, indent)]


def _speedup(payoff: Payoff | None) -> str:
    return f"{payoff.speedup:.2f}x" if payoff is not None and payoff.measured else "not measured"


def _percent(fraction: float | None, places: int) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.{places}f}%"


def format_cold_start(cold: ColdStart) -> str:
    """The compile-cache misses a run had where its baseline had the graphs, and why; "" where none."""
    if not cold.groups:
        return ""
    lines = ["", f"  compile cache: {cold.graphs} graph(s) missed that the base run had, {cold.seconds:.1f} s:"]
    for group in cold.groups:
        where = listed(group.frames) + (f", step {listed(group.steps)}" if group.steps else "")
        lines += wrapped(f"{group.graphs} graph(s), {group.seconds:.1f} s: {group.reason} (in {where})", "    ")
        lines += wrapped(f"fix: {group.fix}", "      ")
    return _fitted(lines)


def format_diff(result: RunDiff) -> str:
    """The two runs side by side, as terminal text: what is new, what went away, what changed."""
    base, new = result.base.digest, result.new.digest
    rates = _percent(base.warm_start.hit_rate, 0), _percent(new.warm_start.hit_rate, 0)
    rows = [
        ("compile time", f"{base.compile_ms / 1000:.2f} s", f"{new.compile_ms / 1000:.2f} s"),
        ("share of loop", _percent(result.base.share, 1), _percent(result.new.share, 1)),
        ("frame compiles", str(base.frame_compiles), str(new.frame_compiles)),
        ("backward graphs", str(base.backward_graphs), str(new.backward_graphs)),
        ("recompilations", str(base.recompiles), str(new.recompiles)),
        ("  unexpected", str(base.unexpected_recompiles), str(new.unexpected_recompiles)),
        ("graph breaks", str(base.break_count), str(new.break_count)),
        ("cache hit rate", *rates),
    ]
    if result.base.payoff is not None or result.new.payoff is not None:
        rows.append(("compile speedup", _speedup(result.base.payoff), _speedup(result.new.payoff)))
    lines = ["telemetry-jit diff (base -> new)"]
    sides = (("base", result.base), ("new", result.new))
    for side, s in sides:
        if not s.status.finished:
            lines += wrapped(f"{side}: {s.status.headline()}", "  ")
    for side, s in sides:
        if s.compiled_before:  # its missing compiles prove nothing
            words = f"{side}: {s.compiled_before.words()}. A compile or recompile it lacks is no evidence of a change"
            lines += wrapped(words, "  ")
    lines += [f"  {name:<16}{b:>12}  ->  {n}" for name, b, n in rows]
    if result.changed_options:  # a change of option, not of the user's code: what it changes follows from it
        lines += [""] + wrapped(f"torch.compile options changed: {'; '.join(result.changed_options)}", "  ")
    if new.backward_graphs < base.backward_graphs:
        lines += [""] + wrapped(
            "fewer backward graphs need not mean less compiled: a graph with dynamic shapes (dynamic=True, "
            "mark_dynamic, or torch's automatic dynamic shapes after a size changed) has its backward compiled within "
            "its frame's compile, and counted with it (docs/telemetry.md)",
            "  ",
        )
    if result.cache_effect:
        so = "this is the caches' doing, not a code change"
        if any(group.changes for group in result.cold_start.groups):  # a change (a setting, a dtype) made them miss
            so = "the difference is what the caches held; below, why they missed"
        lines += [""] + wrapped(
            "the compilations differ only where the compile caches served graphs (cache hits "
            f"{base.warm_start.hits} -> {new.warm_start.hits}): the same frames compiled for the same reasons, so {so} "
            "(compare runs with the caches in the same state: both warm, or TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for "
            "both)",
            "  ",
        )
    elif result.caches_differ:
        lines += [""] + wrapped(
            f"the compile caches were not in the same state (hit rate {rates[0]} -> {rates[1]}): compile time "
            "and backward graphs differ by what the caches served as well as by the change (a cache hit loads a "
            "backward graph a cold run compiles); for the change's own effect, compare with the caches in the same "
            "state (both warm, or TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for both). Recompiles and graph breaks are the "
            "change's.",
            "  ",
        )
    lines += format_cold_start(result.cold_start).splitlines()
    added, gone = result.new_only, result.base_only
    for title, said in (
        ("new: modules compiled to no effect", _indented(found.words() for found in added.not_compiled)),
        (
            "fixed: modules compiled to no effect in the base run",
            _indented(found.words() for found in gone.not_compiled),
        ),
        ("new: frames that run eagerly", _indented(map(fallback_line, added.fallbacks))),
        (
            "fixed: frames that ran eagerly in the base run and no longer do",
            _indented(map(fallback_line, gone.fallbacks)),
        ),
        ("new recompiles, by cause", [f"    {cause_words(cause)}: {n}" for cause, n in added.causes.items()]),
        ("fixed recompiles", [f"    {cause_words(cause)}: {n}" for cause, n in gone.causes.items()]),
        (
            "recompiles that remain under another cause (the same frame, stage, step and batch)",
            [f"    {cause_words(b)} -> {cause_words(n)}: {count}" for (b, n), count in result.renamed_causes.items()],
        ),
        (
            "recompiles that remain, in other numbers",
            [f"    {cause_words(cause)}: {b} -> {n}" for cause, (b, n) in result.changed_causes.items()],
        ),
        ("new graph breaks", [f"    {loc}  {n}x  {one_line(why)}" for (loc, why), n in added.graph_breaks.items()]),
        ("fixed graph breaks", [f"    {loc}  {n}x  {one_line(why)}" for (loc, why), n in gone.graph_breaks.items()]),
    ):
        if said:
            lines += ["", f"  {title}:", *said]
    lines += ["", "  per frame (frame compiles, recompiles, compile time with backward graphs):"]
    for frame, b, n in result.frames():
        lines.append(
            f"    {one_line(frame)}: {b.compiles}, {b.recompiles}, {b.compile_ms / 1000:.2f} s"
            f"  ->  {n.compiles}, {n.recompiles}, {n.compile_ms / 1000:.2f} s"
        )
        lines += [f"      new recompile reason: {one_line(r)}" for r in sorted(n.reasons.keys() - b.reasons.keys())]
        lines += [f"      gone recompile reason: {one_line(r)}" for r in sorted(b.reasons.keys() - n.reasons.keys())]
    return _fitted(lines)
