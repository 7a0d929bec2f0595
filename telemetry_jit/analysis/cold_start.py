"""Why a run started cold where another started warm: each graph the new run missed in the compile cache, explained
by the parts of torch's cache key (recorded with each ``cache_lookup``) whose hashes differ; a graph is the same in
two runs when it is the same frame's (name and file, not line) n-th look-up in one cache. And what a warm start
still costs: its compile time by phase (torch's timers), which torch feature removes which (docs/cold-starts.md)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from telemetry_jit.analysis.runs import SpanRecord, TelemetryRun, add_new, number
from telemetry_jit.schema import CacheAttr, CompileAttr, JitEventName
from telemetry_jit.terminal import counted

MAX_GRAPHS = 5000  # look-ups kept per run
Parts = dict[str, tuple[str, str]]  # name -> (hash, value)
GraphId = tuple[str, str, str, int]  # frame and file (not the line), trigger, cache layer, n-th look-up there


@dataclass
class CacheLookupSaid:
    """One graph's look-up in one cache, as a run recorded it."""

    frame: str
    compile_id: str
    step: str
    layer: str
    state: str
    key: str
    parts: Parts
    settings: str
    loaded: bool = False  # a hit served by artifacts loaded with torch.compiler.load_cache_artifacts


@dataclass
class CacheLedger:
    """A run's compile-cache look-ups, in the order they happened, and its tables of settings parts."""

    lookups: dict[GraphId, CacheLookupSaid] = field(default_factory=dict)
    tables: dict[str, Parts] = field(default_factory=dict)
    # compile seconds by compile id, backward included: the first MAX_GRAPHS ids, and every id a kept look-up names
    seconds: dict[str, float] = field(default_factory=dict)
    loaded_hits: int = 0  # hits served by artifacts loaded with torch.compiler.load_cache_artifacts
    _seen: Counter[tuple[str, str, str]] = field(default_factory=Counter, repr=False)

    def add(self, span: SpanRecord, frame: str, trigger: str, compile_id: str, step: str) -> None:
        events = [event for event in span.events if event.name == JitEventName.CACHE_LOOKUP]
        if compile_id in self.seconds or len(self.seconds) < MAX_GRAPHS or (events and len(self.lookups) < MAX_GRAPHS):
            self.seconds[compile_id] = self.seconds.get(compile_id, 0.0) + (span.compile_ms or 0.0) / 1000
        for event in events:
            attributes = event.attributes
            loaded, state = bool(attributes.get(CacheAttr.LOADED)), str(attributes.get(CacheAttr.STATE) or "")
            self.loaded_hits += loaded and state == "hit"
            if len(self.lookups) >= MAX_GRAPHS:
                continue  # look-ups (and the tables they name) counted while they are kept
            settings = str(attributes.get(CacheAttr.SETTINGS) or "")
            if CacheAttr.SETTINGS_PARTS in attributes and settings not in self.tables:
                self.tables[settings] = _parts(attributes[CacheAttr.SETTINGS_PARTS])
            layer, key = str(attributes.get(CacheAttr.LAYER) or ""), str(attributes.get(CacheAttr.KEY) or "")
            code = without_line(frame)
            self._seen[(code, trigger, layer)] += 1
            n, parts = self._seen[(code, trigger, layer)] - 1, _parts(attributes.get(CacheAttr.PARTS) or ())
            self.lookups[(code, trigger, layer, n)] = CacheLookupSaid(
                frame, compile_id, step, layer, state, key, parts, settings, loaded
            )

    def explained(self) -> Iterable[tuple[GraphId, CacheLookupSaid]]:
        """The look-ups that stand for a graph: AOTAutograd's (its entry holds the backward too), else inductor's;
        by layer, not order (torch 2.8 says inductor's first)."""
        used = {
            lookup.compile_id
            for lookup in self.lookups.values()
            if lookup.layer == "aot_autograd" and lookup.state != "bypass"
        }
        for graph, lookup in self.lookups.items():
            if (lookup.layer == "aot_autograd") == (lookup.compile_id in used):
                yield graph, lookup

    def full_parts(self, lookup: CacheLookupSaid) -> Parts:
        return {**self.tables.get(lookup.settings, {}), **lookup.parts}


@dataclass(frozen=True)
class Change:
    """One part of a key that differs between the runs."""

    name: str
    base: str  # the base run's value ("" where torch's value is long or not text: only its hash is kept)
    new: str

    @property
    def kind(self) -> str:
        head = self.name.split("[", 1)[0]
        if self.name == "gm":
            return "graph"
        if self.name == "gm[process_groups]":
            return "process_group"
        if head == "example_inputs":
            return "model" if "parameter " in (self.base + self.new) else "input"
        if _torch_state(self.name):
            return "state"
        if "config" in head:
            return "setting"
        if "version" in self.name:
            return "version"
        return "machine" if head == "system_info" else "other"

    @property
    def subject(self) -> str:
        """What changed, in the user's terms: one knob may be several parts (``torch.use_deterministic_algorithms``
        is three)."""
        return _torch_state(self.name) or _NAMES[self.kind].format(_named(self.name))

    @property
    def words(self) -> str:
        base, new = _tensor_words(self.base, self.new)
        if self.name.startswith("autocast_state["):
            base, new = _autocast_words(base), _autocast_words(new)
        return f"{self.subject}: {base} -> {new}" if base or new else self.subject


@dataclass
class MissGroup:
    """Graphs that missed for one reason."""

    reason: str
    fix: str
    graphs: int = 0
    seconds: float = 0.0
    frames: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)  # the first graph's changed parts

    def as_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "changes": [{"part": change.name, "base": change.base, "new": change.new} for change in self.changes],
            "fix": self.fix,
            "graphs": self.graphs,
            "compile_s": round(self.seconds, 3),
            "frames": self.frames,
            "steps": self.steps,
        }


@dataclass
class ColdStart:
    """The new run's misses of graphs the base run compiled or loaded, grouped by reason, costliest first."""

    groups: list[MissGroup]
    base_has_lookups: bool
    new_has_lookups: bool

    @property
    def graphs(self) -> int:
        return sum(group.graphs for group in self.groups)

    @property
    def seconds(self) -> float:
        return sum(group.seconds for group in self.groups)

    def as_json(self) -> dict[str, Any]:
        return {
            "missed_graphs": self.graphs,
            "compile_s": round(self.seconds, 3),
            "reasons": [group.as_json() for group in self.groups],
            "recorded": {"base": self.base_has_lookups, "new": self.new_has_lookups},
        }


def explain(base: CacheLedger, new: CacheLedger) -> ColdStart:
    """Why ``new`` missed what ``base`` had: for each graph ``new`` missed whose counterpart ``base`` compiled
    (a miss, its entry then written) or loaded (a hit)."""
    groups: dict[str, MissGroup] = {}
    timed: set[str] = set()  # compile ids whose seconds are counted: one compile's, however many graphs it missed
    for graph, lookup in new.explained():
        if lookup.state != "miss":
            continue
        before = base.lookups.get(graph)
        found: list[Change] = []
        if before is None:
            if not base.lookups:
                continue  # the base run recorded no look-ups: nothing to compare with
            reason, fix = "a graph the base run did not compile (new code or a new input)", _FIX["new"]
        elif before.state == "bypass":
            continue  # the base run did not cache it either
        elif before.key == lookup.key:
            reason, fix = (_LOADED, _FIX["loaded"]) if before.loaded else (_SAME_KEY, _FIX["same_key"])
        else:
            found = changes(base.full_parts(before), new.full_parts(lookup))
            reason, fix = _reason(found)
        group = groups.setdefault(reason, MissGroup(reason, fix, changes=found[:10]))
        group.graphs += 1
        if lookup.compile_id not in timed:
            timed.add(lookup.compile_id)
            group.seconds += new.seconds.get(lookup.compile_id, 0.0)
        add_new(group.frames, lookup.frame, 5)
        add_new(group.steps, lookup.step, 5)
    return ColdStart(sorted(groups.values(), key=lambda group: -group.seconds), bool(base.lookups), bool(new.lookups))


# the fixes that put a miss down to a change of the user's code, model or data: where only a torch.compile option
# changed between the runs, that option is what changed (dynamic=True traces other graphs, with symbolic sizes)
CODE_FIXES = ("new", "graph", "model", "input")


def option_changed(groups: list[MissGroup], options: list[str]) -> None:
    """``groups`` whose fix says the code or data changed, told instead that ``options`` (``dynamic: False ->
    True``) changed; the other groups as they are."""
    said = {_FIX[key] for key in CODE_FIXES}
    for group in groups:
        if group.fix in said:
            group.fix = (
                f"the torch.compile option {' and '.join(options)} changed between the runs, and torch compiles "
                "other graphs under it (the caches are keyed by them): nothing to fix if you changed it on purpose; "
                "the next run with it starts warm"
            )


def changes(base: Parts, new: Parts) -> list[Change]:
    """The parts whose hashes differ (or that one key has and the other lacks), what explains the rest first: a
    release, the machine, the graph's code, the model, the inputs, the settings."""
    found = [
        Change(name, base.get(name, ("", ""))[1], new.get(name, ("", ""))[1])
        for name in sorted(base.keys() | new.keys())
        if base.get(name, ("",))[0] != new.get(name, ("",))[0]
    ]
    return sorted(found, key=lambda change: list(_NAMES).index(change.kind))


_SAME_KEY = "the same key as in the base run, but the entry was not in this run's cache"
_LOADED = (
    "the same key as in the base run, which had it from the cache artifacts it loaded "
    "(torch.compiler.load_cache_artifacts); this run did not load them"
)
_FIX = {
    "loaded": (
        "load the same artifacts before the first compile, as the base run did (torch.compiler.load_cache_artifacts "
        "with the bytes torch.compiler.save_cache_artifacts() gave), or let the jobs share one TORCHINDUCTOR_CACHE_DIR"
    ),
    "same_key": (
        "let the jobs share one cache: the same TORCHINDUCTOR_CACHE_DIR on a disk every job reads (it defaults to "
        "a folder under /tmp, per user and machine), or save it with torch.compiler.save_cache_artifacts() and "
        "load it with torch.compiler.load_cache_artifacts() before the first compile"
    ),
    "new": "nothing to fix if the code or the data changed on purpose; the next run with it starts warm",
    "graph": "nothing to fix if you changed the model on purpose; the next run with this code starts warm",
    "model": "nothing to fix if you changed the model on purpose; the next run with these sizes starts warm",
    "input": (
        "feed the same dtypes and shapes as the run that filled the cache, or compile for changing sizes "
        "(torch.compile(dynamic=True)); a new dtype or layout needs its own compile once"
    ),
    "setting": "keep the setting as it was when the cache was filled (the cache is keyed by it), or fill it once",
    "state": (
        "nothing to fix if you changed it on purpose: the next run with it starts warm; otherwise set it as the run "
        "that filled the cache did (the cache is keyed by it)"
    ),
    "version": "pin torch and triton across jobs: every release keys its own cache entries",
    "process_group": (
        "make the same process groups in the same order in every job before compiling (torch names a group by the "
        "order it was made in, and the name is part of the graph), or compile collectives on the default group"
    ),
    "machine": "compile on the kind of machine that runs the job: the cache is keyed by the device and its driver",
    "other": "keep it as it was when the cache was filled, or accept one cold start",
}
_NAMES = {  # each kind of part, in the order that explains the rest first: a new release changes the rest too
    "version": "{} changed",
    "machine": "{}",
    "process_group": "the process group's name baked into the graph's collectives",
    "graph": "the graph itself changed (the code dynamo traced)",
    "model": "a parameter's shape or dtype ({})",
    "input": "an input's dtype, shape or layout ({})",
    "state": "{}",  # named by the call that sets it: _TORCH_STATE
    "setting": "setting {}",
    "other": "key part {}",
}


def without_line(frame: str) -> str:
    """``forward (model.py:55)`` -> ``forward (model.py)``: a line added above a frame, or another torch release
    moving its own code, leaves it the same frame."""
    return re.sub(r":\d+\)$", ")", frame)


# torch's global state at compile time, which the caches key by, named by the call that sets it
_DETERMINISTIC = (
    "deterministic algorithms (torch.use_deterministic_algorithms, which Trainer(deterministic=True) calls)"
)
_TORCH_STATE = {
    "deterministic_algorithms": _DETERMINISTIC,
    "deterministic_algorithms_settings": _DETERMINISTIC,
    "inductor_config[deterministic]": _DETERMINISTIC,  # torch.use_deterministic_algorithms sets it too
    "cuda_matmul_settings": (
        "the float32 matmul precision (torch.set_float32_matmul_precision, torch.backends.cuda.matmul.allow_tf32)"
    ),
    "autocast_state": "autocast on {device} (Trainer(precision='bf16-mixed' or '16-mixed'), torch.autocast)",
    "grad_enabled": "grad mode (torch.no_grad, torch.inference_mode)",
    "default_dtype": "the default dtype (torch.set_default_dtype)",
    # inductor's C++ code for the CPU is built for this many threads: another machine's cores give another key
    "cpp_runtime_thread_count": (
        "the CPU threads inductor's code is built for (torch.set_num_threads, OMP_NUM_THREADS, "
        "torch._inductor.config.cpp.threads; by default the machine's cores)"
    ),
}


def _torch_state(name: str) -> str:
    """The global setting a part of the key holds, named by the call that sets it (``""``: not one of them)."""
    head, _, device = name.partition("[")
    state = _TORCH_STATE.get(name) or _TORCH_STATE.get(head, "")
    return state.format(device=device.rstrip("]"))


def _autocast_words(value: str) -> str:
    """torch 2.13 keys the dtype of a device's autocast where it is on; 2.15 ``(enabled, dtype)`` for every device."""
    enabled, _, dtype = value.strip("()").rpartition(", ")
    if not value or enabled == "False":
        return "off"
    return dtype.removeprefix("torch.")


def _tensor_words(base: str, new: str) -> tuple[str, str]:
    """Two tensors' metadata without the device they share: ``float32[32, 16]`` where only dtype or shape differ."""
    base, new = base.removeprefix("parameter "), new.removeprefix("parameter ")
    (base_head, _, base_device), (new_head, _, new_device) = base.rpartition(" "), new.rpartition(" ")
    same_device = "[" in base_head and "[" in new_head and base_device == new_device
    return (base_head, new_head) if same_device else (base, new)


def _named(name: str) -> str:
    """``inductor_config[max_autotune]`` -> ``inductor's max_autotune``, ``example_inputs[2]`` -> ``graph input
    2``; other parts as torch names them."""
    head, bracket, rest = name.partition("[")
    if head == "example_inputs":
        return f"graph input {rest.rstrip(']')}"
    words = {"inductor_config": "inductor's", "inductor_config_comms": "inductor's comms"}.get(head)
    return f"{words} {rest.rstrip(']')}" if bracket and words else name


def _reason(found: list[Change]) -> tuple[str, str]:
    if not found:  # the keys differ in a part this torch does not say
        return _SAME_KEY, _FIX["same_key"]
    first = found[0].kind
    subjects: dict[str, Change] = {}  # the first change of each, in order
    for change in found:
        subjects.setdefault(change.subject, change)
    named = [change.words for change in subjects.values() if change.kind == first][:2]
    more = len(subjects) - len(named)
    reason = "; ".join(named) + (f" (and {counted(more, 'more part')})" if more else "")
    return reason, _FIX[first]


def _parts(lines: Any) -> Parts:
    parts: Parts = {}
    for line in lines if isinstance(lines, (list, tuple)) else ():
        name, _, rest = str(line).partition("\t")
        digest, _, value = rest.partition("\t")
        parts[name] = (digest, value)
    return parts


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


def removable_by(
    residual: Residual, features: list[str] | None, saved_s: float, graph_breaks: int = 0
) -> list[dict[str, Any]]:
    """Each feature of torch against the residual, with what it would save of it on this run and what it needs."""
    phases = residual.breakdown()
    has = (lambda name: name in features) if features is not None else (lambda name: True)
    aot_note = (
        "the saved function is loaded whole instead of traced and looked up (its guards and graphs with it); its "
        "kernels are still loaded. It needs a graph without breaks (fullgraph)"
    )
    if graph_breaks:  # AOT compile takes one whole graph: a run that breaks cannot use it until its breaks go
        aot_note = f"not for this run: its {counted(graph_breaks, 'graph break')} split the model, and {aot_note}"
    return [
        {
            "feature": "AOT compile: torch.compile(model).aot_compile(...) once, torch.compiler.load_compiled_function "
            "at the start",
            "available": has("aot_compile") and not graph_breaks,
            "removes": ["dynamo_tracing", "guards", "cache_load"],
            "saves_s": 0.0
            if graph_breaks
            else round(phases["dynamo_tracing"] + phases["guards"] + phases["cache_load"], 3),
            "note": aot_note,
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


def warm_start_json(
    run: TelemetryRun, residual: Residual, hits: int, misses: int, saved_s: float, graph_breaks: int = 0
) -> Any:
    """``summary --json``'s ``warm_start``: ``null`` unless the caches served every graph (hits, no misses)."""
    if not hits or misses or not residual.timed:
        return None
    return {
        "compile_s": round(residual.total_s, 3),
        "phases": residual.breakdown(),
        "removable_by": removable_by(residual, torch_features(run), saved_s, graph_breaks),
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
