"""A self-contained HTML report of a run: no network, no scripts from anywhere, opens offline."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from telemetry_jit.analysis import text
from telemetry_jit.analysis.fleet import Fleet
from telemetry_jit.analysis.summary import RunSummary
from telemetry_jit.owned_files import OwnKind
from telemetry_jit.schema import TrainingSpanName
from telemetry_jit.terminal import shown

_WIDTH, _ROW, _LEFT = 1100, 22, 150
_LOOPS = {  # each loop's colour, and its name in the legend
    TrainingSpanName.TRAINING_LOOP: ("#9ecae1", "training loop"),
    TrainingSpanName.VALIDATION_LOOP: ("#c7e9c0", "validation loop"),
    TrainingSpanName.TESTING_LOOP: ("#fdd0a2", "test loop"),
}

_LEGEND = (
    '<p class="legend" id="timeline-legend">'
    + " ".join(
        f'<span><i style="background:{colour}"></i>{escape(label)}</span>'
        for colour, label in (
            *_LOOPS.values(),
            ("#e34a33", "compilation"),
            ("#b30000", "recompilation (the line below marks its step, its number the global step)"),
        )
    )
    + " Hover a bar for what compiled, why, and how long it took.</p>"
)

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; } .num { text-align: right; } .muted { color: #777; }
.cards { display: flex; gap: 1em; flex-wrap: wrap; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .6em 1em; }
.card b { display: block; font-size: 1.3em; } svg text { font: 11px system-ui, sans-serif; }
.legend span { margin-right: 1.2em; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em; }
.unfinished { background: #fde0dc; border: 1px solid #e34a33; border-radius: 6px; padding: .5em 1em; }
#diagnosis { background: #fff8e6; border: 1px solid #f0d080; border-radius: 6px; padding: .4em 1em; }
#diagnosis pre { white-space: pre-wrap; font: 13px/1.45 ui-monospace, monospace; }
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"num" if isinstance(c, int) else ""}">{escape(str(c))}</td>' for c in row)
        + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _timeline(summary: RunSummary) -> str:
    """Loops as bars on a wall-time axis (seconds from the first), compilations over them (recompiles darker), each
    recompile marked with its global step."""
    loops = [span for span in summary.run.spans.values() if span.name in _LOOPS]
    windows = summary.digest.windows
    if not loops and not windows:
        return '<p class="muted">No loops or compilations recorded.</p>'
    last = summary.run.last_unix_ns
    start = min([*(s.start_unix_ns for s in loops), *(w.start_ns for w in windows)])
    end = max([*((s.end_unix_ns or last) for s in loops), *(w.end_ns for w in windows), start + 1])
    scale = (_WIDTH - _LEFT - 10) / max(end - start, 1)

    def x(ns: int) -> float:
        return _LEFT + (ns - start) * scale

    labels = ["training", "validation / test", "compilation", "recompiles (step)"]
    parts = [f'<text x="4" y="{16 + i * _ROW}">{escape(label)}</text>' for i, label in enumerate(labels)]
    for span in sorted(loops, key=lambda s: s.start_unix_ns):
        row = 0 if span.name == TrainingSpanName.TRAINING_LOOP else 1
        left, right = x(span.start_unix_ns), x(span.end_unix_ns or end)
        title = f"{span.name} {((span.end_unix_ns or end) - span.start_unix_ns) / 1e6:.0f} ms"
        width = max(right - left, 1.5)
        parts.append(
            f'<rect class="{escape(span.name)}" x="{left:.1f}" y="{4 + row * _ROW}" width="{width:.1f}" '
            f'height="{_ROW - 6}" fill="{_LOOPS[span.name][0]}"><title>{escape(title)}</title></rect>'
        )
    for window in windows:
        left, right = x(window.start_ns), x(window.end_ns)
        colour = "#b30000" if window.recompile else "#e34a33"
        parts.append(
            f'<rect class="compilation" x="{left:.1f}" y="{4 + 2 * _ROW}" width="{max(right - left, 1.5):.1f}" '
            f'height="{_ROW - 6}" fill="{colour}"><title>{escape(window.title)}</title></rect>'
        )
        if window.recompile:
            parts.append(
                f'<line class="recompile" x1="{left:.1f}" x2="{left:.1f}" y1="{4 + 3 * _ROW}" y2="{4 * _ROW}" '
                f'stroke="#b30000" stroke-width="2"><title>{escape(window.title)}</title></line>'
                f'<text x="{left + 2:.1f}" y="{3 * _ROW + 15}">{escape(window.step)}</text>'
            )
    height = 4 * _ROW + 24
    parts.append(f'<text x="{_LEFT}" y="{height - 4}">0 s (wall time)</text>')
    parts.append(f'<text x="{_WIDTH - 60}" y="{height - 4}">{(end - start) / 1e9:.2f} s</text>')
    svg = f'<svg id="timeline" width="{_WIDTH}" height="{height}" role="img">{"".join(parts)}</svg>' + _LEGEND
    compilations = summary.digest.compilations
    note = f'<p class="muted">The first {len(windows)} of {compilations} compilations are drawn.</p>'
    return svg if len(windows) == compilations else svg + note


def _break_details(summary: RunSummary) -> str:
    items = []
    for detail in summary.digest.break_details:
        path = escape("\n".join(detail.stack))
        whose = f" in {escape(detail.owner)}'s code" if detail.owner and detail.owner != "user" else ""
        user = detail.user_location
        reached = f", reached from {escape(shown(user))}" if user and detail.owner != "user" else ""
        items.append(
            f"<li><b>{escape(shown(detail.location or 'unknown location'))}</b>{whose}{reached} "
            f"({escape(detail.frame)}, compile {escape(detail.compile_id)}): {escape(detail.reason)}"
            f"<details><summary>torch's full reason{' and the call stack' if path else ''}</summary>"
            f"<pre>{escape(detail.reason_full)}</pre>{f'<pre>{path}</pre>' if path else ''}</details></li>"
        )
    more = summary.digest.break_count - len(items)
    tail = f'<p class="muted">... and {more} more (the summary groups them all).</p>' if more > 0 else ""
    return f'<ul id="graph-breaks">{"".join(items)}</ul>{tail}' if items else '<p class="muted">No graph breaks.</p>'


def _linked(text: str) -> str:
    """``text`` escaped, a documentation address in it a link."""
    return re.sub(r"(https?://[^\s<]+)", r'<a href="\1">\1</a>', escape(text))


def _diagnosis(summary: RunSummary) -> str:
    """The first screen: what to fix first, the expected price, the first steps (the summary's words)."""
    items = text.fix_first(summary)
    notes = text.notes(summary)
    if not items and not notes:
        return '<div id="diagnosis"><p>Nothing to fix: no recompile and no graph break.</p></div>'
    listed = "".join(
        f"<li><b>{escape(item.head)}</b>" + "".join(f"<br>{_linked(detail)}" for detail in item.details) + "</li>"
        for item in items
    )
    return (
        '<div id="diagnosis"><h2>What to fix first</h2>'
        + (f"<ol>{listed}</ol>" if listed else "")
        + "".join(f'<p class="muted">{escape(note)}</p>' for note in notes)
        + '<p class="muted">Each cause and its fix, with examples: docs/fixing.md.</p></div>'
    )


def render_report(summary: RunSummary) -> str:
    """The whole report of one run as one HTML document."""
    return _document(_run_sections(summary))


def render_fleet_report(fleet: Fleet, summary: RunSummary) -> str:
    """Several ranks of one run: their spread and odd ranks, a rank-by-time view, one representative rank's report."""
    fleet_lines = text.format_fleet(fleet).splitlines()
    sections = [
        f"<h1>telemetry-jit report: {len(fleet.ranks)} ranks</h1>",
        f"<p class='muted'>run {escape(fleet.run_id)}</p>",
        '<div id="fleet"><pre>' + escape("\n".join(line.strip() for line in fleet_lines[1:])) + "</pre></div>",
        "<h2>Compilations by rank over time</h2>",
        _ranks_timeline(fleet),
        f"<h2>Rank {summary.run.rank}, for its group</h2>",
        *_run_sections(summary)[1:],
    ]
    return _document(sections)


def _ranks_timeline(fleet: Fleet) -> str:
    """One row per rank, compilations as bars (recompiles darker), the slowest rank's row marked."""
    windows = [window for digest in fleet.ranks.values() for window in digest.windows]
    if not windows:
        return '<p class="muted">No compilations.</p>'
    start = min(window.start_ns for window in windows)
    end = max(window.end_ns for window in windows)
    scale = (_WIDTH - _LEFT - 10) / max(end - start, 1)
    row = max(1.0, min(14.0, 700 / len(fleet.ranks)))
    odd = {rank for group in fleet.sequences[1:] for rank in group.ranks}  # outside the largest group
    parts = []
    for index, (rank, digest) in enumerate(fleet.ranks.items()):
        y = 4 + index * row
        slow = rank == fleet.compile_s.max_rank
        if row >= 8 or slow or rank in odd:
            label = f"rank {rank}" + (" (slowest)" if slow else " (odd)" if rank in odd else "")
            parts.append(f'<text x="4" y="{y + row - 1:.1f}">{escape(label)}</text>')
        for window in digest.windows:
            begin, finish = window.start_ns, window.end_ns
            x = _LEFT + (begin - start) * scale
            width = max((finish - begin) * scale, 1.0)
            colour = "#b30000" if window.recompile else "#e34a33"
            height = max(row - 1, 1)
            parts.append(
                f'<rect class="rank-compile" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" '
                f'fill="{colour}"><title>rank {rank}: {(finish - begin) / 1e6:.0f} ms</title></rect>'
            )
    total = 4 + len(fleet.ranks) * row + 20
    parts.append(f'<text x="{_LEFT}" y="{total - 4:.0f}">0 s</text>')
    parts.append(f'<text x="{_WIDTH - 60}" y="{total - 4:.0f}">{(end - start) / 1e9:.2f} s</text>')
    return (
        f'<svg id="ranks-timeline" width="{_WIDTH}" height="{total:.0f}" role="img">{"".join(parts)}</svg>'
        '<p class="legend">One row per rank: its compilations (recompilations darker) on one clock. A row whose '
        "bars end later than the others' is a straggler its peers wait for at the next collective.</p>"
    )


_HEAD = '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>telemetry-jit report</title>'
# what every report begins with: `report -o` replaces a file only where it is one (docs/reliability.md)
REPORT = OwnKind("report", lambda head: head.startswith(_HEAD.encode()))


def _document(sections: list[str]) -> str:
    body = "\n".join(sections)
    return f"{_HEAD}<style>{_STYLE}</style></head><body>{body}</body></html>"


def _run_sections(summary: RunSummary) -> list[str]:
    """One run's report, the heading first."""
    run, digest = summary.run, summary.digest
    share = f"{100 * summary.share:.1f}% of {summary.loop_words}" if summary.share is not None else "n/a"
    cards = [
        (f"{summary.wall_ms / 1000:.2f} s", f"{summary.loop_words}: wall time"),
        (f"{summary.compile_in_loop_ms / 1000:.2f} s", f"compiling in it ({share})"),
        (str(digest.frame_compiles), "frame compiles"),
        (str(digest.recompiles), "of them recompiles"),
        (str(digest.backward_graphs), "backward graphs"),
        (str(digest.break_count), "graph breaks"),
        (str(digest.fallback_count), "fell back to eager"),
    ]
    sections = [
        f"<h1>telemetry-jit report</h1><p class='muted'>run {escape(run.run_id)}, rank {run.rank} "
        f"{escape(run.node)}</p>",
        '<div class="cards">' + "".join(f'<div class="card"><b>{v}</b>{escape(k)}</div>' for v, k in cards) + "</div>",
        '<p id="figures">' + "<br>".join(escape(line) for line in text.figure_lines(summary)) + "</p>",
        _diagnosis(summary),
    ]
    if not summary.status.finished:
        sections.insert(1, f'<p id="status" class="unfinished">{escape(summary.status.headline())}</p>')
    if summary.payoff is not None:
        account = (
            f'<p class="muted">{escape(text.net_line(summary.payoff))}; eager steps ran the same model with '
            'torch.compiler.set_stance("force_eager"), in blocks between compiled ones.</p>'
            if summary.payoff.measured
            else ""
        )
        sections.append(
            '<div id="payoff"><h2>Is compiling worth it?</h2>'
            f"<p><b>{escape(summary.payoff_sentence)}</b></p>{account}</div>"
        )
    sections += [
        "<h2>Timeline</h2>",
        _timeline(summary),
        "<h2>Compilations per frame</h2>",
        _table(text.FRAME_HEADERS, text.frame_rows(summary), "frames"),
    ]
    if summary.thunder_rows:
        sections += ["<h2>Thunder cache</h2>", _table(text.THUNDER_HEADERS, summary.thunder_rows, "thunder")]
    sections += [
        "<h2>Recompiles by cause</h2>",
        _table(text.CAUSE_HEADERS, text.cause_rows(summary), "causes"),
        "<h2>Graph breaks by place</h2>",
        _table(text.BREAK_HEADERS, text.break_rows(summary), "breaks"),
        "<h2>Every graph break</h2>",
        _break_details(summary),
    ]
    if digest.ddp:
        sections += [
            "<h2>DDP optimizer splits</h2>",
            "<p>torch._dynamo's DDPOptimizer cut these graphs at DDP gradient-bucket boundaries so that "
            "all-reduce overlaps backward. They are not graph breaks in your code; the bucket size is DDP's "
            "<code>bucket_cap_mb</code>.</p>",
            _table(text.DDP_HEADERS, digest.ddp, "ddp-splits"),
        ]
    return sections
