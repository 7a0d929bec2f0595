"""What one rank of a distributed job publishes about itself on the job's store, for the rank watcher:
where it is, what it is compiling and since when, and the graphs it compiled (as hashes), in a few
hundred bytes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, astuple, dataclass, field

from telemetry_jit.causes import normalize_reason
from telemetry_jit.records import CompileRecord

KEY_PREFIX = "telemetry_jit/heartbeat/"
PARTS_PREFIX = "telemetry_jit/cache_parts/"  # a rank's newest look-ups' key parts, read only when a miss is judged
# a table of settings parts (~600 parts, ~40 KB) by its digest: written by the first rank that has it, once a job
SETTINGS_PREFIX = "telemetry_jit/cache_settings/"
GRAPHS_KEPT = 16  # the newest graphs a heartbeat carries; the watcher keeps what it has seen of the rest
SETTINGS_PART = "@settings"  # the part naming a look-up's settings table by digest
LOOKUPS_KEPT = 4  # the newest compile-cache look-ups a heartbeat carries (a compile makes one to three)
_TEXT_LIMIT = 240
_ADDRESS = re.compile(r"\d{8,}|0x[0-9a-f]+")  # object ids in a guard's text: each process has its own


def heartbeat_key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}"


def parts_key(rank: int) -> str:
    return f"{PARTS_PREFIX}{rank}"


def settings_key(digest: str) -> str:
    return f"{SETTINGS_PREFIX}{digest}"


def compile_hash(description: str) -> str:
    """The compile a description names (``forward (model.py:36) [0/0]``), as a hash equal on every rank that
    compiles the same frame at the same compile id (object addresses in a reason's text left out)."""
    return hashlib.blake2b(_ADDRESS.sub("#", description).encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class Looked:
    """One compile-cache look-up of a rank's compile; its key's parts are published apart (:func:`parts_key`)."""

    compile: str  # compile_hash of what compiled
    layer: str  # aot_autograd, fx_graph
    n: int  # its place among that compile's look-ups in layer
    state: str
    key: str  # the start of torch's key
    saved_s: float = 0.0  # what a hit saved: the entry's cold compile, as torch timed it

    @property
    def graph(self) -> str:
        """The graph looked up: the same on every rank that looks up the same graph."""
        return f"{self.compile}|{self.layer}|{self.n}"


@dataclass(frozen=True)
class Graph:
    """One graph a rank compiled (the same graph on two ranks hashes the same); ``why``: a first compile, or
    the recompile's reason."""

    hash: str
    step: int
    frame: str
    why: str


def graph_of(record: CompileRecord) -> Graph:
    """A finished compilation as a :class:`Graph`. The hash reads what every rank compiling the same graph
    shares (frame, its file's name and line, the kind of compile, the graph's op count and breaks, the guard
    that failed for a recompile), never a compile id, a path, an object's address or a device, which differ
    between the ranks of one job."""
    location = record.location.rsplit("/", 1)[-1]
    ops = record.extra.get("graph_op_count", -1)
    reason = normalize_reason(record.recompile_reason) if record.is_frame_recompile else ""
    identity = (
        f"{record.frame}|{location}|{record.trigger}|{ops}|{len(record.graph_breaks)}|{_ADDRESS.sub('#', reason)}"
    )
    digest = hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()
    frame = record.frame or record.frame_id
    if record.trigger == "lazy_backward":
        frame = f"the backward graph of {frame}"
    why = f"recompile: {reason or 'unknown reason'}" if record.is_frame_recompile else "first compile"
    step = record.context.global_step if record.context is not None else 0
    return Graph(digest, step, _short(frame), _short(why))


@dataclass
class Heartbeat:
    """One rank's state as published; ``seq`` grows with every publication (the watcher's clock, not the
    rank's, times what it sees: the ranks' clocks need not agree)."""

    rank: int
    seq: int = 0
    step: int = 0
    stage: str = ""
    compiling: str = ""  # what is compiling now ("" when nothing), in the recorder's words
    compiling_s: float = 0.0  # for how long, when published
    compiles: int = 0  # compilations begun so far: tells one compile from the next of the same frame
    last_compile_s: float = 0.0  # how long the last finished compilation took
    longest_compile_s: float = 0.0
    graph_count: int = 0  # graphs recorded so far; ``graphs`` holds the newest of them
    graphs: list[Graph] = field(default_factory=list)
    lookups: list[Looked] = field(default_factory=list)  # the newest compile-cache look-ups
    ended: str = ""  # "" while running; "finished", or "failed: <error>" at the end

    def encode(self) -> bytes:
        data = asdict(self)
        data["lookups"] = [astuple(looked) for looked in self.lookups]  # lists, not objects: half the bytes
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Heartbeat | None:
        """The heartbeat in ``raw``; ``None`` for what no publisher wrote (another version, a cut value)."""
        try:
            data = json.loads(raw)
            graphs = [Graph(str(g["hash"]), int(g["step"]), str(g["frame"]), str(g["why"])) for g in data["graphs"]]
            lookups = [
                Looked(str(compile_), str(layer), int(n), str(state), str(key), float(saved_s))
                for compile_, layer, n, state, key, saved_s in data.get("lookups", ())
            ]
            # each scalar field converted to its default's type: what another version wrote fails here
            scalars = {
                name: type(default)(data[name])
                for name, default in asdict(cls(0)).items()
                if name not in ("graphs", "lookups")
            }
            return cls(**scalars, graphs=graphs, lookups=lookups)
        except (ValueError, TypeError, KeyError):
            return None


Parts = dict[str, tuple[str, str]]  # a key's parts: name -> (torch's hash of it, its value where short, else "")


def encode_parts(parts: Mapping[str, Parts | str]) -> bytes:
    """``graph -> parts`` (or a settings table: ``name -> (hash, value)``) as published."""
    return json.dumps(parts, separators=(",", ":")).encode()


def decode_parts(raw: bytes) -> dict[str, Parts]:
    """What :func:`encode_parts` wrote: graph (or name) -> parts; ``{}`` for anything else."""
    try:
        data = json.loads(raw)
        return {
            str(graph): {str(name): (str(part[0]), str(part[1])) for name, part in parts.items()}
            for graph, parts in data.items()
            if isinstance(parts, dict)
        }
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return {}


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."
