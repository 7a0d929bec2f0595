"""A warm start's residual: for a run whose compile caches served every graph, the compile time that remains,
in phases that add up to it (torch's own timers on each ``compilation`` span), and which torch feature would
remove which part on the torch that recorded the run (docs/cold-starts.md, "What a warm start still costs")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.runs import SpanRecord, TelemetryRun, number
from telemetry_jit.schema import CompileAttr, JitEventName

PHASE_WORDS = {
    "dynamo_tracing": "dynamo tracing",
    "guards": "building guards",
    "cache_load": "cache loads",
    "kernel_load": "kernel loads",
    "recompiles": "recompiles",
    "rest": "the rest",
}


@dataclass
class Residual:
    """Compile seconds by phase, folded one ``compilation`` span at a time (frame compiles of the first attempt:
    a recompile's time is its own phase, whatever it spent it on)."""

    total_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CompileAttr.WARM_PHASES, 0.0))
    recompiles_s: float = 0.0
    timed: bool = False  # some span carried torch's timers (a file from before, another torch: not)

    def add(self, span: SpanRecord) -> None:
        attributes = span.attributes
        seconds = (span.compile_ms or 0.0) / 1000
        self.total_s += seconds
        if attributes.get(CompileAttr.IS_RECOMPILE):
            self.recompiles_s += seconds
            return
        for phase in CompileAttr.WARM_PHASES:
            name = CompileAttr.phase_time(phase)
            if name in attributes:
                self.timed = True
                self.phases_s[phase] += number(attributes[name])

    def breakdown(self) -> dict[str, float]:
        """Seconds by phase, the rest what torch's timers did not cover: they add up to :attr:`total_s`."""
        phases = {phase: round(seconds, 3) for phase, seconds in self.phases_s.items()}
        phases["recompiles"] = round(self.recompiles_s, 3)
        phases["rest"] = round(max(self.total_s - sum(self.phases_s.values()) - self.recompiles_s, 0.0), 3)
        return phases


def torch_features(run: TelemetryRun) -> list[str] | None:
    """What the recording torch offered (``compile_summary``'s ``compile.torch_features``); ``None``: not said."""
    for event in run.events(JitEventName.COMPILE_SUMMARY):
        if CompileAttr.TORCH_FEATURES in event.attributes:
            return [str(name) for name in event.attributes[CompileAttr.TORCH_FEATURES] or ()]
    return None


def removable_by(residual: Residual, features: list[str] | None, saved_s: float) -> list[dict[str, Any]]:
    """Each feature of torch against the residual, with what it would save of it on this run and what it needs."""
    phases = residual.breakdown()
    has = (lambda name: name in features) if features is not None else (lambda name: True)
    return [
        {
            "feature": "AOT compile: torch.compile(model).aot_compile(...) once, torch.compiler.load_compiled_function "
            "at the start",
            "available": has("aot_compile"),
            "removes": ["dynamo_tracing", "guards", "cache_load"],
            "saves_s": round(phases["dynamo_tracing"] + phases["guards"] + phases["cache_load"], 3),
            "note": "the saved function is loaded whole instead of traced and looked up (its guards and graphs with "
            "it); its kernels are still loaded. It needs a graph without breaks (fullgraph)",
        },
        {
            "feature": 'torch.compiler.set_stance("eager_on_recompile")',
            "available": has("set_stance"),
            "removes": ["recompiles"],
            "saves_s": phases["recompiles"],
            "note": "recompiles are not compiled: those calls run eagerly (slower steps)",
        },
        {
            "feature": "mega-cache: torch.compiler.save_cache_artifacts / load_cache_artifacts",
            "available": has("cache_artifacts"),
            "removes": [],
            "saves_s": 0.0,
            "note": f"nothing on this start: every graph came from the cache; on a machine whose cache is empty it "
            f"makes the start this warm (torch measured {saved_s:.1f} s saved by the cache here)",
        },
        {
            "feature": "none: paid once per process",
            "available": True,
            "removes": ["kernel_load", "rest"],
            "saves_s": 0.0,
            "note": "loading compiled kernels and dynamo's own start-up are paid by every new process; a process "
            "that lives on (a notebook, a long-lived worker) pays them once",
        },
    ]


def warm_start_json(run: TelemetryRun, residual: Residual, hits: int, misses: int, saved_s: float) -> Any:
    """``summary --json``'s ``warm_start``: ``null`` unless the caches served every graph (hits, no misses)."""
    if not hits or misses or not residual.timed:
        return None
    return {
        "compile_s": round(residual.total_s, 3),
        "phases": residual.breakdown(),
        "removable_by": removable_by(residual, torch_features(run), saved_s),
    }


def warm_start_lines(residual: Residual, hits: int, misses: int) -> list[str]:
    """``warm start: ... compiling still took 3.1 s: kernel loads 2.4 s, ...`` (none unless warm)."""
    if not hits or misses or not residual.timed:
        return []
    phases = sorted(residual.breakdown().items(), key=lambda item: -item[1])
    said = ", ".join(f"{PHASE_WORDS[phase]} {seconds:.2f} s" for phase, seconds in phases if seconds >= 0.005)
    return [
        f"warm start: every graph came from the compile cache, and compiling still took {residual.total_s:.2f} s: "
        f"{said} (what removes which: summary --json warm_start, docs/cold-starts.md)"
    ]
