"""What compiling cost the host over a run, from its ``compilation`` spans: each compile's CPU seconds and
resident memory, the run's total and peak, and the compiles that neared the memory the process may use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.runs import SpanRecord
from telemetry_jit.records import CompileResources, mb, near_limit_words
from telemetry_jit.schema import CompileAttr, ResourceAttr
from telemetry_jit.terminal import counted, frame_shown


@dataclass(frozen=True)
class CompileCost:
    """One compilation and what it cost the host."""

    compile_id: str
    frame: str  # "forward (model.py:12)"
    trigger: str
    duration_s: float
    resources: CompileResources

    @property
    def label(self) -> str:
        backward = "backward of " if self.trigger == "lazy_backward" else ""
        return f"{backward}{self.frame} [{self.compile_id}]"

    def as_json(self) -> dict[str, Any]:
        r = self.resources
        return {
            "compile_id": self.compile_id,
            "frame": self.frame,
            "trigger": self.trigger,
            "duration_s": round(self.duration_s, 3),
            "peak_host_mb": _mb(r.host_peak_bytes),
            "host_rss_mb": _mb(r.host_rss_bytes),
            "cpu_s": round(r.cpu_s, 3),
            "worker_cpu_s": round(r.worker_cpu_s, 3),
            "device_peak_mb": _mb(r.device_peak_bytes) if r.device_peak_bytes is not None else None,
            "near_memory_limit": r.near_limit,
        }


MAX_LISTED = 1000  # compiles listed one by one; the totals count every one


@dataclass
class RunResources:
    """Every measured compile of a run, folded a span at a time (the first :data:`MAX_LISTED` listed)."""

    compiles: list[CompileCost] = field(default_factory=list)
    measured: int = 0
    cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    largest: CompileCost | None = None  # the compile whose host memory grew most
    highest: CompileCost | None = None  # the compile during which the process and its children held the most
    near_limit: list[CompileCost] = field(default_factory=list)
    device: CompileCost | None = None  # the compile whose device memory grew most

    def add(self, span: SpanRecord) -> None:
        """One ``compilation`` span (nothing where it holds no resources: an older file, not Linux)."""
        if ResourceAttr.CPU_S not in span.attributes:
            return
        resources = CompileResources.from_attributes(span.attributes)
        attributes = span.attributes
        cost = CompileCost(
            compile_id=str(attributes.get(CompileAttr.ID) or ""),
            frame=frame_shown(attributes.get(CompileAttr.FRAME), attributes.get(CompileAttr.LOCATION)),
            trigger=str(attributes.get(CompileAttr.TRIGGER) or ""),
            duration_s=(span.compile_ms or 0.0) / 1000,
            resources=resources,
        )
        self.measured += 1
        self.cpu_s += resources.cpu_s
        self.worker_cpu_s += resources.worker_cpu_s
        if len(self.compiles) < MAX_LISTED:
            self.compiles.append(cost)
        if self.largest is None or resources.host_peak_bytes > self.largest.resources.host_peak_bytes:
            self.largest = cost
        if self.highest is None or resources.host_rss_bytes > self.highest.resources.host_rss_bytes:
            self.highest = cost
        if resources.near_limit and len(self.near_limit) < MAX_LISTED:
            self.near_limit.append(cost)
        if resources.device_peak_bytes and (
            self.device is None or resources.device_peak_bytes > (self.device.resources.device_peak_bytes or 0)
        ):
            self.device = cost

    def as_json(self) -> dict[str, Any] | None:
        """``summary --json``'s ``compile_resources``; ``None`` where no compile was measured."""
        if self.largest is None or self.highest is None:
            return None
        highest = self.highest.resources
        device = self.device.resources.device_peak_bytes if self.device is not None else None
        return {
            "peak_host_mb": _mb(self.largest.resources.host_peak_bytes),
            "cpu_s": round(self.cpu_s, 3),
            "worker_cpu_s": round(self.worker_cpu_s, 3),
            "peak_host_rss_mb": _mb(highest.host_rss_bytes),
            "peak_device_mb": _mb(device) if device else None,
            "memory_limit_mb": _mb(highest.limit_bytes) if highest.limit_bytes else None,
            "memory_limit_source": highest.limit_source or None,
            "near_memory_limit": [c.compile_id for c in self.near_limit],
            "compiles_measured": self.measured,
            "compiles": [c.as_json() for c in self.compiles],
        }

    def lines(self) -> list[str]:
        """The summary's words: the total, the largest compile, and a warning where one neared the limit."""
        if self.largest is None or self.highest is None:
            return []
        workers = (
            f" ({self.worker_cpu_s:.1f} s of it in compile workers and compilers)" if self.worker_cpu_s >= 0.05 else ""
        )
        largest, highest = self.largest, self.highest.resources
        of_limit = f" of the {mb(highest.limit_bytes)} it may use" if highest.limit_bytes else ""
        lines = [
            f"compile resources: {self.cpu_s:.1f} s of CPU over {counted(self.measured, 'compile')}{workers}; "
            f"host memory +{mb(largest.resources.host_peak_bytes)} at most, in {largest.label} (the process and its "
            f"compile workers at {mb(highest.host_rss_bytes)}{of_limit})"
        ]
        if self.device is not None:
            top = self.device
            lines.append(f"compile device memory: +{mb(top.resources.device_peak_bytes or 0)} at most, in {top.label}")
        if self.near_limit:
            worst = max(self.near_limit, key=lambda c: c.resources.host_rss_bytes).resources
            lines.append(
                f"compile memory: {counted(len(self.near_limit), 'compile')} neared the memory limit: "
                + near_limit_words(worst.host_rss_bytes, worst.limit_bytes, worst.limit_source, None)
            )
        return lines


def _mb(size: float) -> float:
    return round(size / 2**20, 1)
