"""The analysis side on recorded files, no training run: the answers run recorded by this telemetry-jit
(``tests/data/answers.jsonl``) and by telemetry-jit 0.1 before causes, stacks and batch positions were
recorded (``answers-recorded-by-0.1.jsonl``), both of ``tests/e2e/lm.py`` on torch 2.13; and the quickstart
with inductor, cold and then warm from one compile-cache folder (``cache-cold.jsonl``, ``cache-warm.jsonl``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from telemetry_jit import cli
from telemetry_jit.analysis.reader import read_telemetry
from telemetry_jit.analysis.summary import summarize, summary_json
from telemetry_jit.analysis.text import format_summary
from telemetry_jit.breaks import gist
from telemetry_jit.terminal import clean, error_text
from tests.words import flat

pytestmark = pytest.mark.any_torch

DATA = Path(__file__).resolve().parents[1] / "data"
NEW, OLD = DATA / "answers.jsonl", DATA / "answers-recorded-by-0.1.jsonl"
TORCH_RECOMPILES = 11  # torch's own count in both recordings


def test_causes_partition_torchs_recompiles_in_new_and_old_files() -> None:
    for path, last_batch in ((NEW, "last_batch"), (OLD, "changing_dim")):
        for digest in (False, True):  # read whole, or folded into aggregates as it is read: the same answers
            summary = summarize(read_telemetry(path, digest=digest)[-1])
            assert sum(row.count for row in summary.causes) == summary.digest.recompiles == TORCH_RECOMPILES
            train = {row.cause: row.count for row in summary.causes if row.unexpected and row.kind == "train"}
            assert train[last_batch] == 4
    old = summarize(read_telemetry(OLD)[-1])
    assert len(old.lacks) == 2 and "no batch positions" in old.lacks[0] and "no call stacks" in old.lacks[1]
    assert not summarize(read_telemetry(NEW)[-1]).lacks


def test_an_old_file_still_tells_whose_code_a_break_is_in() -> None:
    groups = {group.owner: group for group in summarize(read_telemetry(OLD)[-1]).breaks}
    assert set(groups) == {"user", "torch"}
    assert groups["torch"].user_locations == []  # it cannot know the user's line: no stacks
    assert groups["user"].user_locations[0].endswith("lm_scenario.py:32")


def test_the_analysis_side_imports_no_training_package() -> None:
    code = (
        "import sys; from telemetry_jit import cli; cli.main(['summary', '--json', sys.argv[1]]);"
        "heavy = [m for m in ('torch', 'lightning', 'nv_one_logger', 'opentelemetry') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code, str(NEW)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]


def rank_copies(folder: Path, ranks: int, odd: int | None = None, late_ms: float = 0.0) -> list[Path]:
    """``ranks`` rank files of one run made from the recorded run; rank ``odd`` lacks its last compile and
    finishes each compile ``late_ms`` later."""
    lines = NEW.read_text().splitlines()
    paths = []
    for rank in range(ranks):
        records = [json.loads(line) for line in lines]
        if rank == odd:
            last = max(i for i, r in enumerate(records) if r.get("name") == "compilation")
            del records[last]
            for record in records:
                if record.get("name") == "compilation":
                    record["end_unix_ns"] += int(late_ms * 1e6)
                    attributes = record.get("attributes", {})
                    if "compile.duration_ms" in attributes:  # the compile's own time, which the summary adds up
                        attributes["compile.duration_ms"] += late_ms
        for record in records:
            record.update(rank=rank, world_size=ranks)
        path = folder / f"run.rank{rank}.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        paths.append(path)
    return paths


def test_a_thousand_ranks_on_one_screen_naming_the_odd_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rank_copies(tmp_path, 1000, odd=511, late_ms=700)
    assert cli.main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = out.split("\n\n")[0].splitlines()
    assert head[0] == "telemetry-jit summary (run a11a11a11a11, 1000 ranks)"
    assert len(head) <= 12  # does not grow with the rank count
    assert "compilations per rank: min 18 (rank 511), median 19, max 19" in out
    assert "compiled alike: 999 of 1000 ranks" in out and "rank 511: 18 compilations" in out
    assert "fewer compiles, from" in out
    assert "rank 511 last" in out and "last to finish most often: rank 511" in out
    assert out.count("what to fix first") == 1  # one representative rank's answers, not a thousand


def test_fleet_budgets_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rank_copies(tmp_path, 4, odd=3, late_ms=2500)
    assert cli.main(["check", str(tmp_path), "--ranks-compile-alike"]) == 1
    assert "ranks compiled differently: 2 groups; ranks 3" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path), "--max-skew", "1"]) == 1
    assert "rank 3 last" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path), "--max-skew", "1000"]) == 0
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path / "run.rank0.jsonl"), "--max-skew", "1"]) == 2  # one rank: cannot tell
    assert "compare ranks" in capsys.readouterr().err
    assert cli.main(["summary", "--json", str(tmp_path)]) == 0
    document = json.loads(capsys.readouterr().out)
    (fleet,) = document["fleets"]
    assert fleet["ranks"] == 4 and [group["ranks"] for group in fleet["compiled_alike"]] == [[0, 1, 2], [3]]
    assert fleet["compile_s"]["max_rank"] == 3 and fleet["skews"][0]["last_rank"] == 3
    assert len(document["runs"]) == 1  # the representative; --per-rank for every rank
    assert cli.main(["summary", "--json", "--per-rank", str(tmp_path)]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 4
    assert cli.main(["summary", "--rank", "3", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("telemetry-jit summary (run a11a11a11a11, rank 3)")


def test_a_fleet_report_shows_every_rank(tmp_path: Path) -> None:
    rank_copies(tmp_path, 16, odd=5, late_ms=500)
    output = tmp_path / "fleet.html"
    assert cli.main(["report", str(tmp_path), "-o", str(output)]) == 0
    html = output.read_text()
    assert html.count('class="rank-compile"') == 15 * 19 + 18 and "rank 5 (slowest)" in html
    assert 'id="diagnosis"' in html  # the representative's answers follow


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


def test_terminal_escapes_never_reach_the_terminal() -> None:
    assert clean("run \x1b[31mred\x1b[0m\tok\n\u202eevil") == "run ?[31mred?[0m\tok\n?evil"


def test_an_error_without_a_message_is_named_by_its_type_alone() -> None:
    assert error_text(ValueError("bad batch")) == "ValueError: bad batch"
    assert error_text(KeyboardInterrupt()) == "KeyboardInterrupt"  # no dangling colon


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


def test_diff_of_a_cold_and_a_warm_run_says_the_caches_did_it(capsys: pytest.CaptureFixture) -> None:
    # the quickstart twice with one TORCHINDUCTOR_CACHE_DIR (torch 2.13, inductor): cold it compiles 8 graphs,
    # warm 6, as the caches serve backward graphs a cold run compiles lazily
    cold, warm = str(DATA / "cache-cold.jsonl"), str(DATA / "cache-warm.jsonl")
    assert cli.main(["diff", cold, warm]) == 0
    out = capsys.readouterr().out
    # one unit per line: the same frames compiled; the warm run loaded its backward graphs
    assert "frame compiles             6  ->  6" in out and "backward graphs            2  ->  0" in out
    assert "this is the caches' doing, not a code change" in out
    assert cli.main(["diff", cold, warm, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache_effect_only"] is True


def test_a_code_change_is_not_put_down_to_the_caches(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["diff", str(DATA / "cache-warm.jsonl"), str(DATA / "answers.jsonl")]) == 0
    assert "the caches' doing" not in capsys.readouterr().out


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


def test_random_bytes_are_no_telemetry_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "random.jsonl"
    path.write_bytes(bytes(range(1, 256)) * 100)  # no line break: it would look cut short if it were text
    assert cli.main(["summary", str(path)]) == 1
    err = capsys.readouterr().err
    assert "is not a telemetry-jit JSON Lines file (line 1: binary data)" in err and "cut short" not in err


def test_dash_reads_standard_input() -> None:
    with NEW.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "telemetry_jit", "summary", "-"], stdin=stdin, capture_output=True, text=True
        )
    assert done.returncode == 0 and "recompiles by cause" in done.stdout, done.stderr


def test_two_processes_claiming_one_rank_and_a_rank_beyond_the_job_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "a").mkdir()
    first, second = rank_copies(tmp_path / "a", 2)

    def rewritten(source: Path, target: Path, **fields: int) -> Path:
        records = [json.loads(line) for line in source.read_text().splitlines()]
        target.write_text("".join(json.dumps({**record, **fields}) + "\n" for record in records))
        return target

    (tmp_path / "b").mkdir()
    twin = rewritten(second, tmp_path / "b" / "run.rank1.jsonl", pid=4242)  # another process, the same rank
    assert cli.main(["summary", str(first), str(second), str(twin)]) == 0
    assert "rank 1 was written by two processes" in capsys.readouterr().err
    assert cli.main(["check", str(first), str(second), str(twin), "--max-recompiles", "100"]) == 2
    beyond = rewritten(NEW, tmp_path / "beyond.jsonl", rank=5, world_size=2)
    assert cli.main(["summary", str(beyond)]) == 0
    assert "rank 5 is no rank of a job of 2 ranks" in capsys.readouterr().err


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


def test_a_fix_measured_against_a_cold_run_says_the_caches_took_part(capsys: pytest.CaptureFixture) -> None:
    # the quickstart (torch 2.13, inductor, one epoch) with an empty compile cache, then with the fix it names
    # (drop_last=True) and the cache the first run filled: compile time fell for both reasons
    cold, fixed = str(DATA / "quickstart-cold-before-fix.jsonl"), str(DATA / "quickstart-warm-after-fix.jsonl")
    assert cli.main(["diff", cold, fixed]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the compile caches were not in the same state (hit rate 0% -> 100%)" in out
    assert "Recompiles and graph breaks are the change's" in out and "last_batch in train: 2" in out
    assert "this is the caches' doing" not in out  # the code changed too
    assert cli.main(["diff", cold, fixed, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["caches_differ"], said["cache_effect_only"]) == (True, False)
    for base, new in ((cold, cold), (str(DATA / "cache-cold.jsonl"), str(DATA / "cache-warm.jsonl"))):
        assert cli.main(["diff", base, new]) == 0
        assert "not in the same state" not in capsys.readouterr().out  # the same run; the caches' doing alone


def test_counts_of_one_are_said_in_the_singular() -> None:
    """Recorded by a fit, then validate(), test() and predict() of one compiled module (aot_eager, torch 2.13):
    one backward graph, no graph break."""
    (run,) = read_telemetry(DATA / "entry-points.jsonl")
    text = flat(format_summary(run))
    assert "compiled: 4 frame compiles (3 of them recompiles) and 1 backward graph, " in text
    assert "; 0 graph breaks" in text
    assert "1 recompile, " in text and "1 recompiles" not in text
    # fit's last validation and validate() after it ran at one step: named apart
    assert "first validation step (step 4): " in text and "first validate() step (step 8): " in text


def test_what_validate_compiled_is_named_validate_everywhere_and_fits_validation_stays_validation() -> None:
    """The same file: fit's validation recompiled for grad mode, validate() for inference mode. Each table row
    and the compile time outside the loop name the stage as the live console does (a validate() run's items
    said "in validation")."""
    (run,) = read_telemetry(DATA / "entry-points.jsonl")
    text = flat(format_summary(run))
    assert "(test() 0.12 s, validate() 0.06 s)" in text
    causes = {row.cause: row.stages for row in summarize(run).causes}
    assert causes["stage_switch"] == ["validate"] and causes["inference_mode"] == ["validate()"]
    assert re.search(r"stage_switch \(expected\) +validation ", text)
    assert re.search(r"inference_mode \(expected\) +validate\(\) ", text)


def test_an_errors_gist_is_its_first_paragraph_and_the_users_line() -> None:
    torch_error = (
        "Unsupported: Tensor.item\n  Explanation: the op needs the value\n\n  Hint: set capture_scalar_outputs\n\n"
        'from user code:\n   File "/home/me/train.py", line 40, in training_step\n    loss = self.net(x)\n'
        '  File "/home/me/net.py", line 15, in forward\n    if h.sum().item() > 1:\n\nSet TORCHDYNAMO_VERBOSE=1\n'
    )
    assert gist(torch_error) == (
        "Unsupported: Tensor.item Explanation: the op needs the value "
        "(at /home/me/net.py:15 in forward: `if h.sum().item() > 1:`)"
    )
    assert gist(torch_error + " (at train step 3)").endswith("`if h.sum().item() > 1:`; at train step 3)")
    assert gist("ValueError: a bug (at train step 5)") == "ValueError: a bug (at train step 5)"
    assert gist("x" * 1000, limit=50) == "x" * 47 + "..."
    in_torch = torch_error.replace("/home/me/net.py", "/venv/lib/python3.11/site-packages/torch/nn/modules/x.py")
    assert gist(in_torch).endswith(
        "(at /venv/lib/python3.11/site-packages/torch/nn/modules/x.py:15 in forward: `if h.sum().item() > 1:`, "
        "reached from your line /home/me/train.py:40 in "
        "training_step: `loss = self.net(x)`)"
    )


def test_a_fix_that_makes_the_batch_dynamic_is_told_fixed_and_its_missing_backward_graph_explained(
    capsys: pytest.CaptureFixture,
) -> None:
    """The runs of test_counts_of_one_are_said_in_the_singular, before and after the fix the summary named for
    test()'s smaller last batch (torch.compile(dynamic=True)), recorded on torch 2.13."""
    before, after = str(DATA / "entry-points.jsonl"), str(DATA / "entry-points-dynamic.jsonl")
    assert cli.main(["diff", before, after]) == 0
    out = flat(capsys.readouterr().out)
    assert "fixed recompiles: last_batch in eval: 1" in out
    assert "backward graphs 1 -> 0" in out and "has its backward compiled within its frame's compile" in out
    assert cli.main(["check", before, "--max-unexpected-recompiles", "0"]) == 1
    assert "1 recompilation beyond the expected price (last_batch in eval 1)" in flat(capsys.readouterr().out)
    assert cli.main(["check", after, "--baseline", before, "--max-unexpected-recompiles", "0"]) == 0
    assert cli.main(["diff", after, before]) == 0
    assert "has its backward compiled within" not in flat(capsys.readouterr().out)  # more backward graphs: no note


def test_fits_of_one_application_are_said_as_the_loops_they_are(capsys: pytest.CaptureFixture) -> None:
    """Recorded by a fit, a second fit of the same trainer to continue (max_epochs raised) and a new trainer's
    fit, in one process (aot_eager, torch 2.13): one application, three training loops, said together."""
    path = str(DATA / "three-fits.jsonl")
    (run,) = read_telemetry(path)
    text = flat(format_summary(run))
    assert "the 3 training loops: " in text and "of the 3 training loops' " in text
    assert "the training loop" not in text
    assert cli.main(["check", path, "--max-compile-share", "1%"]) == 1
    assert "% of the 3 training loops' wall time, more than the 1% allowed" in flat(capsys.readouterr().out)


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
