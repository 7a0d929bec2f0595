"""torch's own record of a run: what ``oracle.run`` kept in the process (``truth.json``: ``CompilationMetrics``,
dynamo's counters, the Lightning batch running at each moment) and what tlparse reads from its ``TORCH_TRACE``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ID = re.compile(r"(\d+)/(\d+)")


def frame_attempt(compile_id: str) -> tuple[int, int]:
    found = _ID.search(compile_id or "")
    return (int(found.group(1)), int(found.group(2))) if found else (-1, -1)


@dataclass
class Tlparse:
    """What tlparse found in the trace: each compile's metrics, its recompile reasons, its backward graphs."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    backward_metrics: list[dict[str, Any]] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)  # compile id -> torch's failed guards
    backward_graphs: list[str] = field(default_factory=list)  # compile ids with an aot_backward_graph artifact
    restarts: int = 0
    error: str = ""


def tlparse_program() -> str | None:
    """tlparse on PATH, or beside this Python (a virtual environment that is not activated)."""
    beside = Path(sys.executable).parent / "tlparse"
    return shutil.which("tlparse") or (str(beside) if beside.exists() else None)


def read_tlparse(trace: Path, out: Path) -> Tlparse:
    found = Tlparse()
    logs = sorted(trace.glob("*.log"))
    program = tlparse_program()
    if program is None or not logs:
        found.error = "no tlparse (pip install tlparse)" if logs else f"no TORCH_TRACE log in {trace}"
        return found
    done = subprocess.run(
        [program, *map(str, logs), "-o", str(out), "--no-browser", "--overwrite"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not (out / "raw.jsonl").exists():
        found.error = f"tlparse failed: {done.stderr[-500:]}"
        return found
    for line in (out / "raw.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "compilation_metrics" in record:
            found.metrics.append(record["compilation_metrics"])
        if "bwd_compilation_metrics" in record:
            found.backward_metrics.append(record["bwd_compilation_metrics"])
    directory = json.loads((out / "compile_directory.json").read_text())
    for key, entry in directory.items():
        compile_id = key.strip("[]")
        if "_" in compile_id.split("/")[-1] and not compile_id.endswith("_0"):
            found.restarts += 1
        for artifact in entry.get("artifacts", []):
            name = artifact["name"]
            if name.startswith("aot_backward_graph"):
                found.backward_graphs.append(compile_id)
            if name.startswith("recompile_reasons"):
                found.reasons[compile_id] = _reasons((out / artifact["url"]).read_text())
    return found


def _reasons(text: str) -> list[str]:
    """tlparse 0.4 writes the artifact's payload as torch logged it: a JSON list, or the reason's bare text."""
    try:
        reasons = json.loads(text)
    except ValueError:
        return [text]
    return [str(reason) for reason in reasons] if isinstance(reasons, list) else [str(reasons)]


@dataclass
class Truth:
    """One run as torch and Lightning had it."""

    raw: dict[str, Any]
    tlparse: Tlparse

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return self.raw["metrics"]

    @property
    def frames(self) -> list[dict[str, Any]]:
        """Frame compiles (dynamo), in order."""
        return [metric for metric in self.metrics if metric["is_forward"] is not False]

    @property
    def backwards(self) -> list[dict[str, Any]]:
        """Backward graphs compiled lazily, at the first backward."""
        return [metric for metric in self.metrics if metric["is_forward"] is False]

    @property
    def recompiles(self) -> list[dict[str, Any]]:
        return [metric for metric in self.frames if frame_attempt(metric["compile_id"])[1] > 0]

    @property
    def graph_breaks(self) -> int:
        return sum(self.raw["counters"]["graph_break"].values())

    @property
    def restarts(self) -> int:
        """Compiles torch restarted (a graph break, or a break it could not resume from), by its own metrics."""
        return sum(bool(metric["restart_reasons"]) for metric in self.frames)

    @property
    def fell_back(self) -> bool:
        return bool(self.raw["recompile_limit_warnings"]) or any(metric["fail_type"] for metric in self.frames)

    def batch_at(self, time_us: int) -> dict[str, Any] | None:
        """The Lightning batch running at ``time_us`` (torch's clock), if any."""
        for batch in self.raw["batches"]:
            if batch["start_us"] <= time_us <= batch.get("end_us", batch["start_us"]):
                return batch
        return None

    def call_at(self, time_us: int) -> str:
        for call in self.raw["calls"]:
            if call["start_us"] <= time_us <= call.get("end_us", time_us):
                return str(call["call"])
        return ""

    def stage_at(self, time_us: int) -> str:
        """Lightning's stage, as the compilation span's ``train.stage`` names it (``validate`` for
        ``Trainer.validate`` run by itself as well: the summary's ``validate()`` is ``judge._fallback_stage``'s)."""
        batch = self.batch_at(time_us)
        if batch is None:
            return f"outside batches ({self.call_at(time_us) or 'no call'})"
        return str(batch["stage"])

    def reason_lines(self, metric: dict[str, Any]) -> list[str]:
        """Every failed guard torch names for this recompile: its metric's text and tlparse's artifact."""
        lines = [line.strip() for line in (metric["recompile_reason"] or "").splitlines() if line.strip()]
        lines += [
            line.strip() for text in self.tlparse.reasons.get(metric["compile_id"], []) for line in text.splitlines()
        ]
        return [line for line in lines if line]


def read_truth(out: Path) -> Truth:
    raw = json.loads((out / "truth.json").read_text())
    return Truth(raw, read_tlparse(out / "trace", out / "tlparse"))
