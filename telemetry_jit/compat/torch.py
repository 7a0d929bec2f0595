"""The torch adapter: every internal of ``torch._dynamo`` that telemetry-jit reads, for torch 2.8 - 2.15, from the
most stable surface torch offers (compile callbacks, ``CompilationMetrics``, counters; only where nothing else names
it, a log record or dynamo's ``_compile`` frame). A fact this torch lacks is listed in :data:`UNAVAILABLE`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import re
import sys
import types
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import Any, Literal, TypeVar

import torch

SUPPORTED = "torch 2.8 - 2.15"
_FIRST, _LAST = (2, 8), (2, 15)


VERSION = tuple(int(number) for number in re.findall(r"\d+", torch.__version__)[:2])  # "2.15.0+cu132": (2, 15)
if VERSION < _FIRST:
    raise ImportError(
        f"telemetry-jit needs torch >= 2.8 (tested: {SUPPORTED}); found torch {torch.__version__}. "
        "Upgrade torch, e.g. pip install 'torch>=2.8'."
    )

# after the version check: older torch fails on these with an error that names nothing useful
import torch._dynamo.utils as _dynamo_utils  # noqa: E402
from torch._dynamo.callback import CallbackTrigger, callback_handler  # noqa: E402

# -- compile callbacks ----------------------------------------------------------------------------
Callback = Callable[[Any], None]
CalledBack = TypeVar("CalledBack", bound=Callable[..., Any])


def never_traced(function: CalledBack) -> CalledBack:
    """``function`` as dynamo never compiles it, nor anything it calls. torch calls telemetry's callbacks from
    inside running compiled code too, where dynamo would compile telemetry's frames: compiles the user did not
    ask for and, inside the callback handler's lock, a nested compile that waits on that lock forever."""
    return torch.compiler.disable(function, recursive=True)


def add_compile_callbacks(on_start: Callback, on_end: Callback) -> None:
    callback_handler.register_start_callback(on_start)
    callback_handler.register_end_callback(on_end)


def remove_compile_callbacks(on_start: Callback, on_end: Callback) -> None:
    with contextlib.suppress(ValueError):  # torch._dynamo.reset() clears all callbacks
        callback_handler.remove_start_callback(on_start)
    with contextlib.suppress(ValueError):
        callback_handler.remove_end_callback(on_end)


def compile_start_callbacks() -> Sequence[Callback]:
    return callback_handler.start_callbacks  # torch's live list (read it, do not change it): cheap every step


_TRIGGERS: dict[Any, Literal["dynamo", "lazy_backward"]] = {
    CallbackTrigger.DYNAMO: "dynamo",  # a frame compile
    CallbackTrigger.LAZY_BACKWARD: "lazy_backward",  # its backward graph, compiled at the first backward
}


def callback_trigger(args: Any) -> Literal["dynamo", "lazy_backward"] | None:
    """What compiles, ``None`` for what is not a compilation (runtime autotuning, CUDA-graph recording)."""
    return _TRIGGERS.get(args.callback_trigger)


# -- compiling a module in place -------------------------------------------------------------------
def compile_in_place(module: torch.nn.Module, **torch_kwargs: Any) -> None:
    """``module.compile(**torch_kwargs)`` (``state_dict`` keys unchanged); for torch's own layers (whose ``forward``
    dynamo skips) a function of ours per layer class: its own frame on every release, shared by its instances."""
    if not forward_is_skipped(module):
        module.compile(**torch_kwargs)
        return
    key = (type(module), repr(sorted(torch_kwargs.items())))
    compiled = _COMPILED_LAYERS.get(key)
    if compiled is None:
        compiled = _COMPILED_LAYERS[key] = torch.compile(_layer_call(type(module)), **torch_kwargs)
    set_compiled_call(module, functools.partial(compiled, module))


def check_compile_arguments(**torch_kwargs: Any) -> None:
    """Raise what ``torch.compile(**torch_kwargs)`` raises for bad arguments, compiling nothing."""
    torch.compile(lambda: None, **torch_kwargs)


def forward_is_skipped(module: torch.nn.Module) -> bool:
    """Whether dynamo skips ``module.forward`` (it lies in torch's own files)."""
    from torch._dynamo import trace_rules

    return bool(trace_rules.check(module.forward))


def forward_disabled(module: torch.nn.Module) -> bool:
    """Whether ``module.forward`` is ``torch.compiler.disable``-d (the class's method decorated, or the instance's
    wrapped), so dynamo compiles nothing of it or of what it calls. torch marks the wrapper ``_torchdynamo_disable``
    (2.x through 2.15); ``recursive=False`` (marked ``_torchdynamo_disable_recursive = False`` from 2.9, a skipped
    code object before) skips the frame alone, and what it calls is still compiled."""
    forward = getattr(module, "forward", None)  # a bound method reads its function's attributes
    return getattr(forward, "_torchdynamo_disable", False) is True and (
        getattr(forward, "_torchdynamo_disable_recursive", True) is not False
    )


def compiles_a_disabled_forward(module: torch.nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile(inner)`` (an ``OptimizedModule``) of a module whose forward is disabled
    (:func:`forward_disabled`), or such a module compiled in place by ``Module.compile()``: dynamo compiles the call
    around it at most, never the forward."""
    optimized = getattr(torch._dynamo.eval_frame, "OptimizedModule", None)
    inner = getattr(module, "_orig_mod", None)
    if optimized is not None and isinstance(module, optimized) and isinstance(inner, torch.nn.Module):
        return forward_disabled(inner)
    return compiled_in_place(module) and forward_disabled(module)


# Module.compile() of torch's own layers compiles nothing before 2.15 (pytorch/pytorch#150915); measured on 2.8,
# 2.13 (nothing) and 2.15 (one frame, Module._call_impl, shared by every layer class)
MODULE_COMPILE_TRACES_TORCH_LAYERS = VERSION >= (2, 15)
_CALL_IMPL = torch.nn.Module._call_impl


def compiling_disabled() -> str:
    """Why dynamo compiles nothing in this process, in words (``TORCH_COMPILE_DISABLE=1``, its config); ``""``
    where it compiles."""
    config = getattr(getattr(torch, "_dynamo", None), "config", None)
    if not getattr(config, "disable", False):
        return ""
    if os.environ.get("TORCH_COMPILE_DISABLE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "TORCH_COMPILE_DISABLE=1"
    return "torch._dynamo.config.disable = True"


def compiles_nothing(module: torch.nn.Module) -> bool:
    """Whether ``module.compile()`` installed what ``module(...)`` runs and this torch compiles nothing of it."""
    if MODULE_COMPILE_TRACES_TORCH_LAYERS:
        return False
    # a disabled forward is skipped too, but for its own reason (compiles_a_disabled_forward)
    return compiled_in_place(module) and forward_is_skipped(module) and not forward_disabled(module)


def compiled_in_place(module: torch.nn.Module) -> bool:
    """Whether ``module.compile()`` installed what ``module(...)`` runs."""
    # Module.compile() installs torch.compile(self._call_impl), which keeps what it wraps (torch 2.15: a function
    # that functools.wraps the bound method)
    wrapped = getattr(compiled_call(module), "_torchdynamo_orig_callable", None)
    wrapped = getattr(wrapped, "__wrapped__", wrapped)
    return getattr(wrapped, "__self__", None) is module and getattr(wrapped, "__func__", None) is _CALL_IMPL


def _calls_its_module(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module._call_impl(*args, **kwargs)


_COMPILED_LAYERS: dict[tuple[type, str], Callable[..., Any]] = {}
LAYER_FRAMES: dict[str, str] = {}  # "Linear.forward" -> where the class's forward is: the frames compile_in_place makes


def _layer_call(cls: type) -> Callable[..., Any]:
    """:func:`_calls_its_module` as its own code object ``<Class>.forward``: dynamo keys and names frames by it."""
    name = f"{cls.__name__}.forward"
    forward = getattr(getattr(cls, "forward", None), "__code__", None)
    LAYER_FRAMES[name] = f"{forward.co_filename}:{forward.co_firstlineno}" if forward is not None else ""
    qualname: dict[str, Any] = {"co_qualname": name} if sys.version_info >= (3, 11) else {}
    code = _calls_its_module.__code__.replace(co_name=name, **qualname)
    return types.FunctionType(code, _calls_its_module.__globals__, name)


def frame_where(name: str, filename: str, first_line: int, closure: Any = None) -> tuple[str, str]:
    """``(name, "file:line")`` of a compiled frame as the user knows it: a layer of :func:`compile_in_place`, or
    a module dynamo's ``wrap_inline`` wraps (its ``closure`` holds it), by its class's ``forward``."""
    where = LAYER_FRAMES.get(name) if filename == __file__ else None
    if where is not None:
        return name, where
    if name == "inner" and filename.replace("\\", "/").endswith("torch/_dynamo/external_utils.py") and closure:
        wrapped = getattr(closure[0], "cell_contents", None)
        module = getattr(wrapped, "__self__", wrapped)
        forward = getattr(getattr(type(module), "forward", None), "__code__", None)
        if isinstance(module, torch.nn.Module) and forward is not None:
            return f"{type(module).__name__}.forward", f"{forward.co_filename}:{forward.co_firstlineno}"
    return name, f"{filename}:{first_line}"


# -- nn.Module.compile's hook ---------------------------------------------------------------------
def compiled_call(module: torch.nn.Module) -> Callable[..., Any] | None:
    """What ``module(...)`` runs instead of its own ``_call_impl`` since ``module.compile()`` (or ``None``)."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: torch.nn.Module, call: Callable[..., Any] | None) -> None:
    """Make ``module(...)`` run ``call``, as ``module.compile()`` does, keeping its ``state_dict`` keys."""
    object.__setattr__(module, "_compiled_call_impl", call)


# -- what torch counted --------------------------------------------------------------------------
def compilation_metrics() -> Sequence[Any]:
    return _dynamo_utils._compilation_metrics  # torch's CompilationMetrics, newest last (the live deque)


def graph_break_counts() -> dict[str, int]:
    return _dynamo_utils.counters["graph_break"]  # graph-break reason -> how often dynamo counted it


def recompile_reason_in_progress() -> str:
    """torch's reason for the recompile now running, before its CompilationMetrics exist."""
    context = _dynamo_utils.get_metrics_context()
    return str(getattr(context, "_metrics", {}).get("recompile_reason") or "")


def last_recompiles_reasons(failures: Sequence[str]) -> tuple[str, ...]:
    """The last recompile's reasons in ``failures`` (one per cache entry at each recompile): from the end back
    to a compile id already seen, in torch's order."""
    reasons: list[str] = []
    seen: set[str] = set()
    # 64 entries at most: torch's recompile_limit is 8; its accumulated limit counts across code objects
    for reason in reversed(failures[-64:]):
        compile_id = reason.split(":", 1)[0]
        if compile_id in seen:
            break
        seen.add(compile_id)
        reasons.append(reason)
    return tuple(reversed(reasons))


def recompile_limit(failure: str = "") -> tuple[str, int | str]:
    """``recompile_limit`` or ``accumulated_recompile_limit``, as torch's ``failure`` text names it, and its value
    (``"?"`` where a torch renamed it: the warning that the frame runs eagerly still goes out)."""
    name = "accumulated_recompile_limit" if "accumulated" in failure.lower() else "recompile_limit"
    limit = getattr(torch._dynamo.config, name, None)
    return name, int(limit) if limit is not None else "?"


# -- the compile in progress ---------------------------------------------------------------------
def _compile_frame() -> FrameType | None:
    """dynamo's ``_compile`` frame of the compile in progress (its arguments alike from 2.8 to 2.15), or ``None``."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and not (frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_locals):
        frame = frame.f_back
    return frame


def current_compile() -> tuple[str, tuple[str, str] | None, dict[str, str | bool], tuple[str, ...], tuple[str, ...]]:
    """The backend name, the frame (:func:`frame_where`), the options (:func:`_options`), the callers (``file:line``,
    outermost first, dynamo's left out) and why each cache entry refused the call (torch's ``guard_failures``) of
    the compile in progress, from dynamo's ``_compile`` frame."""
    frame = _compile_frame()
    if frame is None:
        return "", None, _options(None, None), (), ()
    backend = frame.f_locals["compiler_fn"]
    while hasattr(backend, "_torchdynamo_orig_backend"):  # torch >= 2.10's eval_frame.innermost_backend (2.8 lacks it)
        backend = backend._torchdynamo_orig_backend
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)
    code = frame.f_locals.get("code")
    where = (
        frame_where(code.co_name, code.co_filename, code.co_firstlineno, frame.f_locals.get("closure"))
        if isinstance(code, CodeType)
        else None
    )
    callers: list[str] = []
    caller: FrameType | None = frame
    while caller is not None and len(callers) < 48:
        if "/torch/_dynamo/" not in caller.f_code.co_filename.replace("\\", "/"):
            callers.append(f"{caller.f_code.co_filename}:{caller.f_lineno}")
        caller = caller.f_back
    failures = _dynamo_utils.guard_failures.get(code, ()) if code is not None else ()
    name = str(name or type(backend).__name__)
    return name, where, _options(frame, backend), tuple(reversed(callers)), last_recompiles_reasons(failures)


def compile_caller() -> tuple[str, bool | None]:
    """Whose call the compile in progress compiles, and whether its graph can need a backward graph (``None``:
    unknown). The caller is the kind and parameter shapes of each module the compiled frame receives (``self``, an
    argument, the module ``torch.compile(module)`` wraps in a closure), hashed: two networks sharing one ``forward``
    are two callers, each with cache entries of its own, and two layers of one shape are one (an entry serves both).
    A backward graph needs gradients on and a tensor that needs them among the inputs and parameters: AOTAutograd's
    own test, so a frozen generator's compile builds an inference graph only."""
    frame = _compile_frame()
    if frame is None:
        return "", None
    values = list((frame.f_locals.get("locals") or {}).values())
    for cell in frame.f_locals.get("closure") or ():
        with contextlib.suppress(ValueError):  # an empty cell
            values.append(cell.cell_contents)
    modules: dict[int, torch.nn.Module] = {}
    tensors: list[torch.Tensor] = []
    for value in values:
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            owner = getattr(item, "__self__", item)  # a bound method's module
            if isinstance(owner, torch.nn.Module):
                modules.setdefault(id(owner), owner)
            elif isinstance(item, torch.Tensor):
                tensors.append(item)
    try:
        kinds = [(type(m).__qualname__, [tuple(p.shape) for p in m.parameters()]) for m in modules.values()]
        trainable = [p.requires_grad for module in modules.values() for p in module.parameters()]
    except Exception:  # noqa: BLE001 - a parameter not yet materialized (a lazy module) has no shape to read
        return "", None
    grad = torch.is_grad_enabled()
    inputs = "".join("1" if t.requires_grad else "0" for t in tensors)
    # "<modules>/<grad mode><inputs needing gradients>/<parameters needing gradients>"
    caller = f"{_digest(kinds)}/{grad:d}{inputs}/{_digest(trainable)}"
    return caller, grad and (any(trainable) or "1" in inputs)


def _digest(value: object) -> str:
    return hashlib.blake2b(repr(value).encode(), digest_size=6).hexdigest()


# the ShapeEnv's INFO lines naming a symbol's source and a symbol fixed to one value (TORCH_LOGS=dynamic prints
# them): "create_symbol s53 = 24 for L['x'].size()[2] ...", "set_replacement s53 = 24 (range_refined_to_singleton)"
SHAPE_LOGGER = "torch.fx.experimental.symbolic_shapes"


def parse_shape_decision(record: logging.LogRecord) -> tuple[str, str, str, str] | None:
    """``("symbol", symbol, source, "")`` for a symbol created, ``("fixed", symbol, value, why)`` for a symbol torch
    replaced by a number (its specialization), ``None`` for other records: read from the record's arguments, not
    its text (formatting every record would cost each compile)."""
    args = record.args if isinstance(record.args, tuple) else ()
    message = record.msg if isinstance(record.msg, str) else ""
    if message.startswith("create_symbol") and len(args) >= 3:
        return "symbol", str(args[0]), str(args[2]), ""
    if message.startswith("set_replacement") and len(args) >= 3 and getattr(args[1], "is_Integer", False):
        return "fixed", str(args[0]), str(args[1]), str(args[2])
    return None


def _options(frame: FrameType | None, backend: Any) -> dict[str, str | bool]:
    """``dynamic`` (``"true"``, ``"false"`` or ``"auto"``: torch.compile patches dynamo's config around the call),
    ``fullgraph`` (``_compile``'s ``one_graph``) and, for inductor, ``mode`` of the compile running."""
    config = torch._dynamo.config
    dynamic = "true" if not config.assume_static_by_default else "auto" if config.automatic_dynamic_shapes else "false"
    options: dict[str, str | bool] = {"dynamic": dynamic}
    if frame is None:
        return options
    options["fullgraph"] = bool(frame.f_locals.get("one_graph"))
    settings = getattr(backend, "config", None)
    if getattr(backend, "compiler_name", None) == "inductor" and isinstance(settings, dict):
        options["mode"] = _inductor_mode(settings)
    return options


def _inductor_mode(settings: dict[str, Any]) -> str:
    """The ``mode`` whose options ``settings`` (an inductor backend's) hold: the most specific that matches."""
    from torch._inductor import list_mode_options

    modes = ("max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead")
    try:
        found = [mode for mode in modes if list_mode_options(mode).items() <= settings.items()]
    except Exception:  # noqa: BLE001 - an option's value == cannot answer (an array): the mode alone is not said
        return ""
    return max(found, key=lambda mode: len(list_mode_options(mode)), default="default")


def traced_stack() -> tuple[str, ...]:
    """Where dynamo is tracing now (``file:line``, outermost first); empty outside a trace."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    return tuple(f"{frame.filename}:{frame.lineno}" for frame in (context.extract_stack() if context else ()))


def frames_compiled() -> int:
    """How many frames dynamo has compiled so far."""
    return int(_dynamo_utils.counters["frames"]["ok"])


def frames_attempted() -> int:
    """How many frames dynamo has set out to compile so far (those whose compile raised, too)."""
    return int(_dynamo_utils.counters["frames"]["total"])


def has_compiled_code_for(module: torch.nn.Module) -> bool:
    """Whether dynamo holds compiled code for ``module``'s ``forward``, a submodule's (a graph break inside one
    compiles that frame), or the layer call :func:`compile_in_place` gave its class."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = list({getattr(type(m).forward, "__code__", None) for m in module.modules()})
    codes += [
        getattr(getattr(compiled, "_torchdynamo_orig_callable", None), "__code__", None)
        for (cls, _), compiled in _COMPILED_LAYERS.items()
        if cls is type(module)
    ]
    return any(code is not None and _debug_get_cache_entry_list(code) for code in codes)


def frames_holding_compiled_code() -> list[tuple[str, str]]:
    """``(name, "file:line")`` of each frame dynamo holds compiled code for now, graph breaks' resume functions
    (``torch_dynamo_resume_in_forward_at_58``) left out (``convert_frame.input_codes``, 2.8 - 2.15)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    frames = []
    for reference in list(convert_frame.input_codes.seen):
        code = reference()
        if code is None or code.co_name.startswith("torch_dynamo_resume_in_") or not _debug_get_cache_entry_list(code):
            continue
        frames.append(frame_where(code.co_name, code.co_filename, code.co_firstlineno))  # named as the tables name it
    return frames


def current_compile_id() -> str:
    """The id of the compile in progress as the compile callbacks name it (``"0/1"``), or ``""``."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return "" if compile_id is None else str(compile_id)


def eager_graph_modules() -> contextlib.AbstractContextManager[None]:
    """GraphModules built inside generate their code at once: thunder's interpreter cannot trigger the lazy way."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(False)


# -- compile ids: "<frame>/<attempt>", with prefixes for compiled autograd ("!0/1") and suffixes for restarts --
def compile_frame_id(compile_id: str) -> str:
    """The frame's part of a compile id (``"3"`` of ``"3/1"``): the same for every compile of one frame."""
    return compile_id.rsplit("/", 1)[0] if "/" in compile_id else ""


def compile_attempt(compile_id: str) -> int:
    """Which compile of its frame (``1`` of ``"3/1"``, ``"3/1_2"``): 0 is the first, more are recompiles."""
    digits = re.match(r"\d+", compile_id.rsplit("/", 1)[-1])
    return int(digits.group()) if digits else 0


# -- log records: the only place that names a graph break's user line, and DDPOptimizer's buckets --
GRAPH_BREAK_LOGGERS = ("torch._dynamo.symbolic_convert", "torch._dynamo.convert_frame")
DDP_LOGGER = "torch._dynamo.backends.distributed"
_BREAK_LOCATION = re.compile(r"in user code at (.+?):(\d+)\s*\nGraph Break Reason: (.*)", re.DOTALL)
_DDP_BUCKETS_MESSAGE = "DDPOptimizer used bucket cap"
# dynamo giving up on an outer frame, which the inner frame's compile reports again: torch >= 2.10
# logs it as a graph break of its own; older torch logs the inner break, then an INFO line
GRACEFUL_SKIP = "Failed to handle graph break gracefully"
FRAME_SKIP_LOGGER = "torch._dynamo.symbolic_convert"
_FRAME_SKIP_MESSAGE = "Skipping frame because there is a graph break in a for/while loop"


def graph_break_loggers() -> list[logging.Logger]:
    import torch._logging

    return [torch._logging.getArtifactLogger(module, "graph_breaks") for module in GRAPH_BREAK_LOGGERS]


def parse_graph_break(record: logging.LogRecord) -> tuple[str, str] | None:
    """``("file:line", reason)`` from a ``graph_breaks`` artifact record, ``None`` for other records."""
    match = _BREAK_LOCATION.search(record.getMessage())
    return (f"{match.group(1)}:{match.group(2)}", match.group(3)) if match else None


def is_frame_skip(record: logging.LogRecord) -> bool:
    """Whether dynamo skipped the frame it traced (torch < 2.10): its graph breaks come again in the inner frame."""
    return _FRAME_SKIP_MESSAGE in str(record.msg)


# INFO lines saying why a compile could not use a cache: (logger, message prefix, which cache)
_CACHE_BYPASS = (
    ("torch._inductor.codecache", "Bypassing FX Graph Cache because", "fx_graph"),
    ("torch._functorch._aot_autograd.autograd_cache", "Bypassing autograd cache due to", "aot_autograd"),
)
CACHE_BYPASS_LOGGERS = tuple(dict.fromkeys(logger for logger, _, _ in _CACHE_BYPASS))


def parse_cache_bypass(record: logging.LogRecord) -> str | None:
    """``"<cache>: <torch's reason>"`` from a cache-bypass INFO record, ``None`` for other records."""
    for logger, prefix, cache in _CACHE_BYPASS:
        if record.name == logger and str(record.msg).startswith(prefix):
            reason = record.args[0] if isinstance(record.args, tuple) and record.args else record.getMessage()
            return f"{cache}: {reason}"
    return None


def parse_ddp_buckets(record: logging.LogRecord) -> tuple[int, int] | None:
    """``(bucket cap in bytes, buckets)`` from DDPOptimizer's INFO record, ``None`` for other records."""
    if _DDP_BUCKETS_MESSAGE not in str(record.msg):
        return None
    cap, buckets = record.args if isinstance(record.args, tuple) else (0, 0)
    return int(str(cap)), int(str(buckets))


# -- CompilationMetrics fields -------------------------------------------------------------------
_FALLBACK_FAILURES = ("Unsupported", "SkipFrame", "RecompileLimitExceeded", "FailOnRecompileLimitHit")
_LIMIT_MARKERS = ("recompile limit", "recompile_limit", "cache_size_limit", "cache size limit")
_PHASES = (
    ("dynamo", "entire_frame_compile_time_s", 1.0),
    ("backend", "backend_compile_time_s", 1.0),
    ("inductor", "inductor_compile_time_s", 1.0),
    ("backward", "backward_cumulative_compile_time_us", 1e-6),
)
_COUNTS = ("graph_op_count", "guard_count", "num_graph_breaks")
# compile.cache.<ours> <- CompilationMetrics.<torch's>; the local counts are absent before torch 2.9
_CACHE = (
    ("fx_graph_local_hits", "inductor_fx_local_cache_hit_count"),
    ("fx_graph_local_misses", "inductor_fx_local_cache_miss_count"),
    ("fx_graph_remote_hits", "inductor_fx_remote_cache_hit_count"),
    ("fx_graph_remote_misses", "inductor_fx_remote_cache_miss_count"),
    ("aot_autograd_local_hits", "aotautograd_local_cache_hit_count"),
    ("aot_autograd_local_misses", "aotautograd_local_cache_miss_count"),
    ("aot_autograd_remote_hits", "aotautograd_remote_cache_hit_count"),
    ("aot_autograd_remote_misses", "aotautograd_remote_cache_miss_count"),
    ("time_saved_s", "remote_cache_time_saved_s"),  # torch's figure, local hits included
)


def phase_times(metric: Any) -> dict[str, float]:
    """Seconds per compile phase that torch measured for this compile."""
    return {
        phase: float(value) * scale
        for phase, name, scale in _PHASES
        if (value := getattr(metric, name, None)) is not None
    }


def duration_ns(metric: Any) -> int | None:
    """The compile's duration as torch reports it (``duration_us``, what tlparse shows); None where absent."""
    value = getattr(metric, "duration_us", None)
    return int(value) * 1000 if isinstance(value, int) and value >= 0 else None


def counts(metric: Any) -> dict[str, int]:
    return {name: int(value) for name in _COUNTS if (value := getattr(metric, name, None)) is not None}


_MAX_INPUT_SHAPES = 16
_NODE_SHAPE = re.compile(r"'(l_\w*)': \[([^\]]*)\]")  # an input's entry in the repr of graph_node_shapes


def input_shapes(metric: Any) -> list[str]:
    """The graph's input shapes as torch decided them (``x: [s77, 4]``: a symbol is a dynamic dimension), from
    ``CompilationMetrics.graph_node_shapes``, parameters and buffers left out; empty where torch lacks it."""
    shapes = getattr(metric, "graph_node_shapes", None)
    said: list[str] = []
    # torch writes the repr of every node's shape: megabytes for a large model, which parsing whole would cost the
    # training step a second; only the inputs' entries are read
    for found in _NODE_SHAPE.finditer(shapes if isinstance(shapes, str) else ""):
        name, shape = found[1], [dim.strip().strip("'") for dim in found[2].split(",") if dim.strip()]
        if len(said) == _MAX_INPUT_SHAPES:
            break
        if "_parameters_" not in name and "_buffers_" not in name:  # not a module's own tensor (static by default)
            argument = re.sub(r"^(args|kwargs)_(\w+)$", r"\1[\2]", name.removeprefix("l_").removesuffix("_"))
            said.append(f"{argument}: [{', '.join(shape)}]")  # as the user wrote it: l_x_ is x, l_args_0_ args[0]
    return said


def cache_outcome(metric: Any) -> dict[str, float]:
    """What the FX graph and AOTAutograd caches did for this compile: hits, misses, time saved (what torch filled)."""
    return {ours: value for ours, name in _CACHE if (value := getattr(metric, name, None)) is not None}


def failure(metric: Any) -> tuple[str, bool, bool]:
    """``(torch's failure text, fell back to eager, hit the recompile limit)``; under ``suppress_errors`` every
    failure falls back to eager."""
    fail_type = getattr(metric, "fail_type", None) or ""
    text = (getattr(metric, "fail_reason", None) or fail_type) if fail_type else ""
    suppressed = bool(fail_type) and bool(getattr(metric, "config_suppress_errors", False))
    return text, fail_type in _FALLBACK_FAILURES or suppressed, any(marker in text.lower() for marker in _LIMIT_MARKERS)


# -- what this torch cannot tell -----------------------------------------------------------------
def _unavailable() -> dict[str, str]:
    missing = {}
    if not hasattr(torch._dynamo.exc, "get_gbid_documentation_link"):
        missing["graph_break.doc_url"] = "graph-break documentation links"
    fields = {f.name for f in dataclasses.fields(_dynamo_utils.CompilationMetrics)}
    facts = [(f"time.{fact}", name) for fact, name, _ in _PHASES] + [(name, name) for name in _COUNTS]
    facts += [(f"cache.{ours}", name) for ours, name in _CACHE]
    facts.append(("input_shapes", "graph_node_shapes"))  # absent on torch 2.8: which frames compiled dynamic
    missing.update((fact, f"CompilationMetrics.{name}") for fact, name in facts if name not in fields)
    return missing


UNAVAILABLE: dict[str, str] = _unavailable()  # fact -> the torch field it would come from


def version_notes() -> list[str]:
    """What a user of this torch is told once: a release outside the tested range, facts it does not expose."""
    notes = []
    if not _FIRST <= VERSION <= _LAST:
        notes.append(
            f"telemetry-jit: torch {torch.__version__} is outside the tested {SUPPORTED}; compile telemetry may be "
            "incomplete (see docs/compatibility.md)."
        )
    if UNAVAILABLE:
        notes.append(
            f"telemetry-jit: torch {torch.__version__} does not record {', '.join(UNAVAILABLE.values())}; "
            "compilation spans list these as compile.unavailable."
        )
    return notes
