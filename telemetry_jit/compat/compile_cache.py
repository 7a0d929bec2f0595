"""torch's compile-cache look-ups as they happen: which cache, hit, miss or bypass, the key and the parts torch
hashed into it (torch 2.8 - 2.15), from ``ChromiumEventLogger.log_instant_event`` (``autograd_cache_<state>``,
``fx_graph_cache_<state>``; a part is a line ``[<hash>] <name>: <value>``). torch >= 2.13 computes AOTAutograd's
parts only while its logger is open to DEBUG (the dynamo probe's log tap opens it); torch 2.8 - 2.12 send its
event after compiling the graph it missed, so a miss is also read from torch's log (:func:`read_log`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo import utils as _dynamo_utils
from torch._prims_common import make_contiguous_strides_for

_EVENT = re.compile(r"(autograd|fx_graph)_cache_(hit|miss|bypass)")  # an instant event that is a look-up
_LAYERS = {"autograd": "aot_autograd", "fx_graph": "fx_graph"}
_STATES = ("hit", "miss", "bypass")
_PART = re.compile(r"\[(\w+)\] ([^:\n]+): (.*)", re.DOTALL)
_TENSOR = re.compile(
    r"TensorMetadata\(dtype=torch\.(\w+), shape=torch\.Size\(\[([^\]]*)\]\), stride=(\([^)]*\)), "
    r"device=device\(type='(\w+)'(?:, index=(\d+))?\)"
)
_SIGNATURE = re.compile(r"def forward\(self, ([^)]*)\)")
_COLLECTIVE = re.compile(r"_c10d_functional\.\w+(?:\.\w+)?\(([^()]*)\)")  # its last text argument: the group's name
PROCESS_GROUPS = "gm[process_groups]"  # the names of the process groups the graph's collectives name, from its code
HASH_CHARS = 10  # of torch's 52-character part hashes: enough to tell two values apart
_VALUE_CHARS = 120  # a longer value (the graph's code, a pickled config) is kept as its hash only
# parts that form one group of settings: written once per fit as a table, each look-up names the table's digest
SETTINGS_GROUPS = ("inductor_config", "inductor_config_comms", "functorch_config", "autograd_config")


@dataclass
class Lookup:
    """One look-up in one compile cache."""

    layer: str  # "aot_autograd" or "fx_graph"
    state: str  # "hit", "miss" or "bypass"
    key: str = ""
    parts: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (hash, readable value or "")
    settings: dict[str, tuple[str, str]] = field(default_factory=dict)  # the parts of :data:`SETTINGS_GROUPS`
    bypass_reason: str = ""
    saved_s: float = 0.0  # what a hit saved, as torch measured the original compile
    loaded: bool = False  # its key came with artifacts loaded by torch.compiler.load_cache_artifacts
    settings_digest: str = ""  # :func:`settings_digest` of ``settings``, computed once for every listener


Listener = Callable[[Lookup], None]
_listeners: list[Listener] = []
_installed: tuple[Any, Any] | None = None  # (our wrapper, what it wraps)
AOT_LOGGER = "torch._functorch._aot_autograd.autograd_cache"
_AOT_PARTS = "Autograd graph cache hash details for key"
_AOT_MISS = "AOTAutograd cache miss for key"
_PART_START = re.compile(r"\n(?=\[\w+\] [^:\n]+: )")  # a part's value may hold newlines (the graph's code)
_aot_parts: tuple[str, str] = ("", "")  # the last key whose parts torch logged, and their text
_told_from_log = ""  # the key of an AOTAutograd miss told from the log: its later event is not told again


def watch(listener: Listener) -> None:
    """Tell ``listener`` every cache look-up until :func:`unwatch`."""
    global _installed
    if listener not in _listeners:
        _listeners.append(listener)
    if _installed is None:
        previous = _dynamo_utils.ChromiumEventLogger.log_instant_event

        def log_instant_event(self: Any, event_name: str, *args: Any, **kwargs: Any) -> Any:
            if _listeners and event_name.endswith(_STATES):
                _tell(event_name, kwargs.get("metadata", args[1] if len(args) > 1 else None))
            return previous(self, event_name, *args, **kwargs)

        wrapper = torch.compiler.disable(log_instant_event, recursive=True)  # see compat.torch.never_traced
        _dynamo_utils.ChromiumEventLogger.log_instant_event = wrapper  # type: ignore[method-assign]
        _installed = (wrapper, previous)


MAX_LOADED_KEYS = 100_000
_loaded_keys: set[str] = set()
_loading_watched = False


def watch_loaded_artifacts() -> None:
    """Remember the keys of every mega-cache artifact loaded from now on, whatever name loads it."""
    global _loading_watched
    if _loading_watched:
        return
    from torch.compiler._cache import CacheArtifactManager as manager

    previous = manager.populate_caches

    def populate_caches(artifacts: Any) -> Any:
        info = previous(artifacts)
        with contextlib.suppress(Exception):  # loading the artifacts must never fail because of telemetry
            for keys in dict(info.artifacts).values():
                _loaded_keys.update(str(key) for key in keys[: max(MAX_LOADED_KEYS - len(_loaded_keys), 0)])
        return info

    manager.populate_caches = staticmethod(populate_caches)  # type: ignore[method-assign]
    _loading_watched = True


def unwatch(listener: Listener) -> None:
    """Stop telling ``listener``; with none left, torch's method is put back (unless another tool wrapped ours)."""
    global _installed
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners and _installed is not None:
        wrapper, previous = _installed
        if _dynamo_utils.ChromiumEventLogger.log_instant_event is wrapper:
            _dynamo_utils.ChromiumEventLogger.log_instant_event = previous  # type: ignore[method-assign]
            _installed = None


def read_log(record: logging.LogRecord) -> None:
    """Tell an AOTAutograd cache miss from :data:`AOT_LOGGER`'s records, before the graph compiles; never raises."""
    global _aot_parts, _told_from_log
    try:
        if record.name != AOT_LOGGER or not _listeners or not isinstance(record.args, tuple) or not record.args:
            return
        message = str(record.msg)
        if message.startswith(_AOT_PARTS) and len(record.args) == 2:
            _aot_parts = (str(record.args[0]), str(record.args[1]))  # a LazyString: the parts' lines
        elif message.startswith(_AOT_MISS):
            key = str(record.args[0])
            text = _aot_parts[1] if _aot_parts[0] == key else ""
            _told_from_log = key
            _tell_lookup(_lookup("aot_autograd", "miss", {"key": key, "components": _PART_START.split(text)}))
    except Exception:  # noqa: BLE001, S110 - telemetry loses one look-up, the compile goes on
        pass


def _tell(event_name: str, metadata: Any) -> None:
    global _told_from_log
    try:  # a reworded look-up must never fail the compile it describes
        lookup = parse_lookup(event_name, metadata)
        if lookup is not None and (lookup.layer, lookup.state, lookup.key) == ("aot_autograd", "miss", _told_from_log):
            _told_from_log = ""
            return  # told already, from torch's log, before it compiled
        _tell_lookup(lookup)
    except Exception:  # noqa: BLE001, S110 - telemetry loses one look-up, the compile goes on
        pass


def _tell_lookup(lookup: Lookup | None) -> None:  # its callers catch what a listener raises
    if lookup is not None:
        for listener in list(_listeners):
            listener(lookup)


def parse_lookup(event_name: str, metadata: Any) -> Lookup | None:
    """A :class:`Lookup` from an instant event's name and ``CacheInfo``; ``None`` for other events."""
    found = _EVENT.fullmatch(event_name)
    return _lookup(_LAYERS[found[1]], found[2], metadata if isinstance(metadata, dict) else {}) if found else None


def _lookup(layer: str, state: str, info: dict[str, Any]) -> Lookup:
    saved_ns = info.get("time_saved_ns")
    saved_ms = info.get("time_saved_ms")
    parts = parse_parts(info.get("components") or ())
    settings = {name: part for name, part in parts.items() if name.split("[", 1)[0] in SETTINGS_GROUPS}
    return Lookup(
        layer=layer,
        state=state,
        key=str(info.get("key") or ""),
        parts={name: part for name, part in parts.items() if name not in settings},
        settings=settings,
        bypass_reason=str(info.get("cache_bypass_reason") or ""),
        saved_s=float(saved_ns) / 1e9 if saved_ns else float(saved_ms or 0) / 1e3,
        loaded=str(info.get("key") or "") in _loaded_keys,
        settings_digest=settings_digest(settings),
    )


def parse_parts(lines: Any) -> dict[str, tuple[str, str]]:
    """``name -> (hash, value)`` from torch's ``[<hash>] <name>: <value>`` lines, values as :func:`readable`."""
    parts = {}
    parameters: set[int] = set()
    for line in lines:
        match = _PART.match(str(line))
        if match is None:
            continue
        digest, name, value = match.groups()
        name = name.strip()
        if name == "gm" and (signature := _SIGNATURE.search(value)) is not None:
            arguments = signature.group(1).split(", ")
            parameters = {index for index, argument in enumerate(arguments) if "nn.parameter.Parameter" in argument}
        if name == "gm" and (groups := process_groups(value)):
            parts[PROCESS_GROUPS] = (groups, groups)
        # torch hashes its version as bytes: the running torch's own, which it is
        parts[name] = (digest[:HASH_CHARS], torch.__version__ if name == "torch_version" else readable(value))
    for index in parameters:  # the graph's own annotation: which inputs are the model's parameters
        name = f"example_inputs[{index}]"
        if name in parts and parts[name][1]:
            parts[name] = (parts[name][0], f"parameter {parts[name][1]}")
    return parts


def process_groups(code: str) -> str:
    """The process groups a graph's collectives run on, by the names torch bakes into its code: ``"'1', '3'"``."""
    names = {quoted[-1] for arguments in _COLLECTIVE.findall(code) if (quoted := re.findall(r"'([^']*)'", arguments))}
    return ", ".join(f"'{name}'" for name in sorted(names))


def readable(value: str) -> str:
    """A part's value for people: a tensor's metadata as ``float32[32, 16] cpu`` (a stride where not contiguous);
    "" where it is long or not text (its hash still tells whether it changed)."""
    tensor = _TENSOR.match(value)
    if tensor is not None:
        dtype, shape, stride, device, index = tensor.groups()
        contiguous = make_contiguous_strides_for([int(size) for size in re.findall(r"-?\d+", shape)])
        layout = "" if tuple(int(step) for step in re.findall(r"-?\d+", stride)) == contiguous else f" stride {stride}"
        return f"{dtype}[{shape}]{layout} {device}{':' + index if index else ''}"
    if len(value) > _VALUE_CHARS or not value.isprintable():
        return ""
    return value


def settings_digest(settings: dict[str, tuple[str, str]]) -> str:
    """A short name for one table of settings parts: equal tables, equal digests."""
    text = "\n".join(f"{name}={digest}" for name, (digest, _) in sorted(settings.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS] if settings else ""
