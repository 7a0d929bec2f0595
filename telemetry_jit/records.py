"""Plain records of what a compiler did, from the probes to the recorder; no torch or nv-one-logger at run time
(the analysis side shares them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar, TypeVar

from telemetry_jit.breaks import BreakText, break_fix, owner_of, parse_break, user_location
from telemetry_jit.causes import Classified
from telemetry_jit.schema import (
    CompiledBeforeAttr,
    FallbackAttr,
    NotCompiledAttr,
    NotRunAttr,
    PayoffAttr,
    ResourceAttr,
    StopAttr,
)
from telemetry_jit.terminal import counted, frame_shown

if TYPE_CHECKING:
    from nv_one_logger.core.span import Span

AttributeValue = str | bool | int | float | list[str] | list[int] | list[float] | list[bool]


def is_frame_recompile(is_recompile: bool, trigger: str) -> bool:
    """A frame compiled again (torch's attempt > 0); its lazily compiled backward is part of that recompile."""
    return is_recompile and trigger != "lazy_backward"


@dataclass(frozen=True)
class GraphBreak:
    """One graph break counted while a compilation traced user code."""

    reason: str  # the compiler's full reason text
    location: str = ""  # "file:line" of the innermost frame that broke, empty when unknown
    # False for breaks torch logs but leaves out of counters["graph_break"] (data-dependent branching)
    counted_by_torch: bool = True
    # who split the graph: "dynamo", "thunder" (an op thunder.dynamo.ThunderCompiler left to torch), or a plug-in
    compiler: str = "dynamo"
    # the frames that led to the break, outermost first ("file:line"), where torch names them
    stack: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        """The reason's first line, as spans and summaries show it."""
        return self.reason.strip().split("\n", 1)[0]

    @cached_property
    def owner(self) -> str:
        return owner_of(self.location)

    @cached_property
    def user_location(self) -> str:
        return user_location((*self.stack, self.location) if self.location else self.stack)

    @cached_property
    def text(self) -> BreakText:
        return parse_break(self.reason)

    @property
    def fix(self) -> str:
        return break_fix(self.owner, self.text, [self.user_location] if self.user_location else [])


@dataclass(frozen=True)
class CacheLookup:
    """One look-up in a compile cache and its key's parts ``(name, hash, value)``, the value empty when long."""

    layer: str
    state: str  # hit, miss, bypass
    key: str = ""
    parts: tuple[tuple[str, str, str], ...] = ()
    settings: str = ""  # the digest of the settings parts (inductor_config[...], ...), kept once per run
    settings_parts: tuple[tuple[str, str, str], ...] = ()  # those parts, where this run has not said them yet
    bypass_reason: str = ""
    saved_s: float = 0.0
    loaded: bool = False  # served by artifacts loaded with torch.compiler.load_cache_artifacts


E = TypeVar("E", bound="_Event")


class _Event:
    """A record an event or span holds, each field an attribute under its name in ``NAMES`` (``cls``: ``CLASS``)."""

    NAMES: ClassVar[type]

    def attributes(self) -> dict[str, AttributeValue]:
        return {
            getattr(self.NAMES, "CLASS" if each.name == "cls" else each.name.upper()): (
                list(value) if isinstance(value := getattr(self, each.name), tuple) else value
            )
            for each in fields(self)  # type: ignore[arg-type]
        }

    @classmethod
    def from_attributes(cls: type[E], attributes: Mapping[str, object]) -> E:
        """A missing or non-finite number reads as 0, an optional one missing as ``None``."""
        values: dict[str, object] = {}
        for each in fields(cls):  # type: ignore[arg-type]
            value = attributes.get(getattr(cls.NAMES, "CLASS" if each.name == "cls" else each.name.upper()))
            kind = str(each.type)
            if kind == "str":
                values[each.name] = str(value or "")
            elif kind.startswith("tuple"):
                values[each.name] = tuple(map(str, value)) if isinstance(value, list) else ()
            elif value is None and "None" in kind:
                values[each.name] = None
            else:
                number = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0
                values[each.name] = int(number) if kind.startswith("int") else number
        return cls(**values)


NEAR_LIMIT_SHARE = 0.8  # a compile whose host peak reaches this share of the memory the process may use is warned of


@dataclass(frozen=True)
class CompileResources(_Event):
    """What one compilation cost the host: CPU seconds (its compile workers' included) and resident memory."""

    NAMES = ResourceAttr

    cpu_s: float = 0.0
    worker_cpu_s: float = 0.0  # of cpu_s, the child processes'
    host_peak_bytes: int = 0  # peak resident memory above the level when it started
    host_rss_bytes: int = 0  # that peak itself
    device_peak_bytes: int | None = None  # CUDA: above the allocation at its start, where it set the process's peak
    limit_bytes: int = 0  # the memory the process may use (0: unknown)
    limit_source: str = ""

    @property
    def near_limit(self) -> bool:
        return self.limit_bytes > 0 and self.host_rss_bytes >= NEAR_LIMIT_SHARE * self.limit_bytes

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            ResourceAttr.CPU_S: round(self.cpu_s, 3),
            ResourceAttr.WORKER_CPU_S: round(self.worker_cpu_s, 3),
            ResourceAttr.HOST_PEAK_BYTES: self.host_peak_bytes,
            ResourceAttr.HOST_RSS_BYTES: self.host_rss_bytes,
        }
        if self.device_peak_bytes is not None:
            attributes[ResourceAttr.DEVICE_PEAK_BYTES] = self.device_peak_bytes
        if self.limit_bytes:
            attributes[ResourceAttr.LIMIT_BYTES] = self.limit_bytes
            attributes[ResourceAttr.LIMIT_SOURCE] = self.limit_source
            attributes[ResourceAttr.NEAR_LIMIT] = self.near_limit
        return attributes

    def words(self) -> str:
        workers = f" ({self.worker_cpu_s:.1f} s in compile workers and compilers)" if self.worker_cpu_s >= 0.05 else ""
        device = f", device memory +{mb(self.device_peak_bytes)}" if self.device_peak_bytes else ""
        return (
            f"CPU {self.cpu_s:.1f} s{workers}, host memory +{mb(self.host_peak_bytes)} "
            f"(peak {mb(self.host_rss_bytes)}){device}"
        )


def mb(size: float) -> str:
    """``1.2 GB``, ``350 MB`` (powers of 1024, as top and free count)."""
    return f"{size / 2**30:.1f} GB" if size >= 2**30 else f"{size / 2**20:.0f} MB"


def near_limit_words(peak_bytes: int, limit_bytes: int, limit_source: str, threads: int | None) -> str:
    """The warning for a compile whose host peak nears the process's memory limit, with what lowers it."""
    now = f" (now {threads})" if threads else ""
    return (
        f"compiling took this process and its compile workers to {mb(peak_bytes)} of resident memory, "
        f"{peak_bytes / limit_bytes:.0%} of the {mb(limit_bytes)} it may use ({limit_source}): compiling may exhaust "
        f"it, and the process be killed. Fewer compile workers lower the peak: TORCHINDUCTOR_COMPILE_THREADS=1"
        f"{now}; or fewer ranks per host, or more memory"
    )


@dataclass(frozen=True)
class CompileContext:
    """Where training was when a compile started."""

    global_step: int = 0
    stage: str = ""
    parent: Span | None = None  # the nv-one-logger span the compilation span hangs under
    rank: int = 0
    batch_index: int | None = None  # the batch of its loop, where the loop says
    batches: int | None = None  # batches in that loop's dataloader (the epoch), where known and finite
    loader: int | None = None  # which of the loop's dataloaders, where it has several
    log_step: int | None = None  # the step the driver's loggers log at then, where it is not global_step


@dataclass
class CompileRecord:
    """One finished compilation, with its real start and end (epoch nanoseconds)."""

    source: str  # which probe saw the compile: "dynamo", "thunder", or a plug-in backend's name
    compile_id: str
    trigger: str  # what started it: "dynamo", "lazy_backward" (at the first backward), "thunder", or a plug-in's name
    start_ns: int
    end_ns: int
    backend: str = ""
    optimizes: bool = True  # False: its backend runs graphs as captured (a plug-in says so)
    frame: str = ""
    location: str = ""
    is_recompile: bool = False
    recompile_reason: str = ""  # torch's reason, of the cache entry that says what changed (causes.telling_reason)
    recompile_reasons: tuple[str, ...] = ()  # every cache entry's, most recent first, where torch gave several
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    # buckets of each graph dynamo's DDPOptimizer partitioned in this compile; empty outside DDP
    ddp_buckets: list[int] = field(default_factory=list)
    ddp_bucket_cap_bytes: int = 0
    phase_times_s: dict[str, float] = field(default_factory=dict)
    failure: str = ""  # the compiler's error text when compilation failed
    fell_back_to_eager: bool = False  # a failure dynamo handled by running the frame eagerly
    recompile_limit_hit: bool = False
    # what the FX graph / AOTAutograd caches did: fx_graph_local_hits, ..., time_saved_s
    cache: dict[str, float] = field(default_factory=dict)
    cache_bypasses: list[str] = field(default_factory=list)  # "fx_graph: <torch's reason>", ...
    cache_lookups: list[CacheLookup] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)
    # facts the compiler in use does not expose (e.g. a field an older torch lacks): absent, not zero
    unavailable: tuple[str, ...] = ()
    context: CompileContext | None = None  # where training was when the compile started
    callers: tuple[str, ...] = ()  # the Python frames that called the compiled frame, outermost first
    # the options it compiled with, as torch applied them (dynamic "true"/"false"/"auto", fullgraph, inductor's mode)
    options: dict[str, str | bool] = field(default_factory=dict)
    # the graph's input shapes as torch decided them ("x: [s77, 4, 47]": a symbol is dynamic, a number fixed)
    input_shapes: tuple[str, ...] = ()
    # the sizes torch fixed to one value while compiling ("L['x'].size()[2] = 24 (range_refined_to_singleton)")
    specializations: tuple[str, ...] = ()
    caller: str = ""  # whose call a frame compile compiled (compat.torch.compile_caller), "" unknown
    needs_backward: bool | None = None  # a frame compile whose graph can need a backward graph; None unknown
    cause: Classified | None = None  # why it recompiled (set when the recorder takes it)
    resources: CompileResources | None = None  # what it cost the host, where measured
    # torch's CompilationMetrics.duration_us; start_ns..end_ns also holds torch's bookkeeping of the metrics
    own_duration_ns: int | None = None

    @property
    def duration_ms(self) -> float:
        return (self.own_duration_ns if self.own_duration_ns is not None else self.end_ns - self.start_ns) / 1e6

    @property
    def frame_id(self) -> str:
        """torch's frame number (``"3"`` of ``"3/1"``; thunder: the module's name)."""
        return self.compile_id.rsplit("/", 1)[0]

    @property
    def is_frame_recompile(self) -> bool:
        return is_frame_recompile(self.is_recompile, self.trigger)

    @property
    def cache_hits(self) -> int:
        return int(sum(value for name, value in self.cache.items() if name.endswith("_hits")))

    @property
    def cache_misses(self) -> int:
        return int(sum(value for name, value in self.cache.items() if name.endswith("_misses")))

    @property
    def ddp_graph_splits(self) -> int:
        """Cuts DDPOptimizer made at gradient-bucket boundaries: not graph breaks in user code."""
        return sum(buckets - 1 for buckets in self.ddp_buckets if buckets > 1)


@dataclass
class Payoff(_Event):
    """What compiling bought: step times of each mode, the speedup, when it is repaid; or why not measured."""

    NAMES = PayoffAttr

    eager_step_ms: float = 0.0
    compiled_step_ms: float = 0.0
    measured_at_step: int = -1
    blocks: int = 0
    block_steps: int = 0
    eager_peak_mb: float | None = None
    compiled_peak_mb: float | None = None
    compile_s: float = 0.0
    steps: int = 0  # training steps of the loop (optimizer steps), set at its end
    not_measured: str = ""  # why there is no measurement ("" once measured)

    @property
    def measured(self) -> bool:
        return not self.not_measured

    @property
    def speedup(self) -> float:
        return self.eager_step_ms / self.compiled_step_ms if self.compiled_step_ms > 0 else math.nan

    @property
    def saved_per_step_s(self) -> float:
        return (self.eager_step_ms - self.compiled_step_ms) / 1000

    @property
    def break_even_step(self) -> int | None:
        """The step by which the time saved adds up to the compile time; ``None`` when not faster."""
        if not self.measured or self.saved_per_step_s <= 0:
            return None
        return math.ceil(self.compile_s / self.saved_per_step_s)

    @property
    def net_s(self) -> float:
        """Time won (positive) or lost over the loop: every step but the eager ones ran compiled."""
        compiled_steps = max(self.steps - self.blocks * self.block_steps, 0)
        return compiled_steps * self.saved_per_step_s - self.compile_s

    def attributes(self) -> dict[str, AttributeValue]:
        if not self.measured:
            return {
                PayoffAttr.NOT_MEASURED: self.not_measured,
                PayoffAttr.COMPILE_S: self.compile_s,
                PayoffAttr.STEPS: self.steps,
            }
        # what the figures are made of, unrounded: a file's reader then says what the run said (2.99x, not 3.00x)
        attributes: dict[str, AttributeValue] = {
            PayoffAttr.EAGER_STEP_MS: self.eager_step_ms,
            PayoffAttr.COMPILED_STEP_MS: self.compiled_step_ms,
            PayoffAttr.SPEEDUP: round(self.speedup, 4),
            PayoffAttr.COMPILE_S: self.compile_s,
            PayoffAttr.BREAK_EVEN_STEP: self.break_even_step if self.break_even_step is not None else -1,
            PayoffAttr.NET_S: round(self.net_s, 4),
            PayoffAttr.STEPS: self.steps,
            PayoffAttr.MEASURED_AT_STEP: self.measured_at_step,
            PayoffAttr.BLOCKS: self.blocks,
            PayoffAttr.BLOCK_STEPS: self.block_steps,
        }
        if self.eager_peak_mb is not None and self.compiled_peak_mb is not None:
            attributes[PayoffAttr.EAGER_PEAK_MB] = self.eager_peak_mb
            attributes[PayoffAttr.COMPILED_PEAK_MB] = self.compiled_peak_mb
        return attributes

    def sentence(self, why_slower: str = "") -> str:
        """The answer in one line (``why_slower``: the likely reason, said when compiling loses)."""
        if not self.measured:
            return f"not measured: {self.not_measured}"
        times = f"{self.compiled_step_ms:.2f} ms vs {self.eager_step_ms:.2f} ms a step"
        if self.speedup >= 1:
            repaid = (
                f"{self.compile_s:.1f} s of compiling repaid at step {self.break_even_step}"
                if self.break_even_step is not None
                else "nothing to repay"
            )
            return f"compiled steps {self.speedup:.2f}x faster than eager ({times}); {repaid}"
        return (
            f"compiled steps {1 / self.speedup:.2f}x slower than eager ({times}): compiling loses here, "
            f"{self.compile_s:.1f} s of compiling is never repaid"
            + (f"; likely why: {why_slower}" if why_slower else "")
        )


@dataclass(frozen=True)
class CompiledBefore(_Event):
    """The frames a process had compiled when a run's telemetry began: the run does not compile them again."""

    NAMES = CompiledBeforeAttr

    frames: int
    names: tuple[str, ...] = ()  # the first of them
    locations: tuple[str, ...] = ()  # where each is defined, "file:line"

    def words(self) -> str:
        listed = ", ".join(frame_shown(name, where) for name, where in zip(self.names, self.locations, strict=False))
        more = f" and {self.frames - len(self.names)} more" if self.frames > len(self.names) else ""
        return (
            f"this run began in a process that had already compiled {counted(self.frames, 'frame')} "
            f"({listed}{more}): calls to {'them' if self.frames > 1 else 'it'} run "
            "that code without compiling, so compiles and recompiles paid before the run are not in it. To measure "
            "an attempt from scratch, run it in a fresh process, or call torch._dynamo.reset() before it"
        )

    def as_json(self) -> dict[str, object]:
        return {"frames": self.frames, "names": list(self.names)}


@dataclass(frozen=True)
class NotCompiled(_Event):
    """A module ``Module.compile()`` was called on whose ``forward`` lies in torch's files: torch before 2.15
    compiles nothing of it (pytorch/pytorch#150915), so it runs eagerly and nothing says so."""

    NAMES = NotCompiledAttr

    module: str  # its attribute path in the model the loop runs ("" for that model itself)
    cls: str  # "torch.nn.modules.transformer.TransformerEncoder"
    torch_version: str
    selector: str = ""  # the JitConfig.module_selector that selects it ("" where none does)

    def words(self) -> str:
        name = f"`{self.module}`" if self.module else "the model"
        short = self.cls.rsplit(".", 1)[-1]
        return (
            f"{name} ({short}) was compiled with Module.compile(), which in torch {self.torch_version} compiles "
            "nothing of torch's own layers (their forward is in torch's files, which dynamo skips; fixed in torch "
            "2.15, pytorch/pytorch#150915): it runs eagerly, without compilation"
        )

    def fix(self) -> str:
        target = f"self.{self.module}" if self.module else "model"
        by_jit_transform = (
            "by JitTransform, in place, state_dict keys unchanged: hook_trainer_cls(..., jit_config=JitConfig("
            f"module_selector={self.selector!r}, use_torch=True)); or "
            if self.selector
            else ""
        )
        return (
            "remove that Module.compile() call (in configure_model it would undo the fix at the next fit, "
            f"validate, test or predict) and compile it {by_jit_transform}once, where the model is built (__init__): "
            f"`{target} = torch.compile({target})` (its state_dict keys gain `_orig_mod.`)"
        )


@dataclass(frozen=True)
class CompileNotRun(_Event):
    """Compiled code that did not run: compiling switched off for the process (``TORCH_COMPILE_DISABLE=1``,
    ``torch._dynamo.config.disable``), or a module compiled whose compiled code never ran (its forward is
    ``torch.compiler.disable``-d, nothing called it, its compile failed)."""

    NAMES = NotRunAttr

    reason: str  # "disabled" or "never_ran"
    module: str = ""  # the module whose compiled code never ran ("" where compiling was switched off for all)
    detail: str = ""  # why, in words

    def words(self) -> str:
        if self.reason == "disabled":
            return f"compiling was switched off ({self.detail}): every frame ran eagerly, nothing was compiled"
        return f"the compiled code of {self.module or 'the model'} never ran ({self.detail}): it ran eagerly"


@dataclass(frozen=True)
class StoppedEarly(_Event):
    """A loop that ended before the length it was given, and by what (``max_time``, ``should_stop``, ...)."""

    NAMES = StopAttr

    reason: str  # "max_time", "should_stop", "fast_dev_run", "limit_train_batches", "max_steps"
    detail: str = ""  # in words, with the figures ("max_time 0:00:05 reached at step 12 of 40")


@dataclass(frozen=True)
class FallbackCost(_Event):
    """What a frame running eagerly from ``step`` on cost: median batch while compiled against after (batches that
    compiled nothing); or why not measured."""

    NAMES = FallbackAttr

    frame: str
    location: str
    step: int
    compiled_batch_ms: float = 0.0
    eager_batch_ms: float = 0.0
    compiled_batches: int = 0
    eager_batches: int = 0
    batches_since: int = 0  # training batches from its fallback to the loop's end
    not_measured: str = ""
    # a 95% interval of what a batch takes longer eagerly (None: too few batches for one, or a file without it)
    extra_low_ms: float | None = None
    extra_high_ms: float | None = None

    @property
    def extra_ms(self) -> float:
        return self.eager_batch_ms - self.compiled_batch_ms

    @property
    def told(self) -> bool:
        """Whether the batches tell a cost (or a saving) apart from noise: its interval holds no zero."""
        low, high = self.extra_low_ms, self.extra_high_ms
        return not self.not_measured and low is not None and high is not None and (low > 0 or high < 0)

    @property
    def cost_s(self) -> float:
        return self.extra_ms * self.batches_since / 1000 if not self.not_measured else 0.0

    def words(self) -> str:
        if self.not_measured:
            return f"its cost not measured: {self.not_measured}"
        medians = (
            f"{self.eager_batch_ms:.1f} ms against {self.compiled_batch_ms:.1f} ms while compiled, medians of "
            f"{self.eager_batches} and {self.compiled_batches} batches"
        )
        low, high = self.extra_low_ms, self.extra_high_ms
        if low is None or high is None:
            return f"not enough batches to tell what it costs: {medians}, too few for a 95% interval"
        interval = f"{low:.1f} to {high:.1f} ms a batch"
        if not self.told:
            return f"not enough batches to tell what it costs: {medians}; the 95% interval, {interval}, holds zero"
        verb, extra = ("costs", f"{interval}") if self.extra_ms >= 0 else ("saves", f"{-high:.1f} to {-low:.1f} ms")
        return (
            f"{verb} {abs(self.extra_ms):.1f} ms a training batch (95% interval {extra}; {medians}), "
            f"{abs(self.cost_s):.2f} s over the {self.batches_since} batches since"
        )

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            FallbackAttr.FRAME: self.frame,
            FallbackAttr.LOCATION: self.location,
            FallbackAttr.STEP: self.step,
            FallbackAttr.BATCHES_SINCE: self.batches_since,
        }
        if self.not_measured:
            return {**attributes, FallbackAttr.NOT_MEASURED: self.not_measured}
        return {
            **attributes,
            FallbackAttr.COMPILED_BATCH_MS: round(self.compiled_batch_ms, 4),
            FallbackAttr.EAGER_BATCH_MS: round(self.eager_batch_ms, 4),
            FallbackAttr.COMPILED_BATCHES: self.compiled_batches,
            FallbackAttr.EAGER_BATCHES: self.eager_batches,
            FallbackAttr.COST_S: round(self.cost_s, 4),
            **({FallbackAttr.EXTRA_LOW_MS: round(self.extra_low_ms, 4)} if self.extra_low_ms is not None else {}),
            **({FallbackAttr.EXTRA_HIGH_MS: round(self.extra_high_ms, 4)} if self.extra_high_ms is not None else {}),
        }

    def as_json(self) -> dict[str, object]:
        if self.not_measured:
            return {"not_measured": self.not_measured, "batches_since": self.batches_since}
        said = ("compiled_batch_ms", "eager_batch_ms", "compiled_batches", "eager_batches", "batches_since", "cost_s")
        figures: dict[str, object] = {name: round(getattr(self, name), 3) for name in said}  # ints stay ints
        low, high = self.extra_low_ms, self.extra_high_ms
        figures["extra_ms_interval"] = [round(low, 3), round(high, 3)] if low is not None and high is not None else None
        return {**figures, "told": self.told}


# backends that capture graphs and run them as they are: compiling with them cannot make a step faster
NOT_OPTIMIZING = frozenset(("eager", "aot_eager", "aot_eager_decomp_partition", "aot_eager_default_partitioner"))


def why_slower(graph_breaks: int, recompiles: int, backends: AbstractSet[str], plain_backends: AbstractSet[str]) -> str:
    """The likely reason compiled steps are slower than eager: the backends (``plain_backends``: plug-ins that do
    not optimise), graph breaks and unexpected recompiles."""
    plain = sorted(backends & NOT_OPTIMIZING | plain_backends)
    if plain:
        return (
            f"the backend {', '.join(plain)} only captures graphs and runs them as they are, so it cannot make a step "
            "faster: compile with inductor (torch.compile's default backend) to measure what compiling buys"
        )
    if graph_breaks or recompiles:
        return (
            f"{counted(graph_breaks, 'graph break')} and {counted(recompiles, 'recompile')} in training split and "
            "guard the compiled code (see what to fix first in telemetry-jit summary)"
        )
    return "the steps' work is small, so the compiled code's guards and calls cost more than fusing saves"


def first_step_line(
    stage: str, global_step: int, wall_ms: float, compile_ms: float, phases_s: dict[str, float], loop: str = ""
) -> str:
    """``first train step (step 0): 41.2 s = 38.9 s compiling (forward 20.1 s, backward 18.8 s; inductor
    33.0 s of it) + 2.3 s running``; ``loop``: the summary's ``training loop 2 of 2``."""
    phases = ", ".join(f"{phase} {phases_s[phase]:.1f} s" for phase in ("forward", "backward") if phase in phases_s)
    if "inductor" in phases_s:
        phases += f"; inductor {phases_s['inductor']:.1f} s of it"
    compiling = f"{compile_ms / 1000:.1f} s compiling" + (f" ({phases})" if phases else "")
    # from the figures as shown, so that the line adds up as read (2.84 = 2.76 + 0.08 would read 2.8 = 2.8 + 0.1)
    running = max(round(wall_ms / 1000, 1) - round(compile_ms / 1000, 1), 0.0)
    stage = {"validate": "validation", "sanity_check": "sanity check"}.get(stage, stage)
    where = f"step {global_step}, {loop}" if loop else f"step {global_step}"
    return f"first {stage} step ({where}): {wall_ms / 1000:.1f} s = {compiling} + {running:.1f} s running"
