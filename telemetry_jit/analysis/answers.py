"""The answers in words, as the terminal and the HTML report both say them: what to fix first, what needs
no fixing, the figures with their units and denominators, the tables' rows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from telemetry_jit.analysis.cold_start import warm_start_lines
from telemetry_jit.analysis.digest import EXPECTED, Fallback
from telemetry_jit.analysis.runs import TelemetryRun, number
from telemetry_jit.analysis.summary import LOOP_WORDS, STAGE_WORDS, RunSummary
from telemetry_jit.breaks import gist
from telemetry_jit.records import Payoff, first_step_line
from telemetry_jit.terminal import counted, possessive, shown

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
    compiled = f"{counted(d.frame_compiles, 'frame compile')} ({d.recompiles} of them recompiles)"
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
        lines.append(f"failed compilations: {d.failed}, first: {gist(d.first_failure)}")
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
    return [
        (
            shown(group.location),
            group.owner,
            group.count,
            listed(shown(line) for line in group.user_locations),
            group.type,
        )
        for group in summary.breaks
    ]
