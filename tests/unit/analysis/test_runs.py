"""``analysis.runs``: how a run ended, and whether its file proves it whole (its writer's numbered records)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.reader import load, read_telemetry
from telemetry_jit.analysis.runs import WriterTally, missing_ranks, run_status

pytestmark = pytest.mark.any_torch

IDS = {"run": "r1", "rank": 0, "local_rank": 0, "world_size": 1, "node": "n", "pid": 7}


def _body(training: bool = True) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [
        {"kind": "run_start", "format": "telemetry-jit", "format_version": 2},
        {"kind": "span_start", "span_id": "a", "parent_id": None, "name": "application", "start_unix_ns": 1},
    ]
    if training:
        records += [
            {
                "kind": "span",
                "span_id": "c",
                "parent_id": "t",
                "name": "compilation",
                "start_unix_ns": 3,
                "end_unix_ns": 4,
                "attributes": {"compile.id": "0/0"},
            },
            {
                "kind": "event",
                "span_id": "t",
                "name": "compile_summary",
                "time_unix_ns": 5,
                "attributes": {"compile.count": 1, "train.global_step": 4},
            },
            {
                "kind": "span",
                "span_id": "t",
                "parent_id": "a",
                "name": "training_loop",
                "start_unix_ns": 2,
                "end_unix_ns": 6,
                "attributes": {},
            },
        ]
    records += [
        {
            "kind": "span",
            "span_id": "a",
            "parent_id": None,
            "name": "application",
            "start_unix_ns": 1,
            "end_unix_ns": 7,
            "attributes": {},
        },
        {"kind": "health", "failed_calls": {}, "exporters": {}},
    ]
    return records


def _numbered(records: list[dict[str, Any]], writer: str = "abc123", closed: bool = True) -> list[dict[str, Any]]:
    """``records`` as a writer writes them: numbered from 0, closed by run_end's counts."""
    out = [{**record, "seq": seq, "writer": writer, **IDS} for seq, record in enumerate(records)]
    if closed:
        written: dict[str, int] = {}
        for record in records:
            written[record["kind"]] = written.get(record["kind"], 0) + 1
        out.append(
            {
                "kind": "run_end",
                "records": len(records),
                "written": written,
                "seq": len(records),
                "writer": writer,
                **IDS,
            }
        )
    return out


def _status(tmp_path: Path, records: list[dict[str, Any]]):  # noqa: ANN202 - RunStatus
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return run_status(read_telemetry(path, digest=True)[-1])


def test_a_whole_numbered_run_is_proven_whole(tmp_path: Path) -> None:
    status = _status(tmp_path, _numbered(_body()))
    assert status.finished and status.whole is True and status.missing == (), status


def test_a_run_before_numbered_records_cannot_be_proven_whole_and_is_judged_as_before(tmp_path: Path) -> None:
    status = _status(tmp_path, [{**record, **IDS} for record in _body()])
    assert status.finished and status.whole is None and "recorded before telemetry-jit file format 2" in status.unproven
    assert status.as_json()["whole"] is None


@pytest.mark.parametrize(
    ("cut", "named"),
    [
        (lambda r: r[3:], "the head (records 0 to 2"),
        (lambda r: r[:2] + r[4:], "records 2 to 3"),
        (lambda r: r[:6] + r[7:], "record 6"),  # the health line only
    ],
)
def test_records_missing_are_named(tmp_path: Path, cut: Any, named: str) -> None:
    status = _status(tmp_path, cut(_numbered(_body())))
    assert status.state == "incomplete" and named in status.missing[0], status


def test_the_counts_by_kind_name_what_is_missing(tmp_path: Path) -> None:
    records = _numbered(_body())
    del records[6]
    assert "by kind, 1 health record" in _status(tmp_path, records).missing


def test_a_run_without_its_closing_record_was_killed_though_its_loops_ended(tmp_path: Path) -> None:
    status = _status(tmp_path, _numbered(_body(), closed=False))
    assert status.state == "killed" and "no closing record (run_end)" in status.detail, status


def test_lines_read_twice_or_without_a_number_are_a_spliced_file(tmp_path: Path) -> None:
    records = _numbered(_body())
    assert "2 records read twice" in _status(tmp_path, records + records[2:4]).detail
    foreign = {**_body()[2], **IDS}
    status = _status(tmp_path, [*records[:-1], foreign, records[-1]])
    assert status.state == "incomplete" and "1 record without a number" in status.detail, status


def test_exports_that_failed_and_compile_spans_the_summary_counts_are_missing(tmp_path: Path) -> None:
    body = _body()
    body[-1] = {"kind": "health", "failed_calls": {"nv_one_logger.export": {"callee": "x", "count": 2}}}
    body[3]["attributes"]["compile.count"] = 3
    status = _status(tmp_path, _numbered(body))
    assert status.missing == (
        "2 compile spans that failed to export (its health record counts them, at nv_one_logger.export)",
    ), status
    body[3]["attributes"]["compile.count"] = 5  # more than the failures account for
    assert (
        "2 compile spans (its compile_summary counts 5 compiles, the file holds 1)"
        in _status(tmp_path, _numbered(body)).missing
    )


def test_a_loop_that_ran_batches_and_compiled_nothing_trained(tmp_path: Path) -> None:
    """A plain loop's run (no Lightning loop spans) that compiled nothing: its compile_summary says the step it
    reached, so it is no run that trained nothing."""
    body = [record for record in _body() if record.get("name") not in ("compilation", "training_loop")]
    body.insert(
        2,
        {
            "kind": "event",
            "span_id": "a",
            "name": "compile_summary",
            "time_unix_ns": 5,
            "attributes": {"compile.count": 0, "train.global_step": 8},
        },
    )
    assert _status(tmp_path, _numbered(body)).finished
    body[2]["attributes"]["train.global_step"] = 0
    assert _status(tmp_path, _numbered(body)).state == "empty"


def test_a_stopped_early_event_is_said_in_the_status(tmp_path: Path) -> None:
    body = _body()
    body.insert(
        4,
        {
            "kind": "event",
            "span_id": "t",
            "name": "stopped_early",
            "time_unix_ns": 5,
            "attributes": {"stop.reason": "max_time", "stop.detail": "max_time ran out at step 4"},
        },
    )
    status = _status(tmp_path, _numbered(body))
    assert status.finished and status.stopped_early == "max_time ran out at step 4"
    assert status.notes() == ["this run STOPPED EARLY: max_time ran out at step 4"]


def test_one_rank_of_a_job_is_missing_its_other_ranks(tmp_path: Path) -> None:
    path = tmp_path / "t.rank0.jsonl"
    path.write_text("".join(json.dumps({**r, "world_size": 2}) + "\n" for r in _numbered(_body())))
    (run,) = read_telemetry(path)
    words = "run r1: rank 1 of 2 (its records say world_size 2; pass every rank's file, or the folder)"
    assert missing_ranks([run]) == [words]
    assert f"not the whole job: missing {words}" in load([path]).notes  # what summary says
    assert cli.main(["check", str(path), "--max-recompiles", "5"]) == 3
    assert cli.main(["check", str(path), "--max-recompiles", "5", "--allow-incomplete"]) == 0


def test_the_tally_keeps_ranges_of_numbers() -> None:
    tally = WriterTally("w")
    for seq in [0, 1, 2, 5, 6, 4, 9, 3]:
        tally.add(seq, "run_start" if seq == 0 else "event")
    assert tally.ranges == [[0, 6], [9, 9]] and tally.missing() == ["records 7 to 8"]
    tally.add(5, "event")
    assert tally.repeated == 1 and tally.foreign() == ["1 record read twice"]
