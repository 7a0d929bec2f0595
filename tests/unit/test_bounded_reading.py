"""Reading keeps a bounded amount of any file (many compile ids, spans, events, reasons) and every count exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telemetry_jit.analysis import cold_start, digest, reader
from telemetry_jit.analysis.inputs import load
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.trace import to_trace_events

pytestmark = pytest.mark.any_torch

DATA = Path(__file__).resolve().parents[1] / "data"
# backward graphs compiled within dynamic frames, loaded from the cache, not needed (an LSTM's lengths), unknown
RUNS = ("answers.jsonl", "gpt2-backward-graphs.jsonl", "conv1d-bn-inductor-warm-backward-graphs.jsonl")
RUNS += ("lstm-packed-backward-graphs.jsonl", "dynamic-lengths-torch28.jsonl")
COPIES = 12


def _copies(source: Path, path: Path, copies: int) -> None:
    """The run's records ``copies`` times, each copy with span ids, compile ids and recompile reasons of its own,
    what its events say of the global step 1000 steps on."""
    records = [json.loads(line) for line in source.read_text().splitlines()]
    lines = [json.dumps(records[0])]
    for copy in range(copies):
        for record in records[1:]:
            record = json.loads(json.dumps(record))
            for key in ("span_id", "parent_id"):
                if record.get(key):
                    record[key] = f"{record[key]}-{copy}"
            attributes = record.get("attributes") or {}
            if "compile.id" in attributes:
                frame, _, attempt = str(attributes["compile.id"]).partition("/")
                attributes["compile.id"] = f"{int(frame) + 1000 * copy}/{attempt}"
            if record["kind"] == "event" and "train.global_step" in attributes:  # each copy further on
                attributes["train.global_step"] += 1000 * copy
            if attributes.get("compile.recompile_reason"):
                attributes["compile.recompile_reason"] = f"copy {copy}: {attributes['compile.recompile_reason']}"
            lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def _counts(path: Path) -> dict[str, object]:
    run = load([path]).runs[-1]
    d = run.digest
    assert d is not None
    return {
        "compiles": (d.compilations, d.frame_compiles, d.backward_graphs, d.recompiles, d.break_count),
        "backward": (d.backward_within, d.backward_within_unknown, d.backward_loaded),
        "reasons": sum(sum(row.reasons.values()) + row.other_reasons for row in d.frames.values()),
        "causes": sum(row.count for row in d.causes.values()),
        "cache": d.warm_start.hits + d.warm_start.misses,
        "last step": summarize(run).last_step,
    }


def _small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounds a few copies of a run go beyond, so that what is kept is seen to stop growing."""
    monkeypatch.setattr(reader, "MAX_SPANS", 10)
    monkeypatch.setattr(reader, "MAX_EVENTS", 3)
    monkeypatch.setattr(digest, "MAX_KEPT", 15)
    monkeypatch.setattr(digest, "MAX_NAMES", 4)
    monkeypatch.setattr(digest, "AWAITED", 5)
    monkeypatch.setattr(cold_start, "MAX_GRAPHS", 6)


@pytest.mark.parametrize("name", RUNS)
def test_what_is_kept_of_many_compile_ids_spans_and_events_is_bounded(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_bounds(monkeypatch)
    path = tmp_path / "copies.jsonl"
    _copies(DATA / name, path, COPIES)
    for run in (load([path]).runs[-1], read_telemetry(path)[-1]):
        d = run.digest
        assert d is not None
        assert len(run.spans) <= reader.MAX_SPANS
        kept: dict[str, int] = {}
        for span in run.spans.values():
            for event in span.events:
                kept[event.name] = kept.get(event.name, 0) + 1
        assert max(kept.values(), default=0) <= reader.MAX_EVENTS
        assert max(len(d._seen), len(d.ends), len(d._frames_with_backward), len(d._static_train_frames)) <= 15
        assert len(d._awaiting) <= 5
        assert len(d.cache_ledger.seconds) <= 2 * cold_start.MAX_GRAPHS and len(d.cache_ledger._seen) <= 6
        assert all(len(row.reasons) <= 5 and len(row.loops) <= 4 for row in d.causes.values())
        assert all(len(row.reasons) <= 4 for row in d.frames.values())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    spans = len(run.spans) + sum(run.spans_not_kept.values())  # read_telemetry's: compilations kept as spans
    events = sum(len(span.events) for span in run.spans.values()) + sum(run.events_not_kept.values())
    assert spans == sum(record["kind"] == "span" for record in records)  # every one kept or counted
    assert events == sum(record["kind"] == "event" for record in records)


@pytest.mark.parametrize("name", RUNS)
def test_every_count_stays_exact_beyond_what_is_kept(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    _copies(DATA / name, one, 1)
    _copies(DATA / name, many, COPIES)
    single = _counts(one)
    _small_bounds(monkeypatch)
    counts = _counts(many)
    for key in ("compiles", "backward"):
        assert counts[key] == tuple(COPIES * n for n in single[key])  # type: ignore[attr-defined]
    for key in ("reasons", "causes", "cache"):
        assert counts[key] == COPIES * single[key]  # type: ignore[operator]
    if single["last step"] is not None:  # of a kept span's events past the first ones, the latest is kept
        monkeypatch.setattr(reader, "MAX_SPANS", 1000)
        assert _counts(many)["last step"] == single["last step"] + 1000 * (COPIES - 1)  # type: ignore[operator]


def test_a_frames_recompiles_are_counted_past_the_reasons_it_keeps(tmp_path: Path) -> None:
    path = tmp_path / "reasons.jsonl"
    records = [json.loads(line) for line in (DATA / "answers.jsonl").read_text().splitlines()]
    recompile = next(r for r in records if r.get("attributes", {}).get("compile.is_recompile"))
    lines = [json.dumps(record) for record in records]
    for n in range(3 * digest.MAX_NAMES):  # one frame's recompiles, each with a reason of its own
        attributes = {**recompile["attributes"], "compile.recompile_reason": f"size of x changed to {n}"}
        lines.append(json.dumps({**recompile, "span_id": f"again-{n}", "attributes": attributes}))
    path.write_text("\n".join(lines) + "\n")
    d = load([path]).runs[-1].digest
    assert d is not None
    row = next(row for row in d.frames.values() if row.recompiles > 3 * digest.MAX_NAMES)
    assert len(row.reasons) == digest.MAX_NAMES
    assert sum(row.reasons.values()) + row.other_reasons == row.recompiles


def test_trace_draws_the_spans_kept_and_counts_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _small_bounds(monkeypatch)
    path = tmp_path / "copies.jsonl"
    _copies(DATA / "answers.jsonl", path, COPIES)
    runs = read_telemetry(path)
    document = to_trace_events(runs)
    drawn = [event for event in document["traceEvents"] if event["ph"] == "X"]
    said = document["otherData"]["runs"][0]
    assert len(drawn) == reader.MAX_SPANS
    assert len(drawn) + sum(said["spans_not_drawn"].values()) == COPIES * 19 + COPIES * 4  # compilations, loops
    assert said["events_not_drawn"] == dict(runs[0].events_not_kept)
