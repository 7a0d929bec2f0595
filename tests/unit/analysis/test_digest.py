"""``analysis.digest``: compile spans folded into counts, backward graphs included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.diff import RunDiff
from telemetry_jit.analysis.digest import OTHER_PLACES
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.analysis.text import format_summary
from tests.words import flat

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.any_torch
def test_backward_graphs_a_torch_without_input_shapes_compiled_within_frame_compiles_are_not_counted(
    capsys: pytest.CaptureFixture,
) -> None:
    """The run of test_the_backward_graphs_torch_compiled_within_a_frame_compile_are_said recorded on torch 2.8:
    torch's backward compiler ran 3 times, once at a first backward (a span) and twice within the dynamic
    recompiles, which torch 2.8 records nothing of (no CompilationMetrics.graph_node_shapes): the summary says it
    cannot count those rather than a total of 1."""
    recorded = str(DATA / "dynamic-lengths-torch28.jsonl")
    run = read_telemetry(recorded)[-1]
    digest = summarize(run).digest
    assert (digest.backward_graphs, digest.backward_within, digest.backward_within_unknown) == (1, 0, 2)
    assert cli.main(["summary", recorded]) == 0
    out = flat(capsys.readouterr().out)
    assert (
        "and 1 backward graph (not counted: backward graphs compiled within any of 2 frame compiles while training, "
        "as torch does with dynamic shapes; the torch of this run did not record compile.input_shapes)" in out
    ), out
    assert summary_json(run)["backward_graphs_within_frame_compiles"] is None


@pytest.mark.any_torch
@pytest.mark.parametrize(
    ("recording", "backward_graphs"),
    [
        ("gpt2-backward-graphs.jsonl", (2, 4, 0)),
        ("lstm-packed-backward-graphs.jsonl", (0, 0, 0)),
        ("conv1d-bn-inductor-warm-backward-graphs.jsonl", (0, 0, 6)),
        ("conv1d-bn-inductor-torch215-backward-built.jsonl", (1, 5, 0)),
    ],
    ids=["gpt2", "lstm_packed", "conv1d_bn-inductor-warm-cache", "conv1d_bn-inductor-torch-2.15"],
)
def test_only_frames_that_need_a_backward_compile_one_within(
    recording: str, backward_graphs: tuple[int, int, int]
) -> None:
    """The oracle's recordings (compilation spans, pared to the attributes read here), tlparse's aot_backward_graph
    artifacts the truth. GPT-2: transformers' wrappers break at a logging call before any op, so their dynamic
    recompiles hold an empty graph and no backward; tlparse found 6 (2 lazy, 4 within the network's and the loss's
    recompiles) where the summary said 12. The LSTM over packed sequences: its compiled frame reads only the lengths
    (no gradients), compiled static with no backward, then dynamic: none either, where the summary said 1. Issue
    54's Conv1d model on inductor with a warm compile cache: each training compile loaded its backward graph with its
    forward (two FX graphs hit), so none compiled at a first backward; tlparse found 6 where the summary said 0. The
    same model on torch 2.15's inductor: its static recompiles built their backward with the forward (inductor looked
    up two FX graphs in each), where torch 2.13 compiled it at the first backward; tlparse found 6 (0/0's at its first
    backward, and within 0/1, 0/2, 0/3, 0/4, 0/6) where the summary said 3."""
    (run,) = read_telemetry(DATA / recording)
    digest = summarize(run).digest
    assert (digest.backward_graphs, digest.backward_within, digest.backward_loaded) == backward_graphs


def _compiles(path: Path, count: int, frames: bool, breaks: bool) -> None:
    """The recorded run, then ``count`` compiles: each of a frame never seen before (``frames``), each breaking at a
    line never seen before (``breaks``)."""
    lines = (DATA / "answers.jsonl").read_text().splitlines()
    compile_record, break_record = json.loads(lines[5]), json.loads(lines[6])
    added = []
    for n in range(count):
        attributes = {**compile_record["attributes"], "compile.id": f"{100 + n}/0"}
        if frames:
            attributes.update({"compile.frame": f"forward_{n}", "compile.location": f"/src/model_{n}.py:{n}"})
        added.append(json.dumps({**compile_record, "span_id": f"c{n}", "attributes": attributes}))
        if breaks:
            said = {**break_record["attributes"], "graph_break.location": f"/src/layers_{n}.py:{n}"}
            added.append(json.dumps({**break_record, "span_id": f"c{n}", "attributes": said}))
    path.write_text("\n".join(lines[:-3] + added + lines[-3:]) + "\n")


def test_frames_past_the_rows_kept_are_counted_in_one_row_and_said(tmp_path: Path) -> None:
    path = tmp_path / "frames.jsonl"
    _compiles(path, 30, frames=True, breaks=False)
    alone = read_telemetry(DATA / "answers.jsonl")[-1].digest
    digest = read_telemetry(path, max_rows=3)[-1].digest
    assert alone is not None and digest is not None
    assert len(digest.frames) == 3 and digest.other_frames is not None
    rows = digest.frame_rows()
    assert rows[-1] is digest.other_frames and rows[-1].frame == "(frames past the first 3)"
    assert digest.frame_compiles == alone.frame_compiles + 30  # the totals exact
    assert sum(row.compiles for row in rows) == digest.frame_compiles
    assert sum(row.compile_ms for row in rows) == pytest.approx(digest.compile_ms)
    assert "(frames past the first 3)" in format_summary(read_telemetry(path, max_rows=3)[-1])


def test_frames_past_the_rows_kept_are_one_row_of_diffs_frames(tmp_path: Path) -> None:
    path = tmp_path / "frames.jsonl"
    _compiles(path, 30, frames=True, breaks=False)
    base = summarize(read_telemetry(DATA / "answers.jsonl", max_rows=3)[-1])
    new = summarize(read_telemetry(path, max_rows=3)[-1])
    rows = {frame: (b, n) for frame, b, n in RunDiff(base, new).frames()}
    past = rows["(frames past the first 3)"]
    assert new.digest.other_frames is not None and past[1].compiles == new.digest.other_frames.compiles > 0
    assert sum(n.compiles for _, n in rows.values()) == new.digest.frame_compiles  # every compile in a row


def test_graph_breaks_past_the_places_kept_are_counted_exactly_and_said(tmp_path: Path) -> None:
    path = tmp_path / "breaks.jsonl"
    _compiles(path, 30, frames=False, breaks=True)
    alone = read_telemetry(DATA / "answers.jsonl")[-1].digest
    run = read_telemetry(path, max_rows=3)[-1]
    digest = run.digest
    assert alone is not None and digest is not None
    assert digest.break_count == alone.break_count + 30
    assert len(digest.breaks) == 3 and sum(group.count for group in digest.breaks.values()) < digest.break_count
    assert sum(group.count for group in digest.breaks.values()) + digest.breaks_not_grouped == digest.break_count
    by_torch = sum(group.counted_by_torch for group in digest.breaks.values()) + digest.breaks_not_grouped_by_torch
    assert by_torch == sum(group.counted_by_torch for group in alone.breaks.values()) + 30
    assert len(digest.break_keys) == 4 and digest.break_keys[OTHER_PLACES] > 0  # 3 places and one for the rest
    assert sum(digest.break_keys.values()) == digest.break_count
    assert sum(digest.user_break_keys.values()) == sum(alone.user_break_keys.values())
    assert summary_json(run)["graph_breaks_not_grouped"] == digest.breaks_not_grouped
    text = flat(format_summary(run))
    assert f"(places past the first 3) {digest.breaks_not_grouped}" in text, text
    assert "graph_breaks_not_grouped" not in summary_json(read_telemetry(DATA / "answers.jsonl")[-1])


def test_graph_breaks_past_the_places_kept_are_new_to_diff_as_one_place(tmp_path: Path) -> None:
    """A run that breaks at more places than are kept, compared with one that breaks at fewer: the breaks past the
    kept places are said new as one place, counted, never dropped."""
    path = tmp_path / "breaks.jsonl"
    _compiles(path, 30, frames=False, breaks=True)
    base = summarize(read_telemetry(DATA / "answers.jsonl", max_rows=3)[-1])
    new = summarize(read_telemetry(path, max_rows=3)[-1])
    new_breaks = RunDiff(base, new).new_only.graph_breaks
    assert new_breaks[OTHER_PLACES] == new.digest.break_keys[OTHER_PLACES] > 0
    assert OTHER_PLACES not in RunDiff(new, base).new_only.graph_breaks
