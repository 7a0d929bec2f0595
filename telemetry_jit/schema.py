"""Names of the spans, events and attributes telemetry-jit records (documented in docs/telemetry.md)."""

import re
from enum import Enum
from pathlib import Path
from typing import Final


class TrainingSpanName:
    """nv-one-logger's span names telemetry-jit reads, ends or hangs spans under, as plain strings."""

    APPLICATION: Final = "application"
    TRAINING_LOOP: Final = "training_loop"
    VALIDATION_LOOP: Final = "validation_loop"
    TESTING_LOOP: Final = "testing_loop"
    TRAINING_ITERATION: Final = "training_single_iteration"
    VALIDATION_ITERATION: Final = "validation_single_iteration"


class _Name(str, Enum):
    def __str__(self) -> str:
        return self.value


class JitSpanName(_Name):
    """Spans added to nv-one-logger's standard training spans."""

    COMPILATION = "compilation"
    RANKS_OUT_OF_STEP = "ranks_out_of_step"  # what the rank watcher said, as a span of its own: live over OTLP


class JitEventName(_Name):
    GRAPH_BREAK = "graph_break"
    DDP_GRAPH_SPLIT = "ddp_graph_split"
    COMPILE_SUMMARY = "compile_summary"
    FIRST_STEP = "first_step"
    COMPILE_PAYOFF = "compile_payoff"
    CACHE_LOOKUP = "cache_lookup"
    FALLBACK_COST = "eager_fallback_cost"
    RANKS_OUT_OF_STEP = "ranks_out_of_step"
    MODULE_NOT_COMPILED = "module_not_compiled"
    COMPILED_BEFORE_RUN = "compiled_before_run"
    TRAINED_NOTHING = "trained_nothing"  # a fit that returned without a training step (on the application span)
    COMPILE_NOT_RUN = "compile_not_run"  # compiling was disabled, or a module's compiled code never ran
    STOPPED_EARLY = "stopped_early"  # a loop ended before the length it was given (max_time, should_stop, ...)
    COMPILE_PROGRESS = "compile_progress"  # a compile still running, every PROGRESS_EVERY_S (on the loop span)


class CompileAttr:
    """Attributes of ``compilation`` spans and ``compile_summary`` events."""

    BACKEND: Final = "compile.backend"
    BACKEND_OPTIMIZES: Final = "compile.backend_optimizes"  # False only: a plug-in that runs graphs as captured
    CACHE_BYPASSES: Final = "compile.cache_bypasses"
    CACHE_HITS: Final = "compile.cache_hits"
    CACHE_MISSES: Final = "compile.cache_misses"
    CACHE_TIME_SAVED_S: Final = "compile.cache_time_saved_s"
    COUNT: Final = "compile.count"
    COUNT_BY_RANK: Final = "compile.count_by_rank"
    TIME_MS_BY_RANK: Final = "compile.time_ms_by_rank"
    DDP_BUCKET_CAP_BYTES: Final = "compile.ddp_bucket_cap_bytes"
    DDP_GRAPH_SPLITS: Final = "compile.ddp_graph_splits"
    DURATION_MS: Final = "compile.duration_ms"
    DYNAMIC: Final = "compile.dynamic"  # "true", "false" or "auto" (static first, dynamic after a size changed)
    FULLGRAPH: Final = "compile.fullgraph"
    MODE: Final = "compile.mode"  # inductor's mode, as its options amount to
    INPUT_SHAPES: Final = "compile.input_shapes"  # "x: [s77, 4, 47]": torch's dynamic-shape decisions per input
    SPECIALIZED: Final = "compile.specialized"  # "x.size()[2] = 24 (range_refined_to_singleton)": sizes torch fixed
    NEEDS_BACKWARD: Final = "compile.needs_backward"  # False: a frame compile that built an inference graph only
    FAILED: Final = "compile.failed"
    FAILURE: Final = "compile.failure"
    FELL_BACK_TO_EAGER: Final = "compile.fell_back_to_eager"
    FRAME: Final = "compile.frame"
    GRAPH_BREAK_COUNT: Final = "compile.graph_break_count"
    GRAPH_BREAKS: Final = "compile.graph_breaks"
    ID: Final = "compile.id"
    IN_PROGRESS: Final = "compile.in_progress"  # a compile_progress event's: what compiles, in words
    ELAPSED_S: Final = "compile.elapsed_s"  # a compile_progress event's: seconds since the compile began
    PHASE: Final = "compile.phase"  # a compile_progress event's: torch's innermost timed region now ('' unknown)
    IS_RECOMPILE: Final = "compile.is_recompile"
    LOCATION: Final = "compile.location"
    RECOMPILE_COUNT: Final = "compile.recompile_count"
    RECOMPILE_LIMIT_HITS: Final = "compile.recompile_limit_hits"
    RECOMPILE_REASON: Final = "compile.recompile_reason"
    RECOMPILE_REASONS: Final = "compile.recompile_reasons"  # every cache entry's, where torch gave several
    RECOMPILE_CAUSE: Final = "compile.recompile_cause"  # one of telemetry_jit.causes.CAUSES
    RECOMPILE_EXPECTED: Final = "compile.recompile_expected"  # the one-time price (a frame's first stage switch)
    RECOMPILE_BEHIND: Final = "compile.recompile_limit_behind"  # the cause of most recompiles before the limit
    SOURCE: Final = "compile.source"
    THUNDER_CACHE_HITS: Final = "compile.thunder_cache_hits"
    THUNDER_CACHE_MISSES: Final = "compile.thunder_cache_misses"
    THUNDER_MODULES: Final = "compile.thunder_modules"
    TIME_SHARE: Final = "compile.time_share"
    TOP_RECOMPILE_REASONS: Final = "compile.top_recompile_reasons"
    TOTAL_TIME_MS: Final = "compile.total_time_ms"
    TRIGGER: Final = "compile.trigger"
    UNAVAILABLE: Final = "compile.unavailable"
    WALL_TIME_MS: Final = "compile.wall_time_ms"
    TORCH_FEATURES: Final = "compile.torch_features"  # of set_stance, cache_artifacts, aot_compile: those torch has
    WARM_PHASES: Final = ("dynamo_tracing", "guards", "cache_load", "kernel_load")  # a warm start's residual phases
    PREFIX: Final = "compile."  # + a torch or thunder count, e.g. compile.inductor_fx_local_cache_hit_count

    @staticmethod
    def cache(outcome: str) -> str:
        """What the compile caches did (``fx_graph_local_hits``, ..., ``time_saved_s``)."""
        return f"compile.cache.{outcome}"

    @staticmethod
    def phase_time(phase: str) -> str:
        """Seconds a compile spent in ``phase`` (``dynamo``, ``aot_autograd``, ``inductor``, ``tracing`` ...)."""
        return f"compile.time.{phase}_s"


class GraphBreakAttr:
    """Attributes of ``graph_break`` events."""

    COMPILER: Final = "graph_break.compiler"
    COUNTED_BY_TORCH: Final = "graph_break.counted_by_torch"
    LOCATION: Final = "graph_break.location"
    REASON: Final = "graph_break.reason"
    REASON_FULL: Final = "graph_break.reason_full"
    OWNER: Final = "graph_break.owner"
    USER_LOCATION: Final = "graph_break.user_location"
    STACK: Final = "graph_break.stack"
    TYPE: Final = "graph_break.type"
    EXPLANATION: Final = "graph_break.explanation"
    HINTS: Final = "graph_break.hints"
    DOC_URL: Final = "graph_break.doc_url"
    FIX: Final = "graph_break.fix"


class CacheAttr:
    """Attributes of ``cache_lookup`` events (each key part ``"<name>\t<hash>\t<value>"``, the value empty when
    long)."""

    LAYER: Final = "cache.layer"  # aot_autograd, fx_graph
    STATE: Final = "cache.state"  # hit, miss, bypass
    KEY: Final = "cache.key"
    PARTS: Final = "cache.parts"  # the parts of this graph's own (its code, its inputs, ...)
    SETTINGS: Final = "cache.settings"  # the digest of the settings parts (inductor_config[...], ...)
    SETTINGS_PARTS: Final = "cache.settings_parts"  # those parts, on the run's first look-up with that digest
    BYPASS_REASON: Final = "cache.bypass_reason"
    TIME_SAVED_S: Final = "cache.time_saved_s"  # what a hit saved, as torch measured the original compile
    LOADED: Final = "cache.loaded_artifact"  # served by artifacts loaded with torch.compiler.load_cache_artifacts


class DdpAttr:
    """Attributes of ``ddp_graph_split`` events."""

    BUCKET_CAP_BYTES: Final = "ddp.bucket_cap_bytes"
    REASON: Final = "ddp.reason"
    SPLITS: Final = "ddp.splits"
    SUBGRAPHS: Final = "ddp.subgraphs"


class TrainAttr:
    """Where training was when a compile started (on ``compilation`` spans)."""

    GLOBAL_STEP: Final = "train.global_step"
    STAGE: Final = "train.stage"  # train, sanity_check, validate, test, predict, tuner
    BATCH_INDEX: Final = "train.batch_index"  # the batch of its loop
    BATCHES: Final = "train.batches"  # batches in that loop's dataloader, where known
    LOADER: Final = "train.dataloader_idx"  # which of the loop's dataloaders, where it has several
    BATCHES_RUN: Final = "train.batches_run"  # on compile_summary: the batches the run began by then, any loop


class StepAttr:
    """Attributes of ``first_step`` events: the first step of a stage, and its compiling."""

    STAGE: Final = "step.stage"
    GLOBAL_STEP: Final = "step.global_step"
    BATCH_INDEX: Final = "step.batch_index"
    WALL_MS: Final = "step.wall_ms"
    COMPILE_MS: Final = "step.compile_ms"
    COMPILATIONS: Final = "step.compilations"
    OTHER_MS: Final = "step.other_ms"

    @staticmethod
    def phase_time(phase: str) -> str:
        """Seconds of the step's compiling: ``forward``, ``backward`` graphs, ``inductor``'s part."""
        return f"step.compile.{phase}_s"


class PayoffAttr:
    """Attributes of the ``compile_payoff`` event: what compiling bought, measured in the run."""

    EAGER_STEP_MS: Final = "payoff.eager_step_ms"
    COMPILED_STEP_MS: Final = "payoff.compiled_step_ms"
    SPEEDUP: Final = "payoff.speedup"  # eager step time / compiled step time
    COMPILE_S: Final = "payoff.compile_s"  # compile seconds spent until the end of the loop
    BREAK_EVEN_STEP: Final = "payoff.break_even_step"  # -1: never (compiled steps are not faster)
    NET_S: Final = "payoff.net_s"  # time won (+) or lost (-) over the loop's steps
    STEPS: Final = "payoff.steps"  # training steps of the loop
    MEASURED_AT_STEP: Final = "payoff.measured_at_step"  # the first step of the measurement
    BLOCKS: Final = "payoff.blocks"  # blocks of each mode timed
    BLOCK_STEPS: Final = "payoff.block_steps"
    NOT_MEASURED: Final = "payoff.not_measured"  # why the loop has no measurement
    EAGER_PEAK_MB: Final = "payoff.eager_peak_memory_mb"  # CUDA only
    COMPILED_PEAK_MB: Final = "payoff.compiled_peak_memory_mb"  # CUDA only


class CompiledBeforeAttr:
    """Attributes of the ``compiled_before_run`` event: what the process had compiled before the run."""

    FRAMES: Final = "compiled_before.frames"  # how many frames
    NAMES: Final = "compiled_before.names"  # the first 20 of them ("Sequential.forward")
    LOCATIONS: Final = "compiled_before.locations"  # where each of those is defined ("/path/container.py:248")


class NotCompiledAttr:
    """Attributes of ``module_not_compiled`` events: a ``Module.compile()`` torch compiles nothing of."""

    MODULE: Final = "not_compiled.module"  # its name in the model ("" for the model itself)
    CLASS: Final = "not_compiled.class"  # its class, with its module ("torch.nn.modules.linear.Linear")
    TORCH_VERSION: Final = "not_compiled.torch_version"
    SELECTOR: Final = "not_compiled.selector"  # the JitConfig.module_selector that selects it, where one does


class FallbackAttr:
    """Attributes of ``eager_fallback_cost`` events: what a frame running eagerly from a step on cost."""

    FRAME: Final = "fallback.frame"
    LOCATION: Final = "fallback.location"
    STEP: Final = "fallback.global_step"  # the step from which it ran eagerly
    COMPILED_BATCH_MS: Final = "fallback.compiled_batch_ms"  # median batch before, while it ran compiled
    EAGER_BATCH_MS: Final = "fallback.eager_batch_ms"  # median batch after
    COMPILED_BATCHES: Final = "fallback.compiled_batches"  # batches timed before
    EAGER_BATCHES: Final = "fallback.eager_batches"  # batches timed after
    BATCHES_SINCE: Final = "fallback.batches_since"  # training batches it ran eagerly in, to the loop's end
    COST_S: Final = "fallback.cost_s"  # (eager - compiled median) x batches since
    EXTRA_LOW_MS: Final = "fallback.extra_low_ms"  # a 95% interval of what a batch takes longer eagerly: its low end
    EXTRA_HIGH_MS: Final = "fallback.extra_high_ms"  # and its high end (both absent: too few batches for one)
    NOT_MEASURED: Final = "fallback.not_measured"  # why there is no measurement


class RanksAttr:
    """Attributes of ``ranks_out_of_step`` events, said live by the rank watcher (docs/distributed.md)."""

    KIND: Final = "ranks.kind"  # stall, stall_ended, divergent_graph, silent, heard_again, not_ended
    RANKS: Final = "ranks.ranks"  # the ranks it is about (the first 64)
    RANK_COUNT: Final = "ranks.rank_count"
    STEP: Final = "ranks.global_step"  # where the ranks it is about were
    STAGE: Final = "ranks.stage"
    WHAT: Final = "ranks.what"  # the frame compiling, or the graph's frame
    WHY: Final = "ranks.why"  # the recompile's reason, or the error this rank stopped with
    SECONDS: Final = "ranks.duration_s"  # how long it has compiled (or compiled, or been silent)
    WAITING: Final = "ranks.waiting"  # how many ranks waited
    WAITING_RANKS: Final = "ranks.waiting_ranks"  # which (the first 64)
    GRAPH: Final = "ranks.graph"  # the divergent graph's hash
    LINE: Final = "ranks.line"  # the sentence said on the console


class ResourceAttr:
    """What one compilation cost the host, on ``compilation`` spans (docs/telemetry.md, "Resources")."""

    CPU_S: Final = "compile.resources.cpu_time_s"  # this process's and its compile children's
    WORKER_CPU_S: Final = "compile.resources.worker_cpu_time_s"  # of that, child processes' (workers, compilers)
    HOST_PEAK_BYTES: Final = "compile.resources.host_peak_bytes"  # peak resident memory above the level at its start
    HOST_RSS_BYTES: Final = "compile.resources.host_rss_bytes"  # the peak itself: this process and its children
    DEVICE_PEAK_BYTES: Final = "compile.resources.device_peak_bytes"  # CUDA, where the compile set a new peak
    LIMIT_BYTES: Final = "compile.resources.memory_limit_bytes"  # the memory the process may use
    LIMIT_SOURCE: Final = "compile.resources.memory_limit_source"  # what says so (a cgroup file, the machine)
    NEAR_LIMIT: Final = "compile.resources.near_memory_limit"  # its peak reached 80 % of that limit


class MetricName:
    """The OpenTelemetry metrics recorded next to the spans."""

    COMPILATIONS: Final = "telemetry_jit.compilations"
    RECOMPILATIONS: Final = "telemetry_jit.recompilations"
    GRAPH_BREAKS: Final = "telemetry_jit.graph_breaks"
    COMPILE_DURATION: Final = "telemetry_jit.compile.duration"


# the compile-duration histogram's bounds in seconds (OpenTelemetry's defaults are made for milliseconds: every
# compile under 5 s would share one bucket); a View or the OTEL_ variable the user sets wins
COMPILE_DURATION_BOUNDS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
    500.0, 1000.0, 1800.0, 3600.0,
)  # fmt: skip


# OpenTelemetry's names for what the file records (docs/telemetry.md, "Names over OTLP")
OTEL_NAMESPACE = "telemetry_jit."
_RECORDED = ("compile.", "graph_break.", "ddp.", "train.", "step.", "payoff.", "cache.", "fallback.", "ranks.")
_IDENTITY = frozenset(("rank", "local_rank", "world_size", "node"))
_RENAMED: dict[str, str | None] = {
    "compile.count": "compile.compilations",
    "compile.recompile_count": "compile.recompiles",
    "compile.graph_break_count": "compile.graph_breaks",
    "compile.num_graph_breaks": None,  # torch's count of what compile.graph_breaks counts: one name per fact
    "compile.time_ms_by_rank": "compile.time_by_rank",
    "step.wall_ms": "step.wall_time",
    "step.compile_ms": "step.compile_time",
    "step.other_ms": "step.other_time",
    "payoff.eager_step_ms": "payoff.eager_step_time",
    "payoff.compiled_step_ms": "payoff.compiled_step_time",
    "payoff.compile_s": "payoff.compile_time",
    "payoff.net_s": "payoff.net_time",
}


def otel_name(name: str) -> tuple[str, float] | None:
    """The OpenTelemetry name of a recorded attribute and the factor to its unit (``compile.duration_ms`` ->
    ``telemetry_jit.compile.duration``, 0.001); ``None`` for nv-one-logger's own or one :func:`otel_dropped`."""
    if name in _IDENTITY:
        return OTEL_NAMESPACE + name, 1.0
    if not name.startswith(_RECORDED) or otel_dropped(name):
        return None
    scale = 0.001 if name.endswith("_ms") or "_ms_" in name else 1.0
    return OTEL_NAMESPACE + (_RENAMED.get(name) or re.sub(r"_(ms|s)$", "", name)), scale


def otel_dropped(name: str) -> bool:
    """A recorded attribute not sent over OTLP: another name carries its fact (``compile.num_graph_breaks``)."""
    return name.startswith(_RECORDED) and _RENAMED.get(name, name) is None


# The loop spans a compilation span may hang under, innermost first (nv-one-logger names).
LOOP_SPAN_NAMES = (
    TrainingSpanName.VALIDATION_LOOP,
    TrainingSpanName.TESTING_LOOP,
    TrainingSpanName.TRAINING_LOOP,
    TrainingSpanName.APPLICATION,
)


# The JSON Lines file telemetry_jit.exporters.FileExporter writes; the reader refuses a newer version.
FILE_FORMAT = "telemetry-jit"
FILE_FORMAT_VERSION = 2  # 2: every record numbered by its writer (RecordKey), the last, run_end, counting them
NUMBERED_SINCE = 2  # the first format whose records prove a run whole (docs/reliability.md)


class RecordKey:
    """What every record of a file carries besides its own fields (format 2 on), and the counts of ``run_end``."""

    WRITER: Final = "writer"  # the writer's id: one file exporter of one process
    SEQ: Final = "seq"  # the record's number in its writer's sequence: 0 is its run_start
    RECORDS: Final = "records"  # run_end: how many records were numbered before it
    WRITTEN: Final = "written"  # run_end: the records written, by kind


# call sites (boundary.call_site names) whose failure loses a record the file would have held: what each loses
RECORD_LOSING_SITES: Final = {"nv_one_logger.export": "compile span", "nv_one_logger.event": "event"}


class NotRunAttr:
    """Attributes of ``compile_not_run`` events: compiling switched off, or compiled code that never ran."""

    REASON: Final = "not_run.reason"  # "disabled" (TORCH_COMPILE_DISABLE, dynamo's config) or "never_ran"
    MODULE: Final = "not_run.module"  # the module whose compiled code never ran ("" for the whole process)
    DETAIL: Final = "not_run.detail"  # why, in words


class StopAttr:
    """Attributes of ``stopped_early`` events: what ended a loop before its length."""

    REASON: Final = "stop.reason"  # "max_time", "should_stop", "fast_dev_run", "limit_train_batches", ...
    DETAIL: Final = "stop.detail"  # in words, with the figures


RANK_FILE = re.compile(r"\.rank(\d+)\.jsonl$")  # what rank_file names, for readers


def rank_file(path: Path, rank: int | str, world_size: int) -> Path:
    """Where one rank writes: ``path`` for a single process, else ``<stem>.rank<R><suffix>`` (``"*"``: all)."""
    return path if world_size <= 1 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
