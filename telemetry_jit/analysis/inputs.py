"""What the commands read: files and folders of telemetry files, and which run of each to show.

A folder stands for the telemetry files in it (``*.jsonl``, rank files included). A file the exporter
appended to several times holds several runs: the last is shown, and a note says so and how to pick
another (``--all-runs``, ``--run ID``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from telemetry_jit.analysis.reader import ITERATION_SPANS, TelemetryFileError, TelemetryRun, read_telemetry
from telemetry_jit.identity import short_run_id
from telemetry_jit.schema import RANK_FILE, JitSpanName, TrainingSpanName


@dataclass
class Loaded:
    runs: list[TelemetryRun] = field(default_factory=list)  # the runs to show, in rank order within a file set
    paths: list[Path] = field(default_factory=list)  # the files read
    notes: list[str] = field(default_factory=list)  # what the user should know about the choice of runs
    errors: list[str] = field(default_factory=list)  # files that could not be read, each said
    doubtful_ranks: list[str] = field(default_factory=list)  # ranks that cannot be what they claim, each said


def expand(arguments: Sequence[str | Path]) -> list[Path]:
    """Files as given; a folder as the ``*.jsonl`` files in it, rank files in rank order."""
    paths: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            paths.extend(sorted(path.glob("*.jsonl"), key=_rank_order))
        else:
            paths.append(path)
    return paths


def _rank_order(path: Path) -> tuple[str, int]:
    match = RANK_FILE.search(path.name)
    return (path.name[: match.start()] if match else path.stem, int(match.group(1)) if match else -1)


def load(
    arguments: Sequence[str | Path],
    *,
    all_runs: bool = False,
    run_id: str | None = None,
    skip_spans: Collection[str] = ITERATION_SPANS,
    digest: bool = True,
) -> Loaded:
    """Read the files ``arguments`` name: of each, its last run, every run, or the run whose id starts
    with ``run_id``. Per-iteration spans are not kept (the analysis needs none of them)."""
    loaded = Loaded(paths=expand(arguments))
    if not loaded.paths:
        loaded.errors.append(f"no telemetry file in {', '.join(map(str, arguments))}")
    for path in loaded.paths:
        try:
            runs = read_telemetry(path, skip_spans=skip_spans, digest=digest)
        except (FileNotFoundError, TelemetryFileError, OSError) as error:
            loaded.errors.append(str(error))
            continue
        if run_id is not None:
            chosen = [run for run in runs if run.run_id.startswith(run_id)]
            if not chosen:
                ids = ", ".join(short_run_id(run.run_id) for run in runs)
                loaded.errors.append(f"{path} holds no run {run_id!r} (it holds {ids})")
            loaded.runs.extend(chosen[-1:])
        elif all_runs or len(runs) == 1:
            loaded.runs.extend(runs)
        else:
            # the last run that trained: a process that recorded nothing of a loop is never shown over one that did
            shown = ([run for run in runs if trained(run)] or runs)[-1]
            loaded.runs.append(shown)
            ids = ", ".join(short_run_id(run.run_id) for run in runs)
            which = "the last" if shown is runs[-1] else f"the last that trained ({short_run_id(shown.run_id)})"
            loaded.notes.append(
                f"{path} holds {len(runs)} runs ({ids}); showing {which} (--all-runs for all, --run ID for one)"
            )
    loaded.doubtful_ranks = rank_problems(loaded.runs)
    loaded.notes += loaded.doubtful_ranks
    return loaded


def trained(run: TelemetryRun) -> bool:
    """Whether the run recorded a loop (training, validation, test) or a compilation."""
    return bool(run.digest and run.digest.compilations) or any(span.name in _LOOPS for span in run.spans.values())


_LOOPS = frozenset(
    (
        TrainingSpanName.TRAINING_LOOP,
        TrainingSpanName.VALIDATION_LOOP,
        TrainingSpanName.TESTING_LOOP,
        JitSpanName.COMPILATION.value,
    )
)


def rank_problems(runs: Sequence[TelemetryRun]) -> list[str]:
    """Ranks that cannot be what they claim: one rank of a run written by two processes, or a rank beyond
    its job's size."""
    problems = []
    seen: dict[tuple[str, int], TelemetryRun] = {}
    for run in runs:
        if run.rank >= run.world_size > 1 or run.rank < 0:
            problems.append(
                f"run {short_run_id(run.run_id)}: rank {run.rank} is no rank of a job of {run.world_size} ranks "
                "(its launcher's rank variables were wrong)"
            )
        other = seen.get((run.run_id, run.rank))
        if other is not None and other.pid != run.pid:
            problems.append(
                f"run {short_run_id(run.run_id)}: rank {run.rank} was written by two processes (pids {other.pid} and "
                f"{run.pid}); the later is shown, and a comparison of ranks cannot tell which is the rank"
            )
        seen[(run.run_id, run.rank)] = run
    return problems
