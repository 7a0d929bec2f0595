"""A self-contained HTML report of a run: no network, no scripts from anywhere, opens offline."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from telemetry_jit.analysis.summary import (
    BREAK_HEADERS,
    DDP_HEADERS,
    FRAME_HEADERS,
    THUNDER_HEADERS,
    ReasonRow,
    RunSummary,
    is_recompile,
    short_location,
)
from telemetry_jit.schema import CompileAttr, GraphBreakAttr, JitEventName, JitSpanName, TrainAttr, TrainingSpanName

_WIDTH, _ROW, _LEFT = 1100, 22, 150
_COLOURS = {
    TrainingSpanName.TRAINING_LOOP: "#9ecae1",
    TrainingSpanName.VALIDATION_LOOP: "#c7e9c0",
    TrainingSpanName.TESTING_LOOP: "#fdd0a2",
}

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; } .num { text-align: right; } .muted { color: #777; }
.cards { display: flex; gap: 1em; flex-wrap: wrap; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .6em 1em; }
.card b { display: block; font-size: 1.3em; } svg text { font: 11px system-ui, sans-serif; }
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
    """Loops as bars, compilations over them (recompiles darker), recompiles marked on a step axis."""
    spans = [s for s in summary.run.spans.values() if s.name in _COLOURS or s.name == JitSpanName.COMPILATION]
    if not spans:
        return '<p class="muted">No loops or compilations recorded.</p>'
    start = min(s.start_unix_ns for s in spans)
    end = max(s.end_unix_ns or s.start_unix_ns for s in spans)
    scale = (_WIDTH - _LEFT - 10) / max(end - start, 1)

    def x(ns: int) -> float:
        return _LEFT + (ns - start) * scale

    rows = {
        TrainingSpanName.TRAINING_LOOP: 0,
        TrainingSpanName.VALIDATION_LOOP: 1,
        TrainingSpanName.TESTING_LOOP: 1,
        JitSpanName.COMPILATION.value: 2,
    }
    labels = ["training", "validation / test", "compilation", "recompiles (step)"]
    parts = [f'<text x="4" y="{16 + i * _ROW}">{escape(label)}</text>' for i, label in enumerate(labels)]
    for span in sorted(spans, key=lambda s: s.start_unix_ns):
        row = rows[span.name]
        left, right = x(span.start_unix_ns), x(span.end_unix_ns or end)
        attributes = span.attributes
        if span.name == JitSpanName.COMPILATION:
            colour = "#b30000" if attributes.get(CompileAttr.IS_RECOMPILE) else "#e34a33"
            title = (
                f"{attributes.get(CompileAttr.FRAME, '')} {attributes.get(CompileAttr.ID, '')} "
                f"({attributes.get(CompileAttr.TRIGGER, '')}) {span.duration_ms or 0:.1f} ms at step "
                f"{attributes.get(TrainAttr.GLOBAL_STEP, '')} {attributes.get(CompileAttr.RECOMPILE_REASON, '')}"
            )
        else:
            colour, title = _COLOURS[span.name], f"{span.name} {span.duration_ms or 0:.0f} ms"
        width = max(right - left, 1.5)
        parts.append(
            f'<rect class="{escape(span.name)}" x="{left:.1f}" y="{4 + row * _ROW}" width="{width:.1f}" '
            f'height="{_ROW - 6}" fill="{colour}"><title>{escape(title)}</title></rect>'
        )
        if span.name == JitSpanName.COMPILATION and is_recompile(span):
            step = escape(str(attributes.get(TrainAttr.GLOBAL_STEP, "")))
            parts.append(
                f'<line class="recompile" x1="{left:.1f}" x2="{left:.1f}" y1="{4 + 3 * _ROW}" y2="{4 * _ROW}" '
                f'stroke="#b30000" stroke-width="2"><title>{escape(title)}</title></line>'
                f'<text x="{left + 2:.1f}" y="{3 * _ROW + 15}">{step}</text>'
            )
    height = 4 * _ROW + 24
    seconds = (end - start) / 1e9
    parts.append(f'<text x="{_LEFT}" y="{height - 4}">0 s</text>')
    parts.append(f'<text x="{_WIDTH - 60}" y="{height - 4}">{seconds:.2f} s</text>')
    return f'<svg id="timeline" width="{_WIDTH}" height="{height}" role="img">{"".join(parts)}</svg>'


def _break_details(summary: RunSummary) -> str:
    items = []
    for span in summary.compiles:
        for event in span.events:
            if event.name != JitEventName.GRAPH_BREAK:
                continue
            attributes = event.attributes
            location = short_location(str(attributes.get(GraphBreakAttr.LOCATION) or "unknown location"))
            frame, compile_id = span.attributes.get(CompileAttr.FRAME, ""), span.attributes.get(CompileAttr.ID, "")
            full = escape(str(attributes.get(GraphBreakAttr.REASON_FULL, "")))
            items.append(
                f"<li><b>{escape(location)}</b> ({escape(str(frame))}, compile {escape(str(compile_id))}): "
                f"{escape(str(attributes.get(GraphBreakAttr.REASON)))}"
                f"<details><summary>torch's full reason</summary><pre>{full}</pre></details></li>"
            )
    return f'<ul id="graph-breaks">{"".join(items[:200])}</ul>' if items else '<p class="muted">No graph breaks.</p>'


def render_report(summary: RunSummary) -> str:
    """The whole report as one HTML document."""
    run = summary.run
    cards = [
        (f"{summary.wall_ms / 1000:.2f} s", f"{summary.loop_name} wall time"),
        (f"{summary.compile_ms / 1000:.2f} s", f"compile time ({summary.share})"),
        (str(len(summary.compiles)), "compilations"),
        (str(len(summary.recompiles)), "recompilations"),
        (str(len(summary.breaks)), "graph breaks"),
        (str(len(summary.fallbacks)), "fell back to eager"),
    ]
    sections = [
        f"<h1>telemetry-jit report</h1><p class='muted'>run {escape(run.run_id)}, rank {run.rank} "
        f"{escape(run.node)}</p>",
        '<div class="cards">' + "".join(f'<div class="card"><b>{v}</b>{escape(k)}</div>' for v, k in cards) + "</div>",
    ]
    if summary.warm_start.hits or summary.warm_start.misses:
        sections.append(f'<p id="compile-cache">Compile cache: {escape(summary.warm_start.line)}</p>')
    sections += [
        "<h2>Timeline</h2>",
        _timeline(summary),
        "<h2>Compilations per frame</h2>",
        _table(FRAME_HEADERS, summary.frame_rows, "frames"),
    ]
    if summary.thunder_rows:
        sections += ["<h2>Thunder cache</h2>", _table(THUNDER_HEADERS, summary.thunder_rows, "thunder")]
    sections += [
        "<h2>Top recompile reasons</h2>",
        _table(ReasonRow._fields, summary.reasons, "reasons"),
        "<h2>Graph breaks by location</h2>",
        _table(BREAK_HEADERS, summary.break_rows, "breaks"),
        "<h2>Every graph break</h2>",
        _break_details(summary),
    ]
    if summary.ddp_rows:
        sections += [
            "<h2>DDP optimizer splits</h2>",
            "<p>torch._dynamo's DDPOptimizer cut these graphs at DDP gradient-bucket boundaries so that "
            "all-reduce overlaps backward. They are not graph breaks in your code; the bucket size is DDP's "
            "<code>bucket_cap_mb</code>.</p>",
            _table(DDP_HEADERS, summary.ddp_rows, "ddp-splits"),
        ]
    body = "\n".join(sections)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>telemetry-jit report</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )
