"""``analysis.digest``: compile spans folded into counts, backward graphs included."""

from __future__ import annotations

from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize, summary_json
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
