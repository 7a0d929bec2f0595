"""``analysis.reader``: any file read in bounded memory, its damage counted and said, every count exact."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis import cold_start, digest, reader
from telemetry_jit.analysis.reader import load, read_telemetry
from telemetry_jit.analysis.summary import summarize
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.analysis.trace import to_trace_events

DATA = Path(__file__).resolve().parents[2] / "data"


NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"


RECORDED = DATA / "answers.jsonl"


# backward graphs compiled within dynamic frames, loaded from the cache, not needed (an LSTM's lengths), unknown
RUNS = (
    "answers.jsonl",
    "gpt2-backward-graphs.jsonl",
    "conv1d-bn-inductor-warm-backward-graphs.jsonl",
    "lstm-packed-backward-graphs.jsonl",
    "dynamic-lengths-torch28.jsonl",
)


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


@pytest.mark.any_torch
def test_per_iteration_spans_are_passed_over_without_being_kept(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    lines = NEW.read_text().splitlines(keepends=True)
    identity = json.loads(lines[0])
    iteration = {k: identity[k] for k in ("run", "rank", "local_rank", "world_size", "node", "pid")}
    extra = "".join(
        json.dumps(
            {
                "kind": "span",
                "span_id": f"i{n}",
                "parent_id": None,
                "name": "training_single_iteration",
                "start_unix_ns": n,
                "end_unix_ns": n + 1,
                "attributes": {},
                **iteration,
            },
            separators=(",", ":"),
        )
        + "\n"
        for n in range(20_000)
    )
    path.write_text(lines[0] + extra + "".join(lines[1:]))
    kept = read_telemetry(path, skip_spans=("training_single_iteration",))[-1]
    everything = read_telemetry(path)[-1]
    assert len(everything.spans) - len(kept.spans) == 20_000
    assert format_summary(kept) == format_summary(read_telemetry(NEW)[-1])


@pytest.mark.any_torch
def test_values_a_file_should_not_hold_leave_every_output_valid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = NEW.read_text()
    text = text.replace('"compile.duration_ms":', '"compile.duration_ms":NaN,"x.was":', 1)
    text = text.replace('"compile.graph_op_count":', '"compile.graph_op_count":1e400,"y.was":', 1)
    text = text.replace('"train.global_step":', '"train.global_step":"three","z.was":', 1)
    path = tmp_path / "odd.jsonl"
    path.write_text(text)
    assert cli.main(["summary", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["summary", "--json", str(path)]) == 0
    json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    trace = tmp_path / "odd.trace.json"
    assert cli.main(["trace", str(path), "-o", str(trace)]) == 0
    json.loads(trace.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in the trace"))
    (tmp_path / "bad.jsonl").write_text(text.replace('"start_unix_ns":', '"start_unix_ns":"soon","s.was":', 1))
    assert cli.main(["summary", str(tmp_path / "bad.jsonl")]) == 1
    assert "malformed 'span_start' record" in capsys.readouterr().err


@pytest.mark.any_torch
def test_a_span_that_is_its_own_parent_is_read_without_hanging(tmp_path: Path) -> None:
    """A damaged (or hand-edited) file whose training loop names itself as its parent: every walk up the
    spans stops, and the summary is said."""
    lines = NEW.read_text().splitlines()
    loop = next(json.loads(line) for line in lines if '"training_loop"' in line)
    own = f'"span_id":"{loop["span_id"]}","parent_id":"{loop["parent_id"]}"'
    cycle = f'"span_id":"{loop["span_id"]}","parent_id":"{loop["span_id"]}"'
    assert sum(own in line for line in lines) == 2  # its start and its end
    path = tmp_path / "cycle.jsonl"
    path.write_text("\n".join(line.replace(own, cycle) for line in lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "telemetry_jit", "summary", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "what to fix first" in done.stdout, done.stderr[-2000:]


@pytest.mark.any_torch
def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    path.write_text(NEW.read_text() + '{"kind":"span","span_id":"x","na')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (run,) = read_telemetry(path)
    (said,) = [w for w in caught if "cut short" in str(w.message)]
    assert run.damage is not None and run.damage.cut_short and not run.damage.bad_lines
    # one line: about the file, so no line of the reader's caller is printed under it
    shown = warnings.formatwarning(said.message, said.category, said.filename, said.lineno)
    assert shown.strip().count("\n") == 0 and str(path) in shown
    assert len(run.find("compilation")) == len(read_telemetry(NEW)[-1].find("compilation"))


@pytest.mark.any_torch
@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
        (b'{"kind":"event"' + b" " * (70 * 2**20) + b"}", "longer than 64 MiB"),
        (bytes(range(256)) * 4, "binary data"),
        (b'{"kind": "span", oops', "not valid JSON"),
        (b"[1, 2, 3]", "not a record"),
    ],
    ids=["deep", "huge", "binary", "not-json", "not-an-object"],
)
def test_a_line_that_is_no_record_is_counted_and_said_and_the_rest_is_read(
    tmp_path: Path, line: bytes, reason: str, capsys: pytest.CaptureFixture
) -> None:
    lines = NEW.read_bytes().splitlines(keepends=True)
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"".join([*lines[:5], line.replace(b"\n", b" ") + b"\n", *lines[5:]]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (run,) = read_telemetry(path)
    assert run.damage is not None and run.damage.bad_lines == 1 and run.damage.first_bad_line == 6
    assert reason in run.damage.first_reason
    assert [w for w in caught if "could not be read and were skipped" in str(w.message)]
    assert len(run.find("compilation")) == len(read_telemetry(NEW)[-1].find("compilation"))
    # every command reads it; the gate cannot judge what it did not see
    for command in (["summary", str(path)], ["trace", str(path), "-o", str(tmp_path / "t.json")]):
        assert cli.main(command) == 0
    assert cli.main(["check", str(path), "--max-graph-breaks", "100"]) == 2
    assert "could not be read" in capsys.readouterr().err


@pytest.mark.any_torch
def test_random_bytes_are_no_telemetry_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "random.jsonl"
    path.write_bytes(bytes(range(1, 256)) * 100)  # no line break: it would look cut short if it were text
    assert cli.main(["summary", str(path)]) == 1
    err = capsys.readouterr().err
    assert "is not a telemetry-jit JSON Lines file (line 1: binary data)" in err and "cut short" not in err


@pytest.mark.any_torch
def test_a_number_out_of_range_is_a_bad_line_counted_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = RECORDED.read_text().splitlines()
    lines[3] = lines[3].replace('"rank":0', '"rank":1e400')
    path = tmp_path / "overflow.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="1 line.s. could not be read .*line 4, a number out of range"):
        assert cli.main(["summary", str(path)]) == 0
        assert cli.main(["check", str(path), "--max-recompiles", "100"]) == 2  # a record missing: not seen whole
    assert "INCOMPLETE" in capsys.readouterr().out


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
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


@pytest.mark.any_torch
def test_a_file_that_holds_an_empty_run_after_a_real_one_shows_the_last_started_and_the_gate_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "two.jsonl"
    run_id = json.loads(NEW.read_text().splitlines()[0])["run"]
    empty = NEW.read_text().splitlines()[0].replace(run_id, "f" * 32).replace('"pid":', '"pid":9')
    path.write_text(NEW.read_text() + empty + "\n")
    assert cli.main(["summary", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "showing the last started" in err and "TRAINED NOTHING" in out
    # the run the user means is the one just started: never an older, complete one in its place
    assert cli.main(["check", str(path), "--max-recompiles", "100"]) == 3


def test_records_read_without_being_parsed_still_count_in_their_writers_numbers(tmp_path: Path) -> None:
    """Per-iteration spans are skipped unparsed (millions of them); their numbers are read from the stamp that
    closes each line, so a whole file has no gap, and one without them lacks exactly those."""
    from telemetry_jit.analysis.runs import run_status

    stamp = ',"run":"r","rank":0,"local_rank":0,"world_size":1,"node":"n","pid":1}'
    records = [
        '{"kind":"run_start","format":"telemetry-jit","format_version":2',
        '{"kind":"span_start","span_id":"a","parent_id":null,"name":"application","start_unix_ns":1',
        '{"kind":"span_start","span_id":"i","parent_id":"a","name":"training_single_iteration","start_unix_ns":2',
        '{"kind":"span","span_id":"i","parent_id":"a","name":"training_single_iteration","start_unix_ns":2,'
        '"end_unix_ns":3,"attributes":{"seq":99}',  # an attribute of that name is no stamp: the last one is
        '{"kind":"span","span_id":"a","parent_id":null,"name":"application","start_unix_ns":1,"end_unix_ns":4,'
        '"attributes":{}',
        '{"kind":"run_end","records":5,"written":{"run_start":1,"span_start":2,"span":2}',
    ]
    lines = [f'{body},"seq":{seq},"writer":"ab12"{stamp}\n' for seq, body in enumerate(records)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(lines))
    (run,) = load([path]).runs
    assert run.writers["ab12"].ranges == [[0, 5]] and run.writers["ab12"].iterations == 2
    assert run_status(run).whole is True
    path.write_text("".join(lines[:2] + lines[4:]))
    status = run_status(load([path]).runs[0])
    assert status.missing == ("records 2 to 3", "by kind, 1 span record, 1 span_start record"), status


def _many_runs(path: Path, runs: int) -> list[str]:
    """``runs`` one-line runs (a file every job appends to), then the real run: the last started."""
    start = json.loads(RECORDED.read_text().splitlines()[0])
    ids = [f"{n:012x}" for n in range(runs)]
    lines = [json.dumps({**start, "run": run_id, "pid": n}) for n, run_id in enumerate(ids)]
    path.write_text("\n".join(lines) + "\n" + RECORDED.read_text())
    return ids


def test_a_file_of_more_runs_than_are_held_counts_them_all_and_keeps_the_last_started(tmp_path: Path) -> None:
    path = tmp_path / "appended.jsonl"
    _many_runs(path, 40)
    alone = read_telemetry(RECORDED)[-1].digest
    runs = read_telemetry(path, max_runs=5)
    assert len(runs) <= 5 + 1 and runs.total == 41  # the bound, give or take the last started, and every run counted
    assert runs.left_out.runs == 41 - len(runs)
    last = runs[-1].digest
    assert runs[-1].run_id == "a11a11a11a11" and last is not None and alone is not None
    assert (last.compilations, last.break_count, last.recompiles) == (
        alone.compilations,
        alone.break_count,
        alone.recompiles,
    )


def test_the_tallies_of_the_writers_of_runs_let_go_are_let_go_too(tmp_path: Path) -> None:
    """Each one-line run its own writer, with a per-iteration record (read unparsed) after it: reading ten times
    the runs holds about as much memory at its peak."""

    ITERATION = '"name":"training_single_iteration","start_unix_ns":1,"end_unix_ns":2,"attributes":{}'

    def peak(runs: int) -> int:
        path = tmp_path / f"{runs}.jsonl"
        lines = [
            f'{{"kind":"{kind}","run":"{n:012x}","pid":{n},"seq":{seq},"writer":"{n:012x}"}}'
            for n in range(runs)
            for seq, kind in enumerate(["run_start", f'span","span_id":"i{n}","parent_id":null,{ITERATION}'])
        ]
        path.write_text("\n".join(lines) + "\n")
        tracemalloc.start()
        try:
            read = read_telemetry(path, max_runs=10)
            _, most = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert read.total == runs
        return most

    assert peak(3_000) < 1.5 * peak(300)


def test_a_run_let_go_that_writes_again_is_counted_never_read_as_a_new_run(tmp_path: Path) -> None:
    path = tmp_path / "interleaved.jsonl"
    _many_runs(path, 10)
    lines = path.read_text().splitlines()
    again = json.loads(lines[0])  # the first run writes again after ten others began: two processes at once
    lines.insert(11, json.dumps({**again, "kind": "records_lost", "count": 1}))
    path.write_text("\n".join(lines) + "\n")
    runs = read_telemetry(path, max_runs=3)
    assert runs.total == 11 and runs.left_out.records == 1
    assert all(run.run_id != "000000000000" for run in runs)
    assert runs.left_out.written_at_once == 0  # let go before it wrote again: its interleaving is not known


def test_the_note_on_a_file_of_many_runs_names_the_last_ten_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "appended.jsonl"
    ids = _many_runs(path, 40)
    monkeypatch.setattr(reader, "MAX_RUNS", 20)
    kept = len(read_telemetry(path))
    loaded = load([path])
    assert loaded.runs[-1].run_id == "a11a11a11a11"
    held, counted = loaded.notes[:2]
    assert f"holds 41 runs (31 earlier, then the last 10 started: {', '.join(ids[-9:])}, a11a11a11a11)" in held
    assert ids[0] not in held  # no id listed past the last ten
    assert f"{41 - kept} of its runs (the least recently written) were counted, not read" in counted
    assert load([path], run_id="000000000000").runs[-1].run_id == "000000000000"  # the one asked for is kept
    assert cli.main(["summary", str(path)]) == 0
    assert "a11a11a11a11" in capsys.readouterr().out
