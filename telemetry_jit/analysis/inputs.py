"""What the commands read: files and folders (their ``*.jsonl``) of telemetry files, and which run of each to
show: the last started (never an older one that looks better), with a note on how to pick another."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from telemetry_jit.analysis.reader import ITERATION_SPANS, TelemetryFileError, TelemetryRun, read_telemetry
from telemetry_jit.identity import short_run_id
from telemetry_jit.schema import RANK_FILE


@dataclass
class Loaded:
    runs: list[TelemetryRun] = field(default_factory=list)  # the runs to show, in rank order within a file set
    paths: list[Path] = field(default_factory=list)  # the files read
    notes: list[str] = field(default_factory=list)  # what the user should know about the choice of runs
    errors: list[str] = field(default_factory=list)  # files that could not be read, each said
    doubtful_ranks: list[str] = field(default_factory=list)  # ranks that cannot be what they claim, each said
    concurrent: list[str] = field(default_factory=list)  # files written by several processes at once, each said


def _rank_order(path: Path) -> tuple[str, int]:
    match = RANK_FILE.search(path.name)
    return (path.name[: match.start()] if match else path.stem, int(match.group(1)) if match else -1)


def load(
    arguments: Sequence[str | Path], *, all_runs: bool = False, run_id: str | None = None, digest: bool = True
) -> Loaded:
    """Read the files ``arguments`` name: of each, its last run, every run, or the run whose id starts
    with ``run_id``. Per-iteration spans are not kept (the analysis needs none of them)."""
    loaded = Loaded()
    for path in map(Path, arguments):  # a folder: the *.jsonl files in it, rank files in rank order
        loaded.paths += sorted(path.glob("*.jsonl"), key=_rank_order) if path.is_dir() else [path]
    if not loaded.paths:
        loaded.errors.append(f"no telemetry file in {', '.join(map(str, arguments))}")
    held: dict[Path, list[TelemetryRun]] = {}
    for path in loaded.paths:
        try:
            runs = held[path] = read_telemetry(path, skip_spans=ITERATION_SPANS, digest=digest)
        except (FileNotFoundError, TelemetryFileError, OSError) as error:
            loaded.errors.append(str(error))
            continue
        ids = ", ".join(short_run_id(run.run_id) for run in runs)
        if run_id is not None:
            chosen = [run for run in runs if run.run_id.startswith(run_id)]
            if not chosen:
                loaded.errors.append(f"{path} holds no run {run_id!r} (it holds {ids})")
            loaded.runs.extend(chosen[-1:])
        elif all_runs or len(runs) == 1:
            loaded.runs.extend(runs)
        else:
            # the last started (its first record is the file's last first record): the run the user just ran,
            # finished or not, never an older one that looks better
            loaded.runs.append(runs[-1])
            loaded.notes.append(
                f"{path} holds {len(runs)} runs ({ids}); showing the last started (--all-runs for all, --run ID for "
                "one)"
            )
        if run_id is None and (at_once := written_at_once(runs)):
            which = ", ".join(f"run {short_run_id(run.run_id)} (pid {run.pid})" for run in at_once)
            loaded.concurrent.append(
                f"{path} holds runs of {len(at_once)} processes written at the same time ({which}): two processes "
                "wrote one file, so which run is yours cannot be told; give each process its own file, or pick one "
                "with --run ID"
            )
    if run_id is None and not all_runs:
        _one_job_per_rank_set(loaded, held)
    loaded.doubtful_ranks = rank_problems(loaded.runs)
    loaded.notes += loaded.doubtful_ranks + loaded.concurrent
    return loaded


def _one_job_per_rank_set(loaded: Loaded, held: dict[Path, list[TelemetryRun]]) -> None:
    """Of the rank files of one name (``t.rank0.jsonl``, ...), show the ranks of the newest job; a rank file holding
    no run of it is an earlier job's: said and left out, never read as a rank of this job."""
    sets: dict[tuple[Path, str], list[Path]] = {}
    instead: dict[int, TelemetryRun | None] = {}  # id of a run of another job -> its file's run of the job
    for path in held:
        if RANK_FILE.search(path.name):
            sets.setdefault((path.parent, _rank_order(path)[0]), []).append(path)
    for paths in sets.values():
        every = [run for path in paths for run in held[path]]
        if len(paths) < 2 or len({run.run_id for run in every}) < 2:
            continue
        job = max(every, key=lambda run: run.first_unix_ns).run_id
        for path in paths:
            of_job = [run for run in held[path] if run.run_id == job]
            if not of_job and held[path]:
                loaded.notes.append(
                    f"{path} holds no run of job {short_run_id(job)}, the newest in its rank files: an earlier "
                    "job's rank file, left out (--run ID picks a job)"
                )
            # the file's shown run, where another job's: in place by this job's run of the file, or left out
            instead.update({id(run): of_job[-1] if of_job else None for run in held[path] if run.run_id != job})
    shown = (instead.get(id(run), run) for run in loaded.runs)
    loaded.runs = [run for run in shown if run is not None]


def written_at_once(runs: Sequence[TelemetryRun]) -> list[TelemetryRun]:
    """The runs of ``runs`` (one file's) whose lines interleave with another's: processes that wrote at once."""
    at_once: dict[int, TelemetryRun] = {}
    reaching: TelemetryRun | None = None  # of the runs begun so far, the one whose lines reach furthest
    for run in sorted(runs, key=lambda run: run.first_line):
        if reaching is not None and run.first_line < reaching.last_line:
            at_once[id(reaching)], at_once[id(run)] = reaching, run
        if reaching is None or run.last_line > reaching.last_line:
            reaching = run
    return sorted(at_once.values(), key=lambda run: run.first_line)


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
