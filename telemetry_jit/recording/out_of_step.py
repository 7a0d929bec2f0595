"""A rank's heartbeat (where it is, what it compiles and since when, its graphs as hashes: a few hundred bytes),
and the ranks' heartbeats judged: a rank compiling while others wait (stall), a graph only some compiled
(divergence), a rank gone silent. It reads no store and starts no thread: every judgement is tested with made-up
heartbeats."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, astuple, dataclass, field

from telemetry_jit.causes import normalize_reason
from telemetry_jit.records import AttributeValue, CompileRecord
from telemetry_jit.schema import RanksAttr
from telemetry_jit.terminal import counted, error_text, rank_list

GRAPHS_KEPT = 16  # the newest graphs a heartbeat carries; the watcher keeps what it has seen of the rest
SETTINGS_PART = "@settings"  # the part naming a look-up's settings table by digest
LOOKUPS_KEPT = 4  # the newest compile-cache look-ups a heartbeat carries (a compile makes one to three)
_TEXT_LIMIT = 240
_ADDRESS = re.compile(r"\d{8,}|0x[0-9a-f]+")  # object ids in a guard's text: each process has its own


def heartbeat_key(rank: int) -> str:
    return f"telemetry_jit/heartbeat/{rank}"


def parts_key(rank: int) -> str:
    return f"telemetry_jit/cache_parts/{rank}"  # a rank's newest look-ups' key parts, read only when a miss is judged


def settings_key(digest: str) -> str:
    # a table of settings parts (~600 parts, ~40 KB) by its digest: written by the first rank that has it, once a job
    return f"telemetry_jit/cache_settings/{digest}"


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
    """One graph a rank compiled (equal on two ranks); ``why``: a first compile, or the recompile's reason."""

    hash: str
    step: int
    frame: str
    why: str


def graph_of(record: CompileRecord) -> Graph:
    """A finished compilation as a :class:`Graph`, hashed from what every rank compiling it shares (frame, file
    name and line, kind, op count, breaks, a recompile's guard), never what differs (compile id, path, device)."""
    location = record.location.rsplit("/", 1)[-1]
    ops = record.extra.get("graph_op_count", -1)
    reason = normalize_reason(record.recompile_reason) if record.is_frame_recompile else ""
    digest = compile_hash(f"{record.frame}|{location}|{record.trigger}|{ops}|{len(record.graph_breaks)}|{reason}")
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
            defaults = {name: default for name, default in asdict(cls(0)).items() if name not in ("graphs", "lookups")}
            scalars = {name: type(default)(data[name]) for name, default in defaults.items()}
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


STALL_MARGIN_S = 3.0  # a stall is said this long beyond the longest compile seen so far ...
STALL_MIN_S = 5.0  # ... and never before this
RANKS_KEPT = 64  # ranks named in an event; the count says the rest
HITS_KEPT = 256  # per rank, the newest cache hits remembered beyond what its heartbeat carries
BACKWARD = "the backward graph of "  # how a backward graph's compile is described (probes.dynamo)
CACHE_NAMES = {"aot_autograd": "AOTAutograd's cache", "fx_graph": "inductor's FX graph cache"}
PartsOf = Callable[[int, Looked], "Parts | None"]  # a rank's look-up's key parts, read from the store when asked


@dataclass(frozen=True)
class Finding:
    """One thing said about the ranks: ``kind`` is ``stall``, ``stall_ended``, ``divergent_graph``,
    ``silent``, ``heard_again`` or ``not_ended``; ``ranks`` the ranks it is about, ``waiting`` the ranks
    that waited on them; ``line`` says it in words."""

    kind: str
    ranks: tuple[int, ...]
    line: str
    step: int = 0
    stage: str = ""
    what: str = ""
    why: str = ""
    seconds: float = 0.0
    waiting: tuple[int, ...] = ()
    graph: str = ""

    def attributes(self) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            RanksAttr.KIND: self.kind,
            RanksAttr.RANKS: list(self.ranks[:RANKS_KEPT]),
            RanksAttr.RANK_COUNT: len(self.ranks),
            RanksAttr.STEP: self.step,
            RanksAttr.SECONDS: round(self.seconds, 3),
            RanksAttr.WAITING: len(self.waiting),
            RanksAttr.WAITING_RANKS: list(self.waiting[:RANKS_KEPT]),
            RanksAttr.LINE: self.line,
        }
        optional = {RanksAttr.STAGE: self.stage, RanksAttr.WHAT: self.what, RanksAttr.WHY: self.why}
        attributes.update((name, value) for name, value in {**optional, RanksAttr.GRAPH: self.graph}.items() if value)
        return attributes


@dataclass
class _Rank:
    beat: Heartbeat
    heard_at: float  # the watcher's clock when ``beat.seq`` was first seen
    graphs: dict[str, Graph] = field(default_factory=dict)  # every graph seen of it, by hash
    graphs_lost: bool = False  # it compiled more between two scans than a heartbeat carries
    hits: dict[str, Looked] = field(default_factory=dict)  # its cache hits seen, by graph looked up
    silent_said: bool = False
    # the watcher's clock when it was first seen done with its latest compile: a rank that compiled the same
    # graph a little faster waits only since then, not since the slower rank began
    compiled_at: float = -math.inf

    def heard(self, beat: Heartbeat, now: float) -> None:
        if not beat.compiling and (self.beat.compiling or beat.compiles != self.beat.compiles):  # done compiling
            self.compiled_at = now
        self.beat, self.heard_at = beat, now


@dataclass
class _Stall:
    what: str
    step: int
    stage: str
    began_at: float  # the watcher's clock
    next_at_s: float  # say it (again) when it has run this long
    said: bool = False
    waiting: set[int] = field(default_factory=set)
    waiting_step: int = 0

    def finding(
        self, kind: str, ranks: tuple[int, ...], line: str, seconds: float, waiting: tuple[int, ...], why: str = ""
    ) -> Finding:
        return Finding(kind, ranks, line, self.step, self.stage, self.what, why, seconds, waiting)


class OutOfStep:
    """The ranks' heartbeats, judged scan after scan. A stall is said after ``stall_delay_s`` (by default
    ``STALL_MARGIN_S`` beyond the longest compile seen, at least ``STALL_MIN_S``), again at doubling intervals
    while it lasts, and once when it ends; a running rank not heard from for ``silent_after_s`` is silent."""

    def __init__(self, world_size: int, stall_delay_s: float | None = None, silent_after_s: float = 15.0) -> None:
        self.world_size = world_size
        self.stall_delay_s = stall_delay_s
        self.silent_after_s = silent_after_s
        self._ranks: dict[int, _Rank] = {}
        self._stalls: dict[tuple[int, int], _Stall] = {}  # (rank, its compile number) -> the stall
        self._longest_s = 0.0
        self._said_graphs: set[str] = set()

    def delay_s(self) -> float:
        if self.stall_delay_s is not None:
            return self.stall_delay_s
        return max(STALL_MIN_S, self._longest_s + STALL_MARGIN_S)

    def scan(self, now: float, beats: Mapping[int, Heartbeat], parts: PartsOf | None = None) -> list[Finding]:
        """What the heartbeats read at ``now`` (the watcher's monotonic clock) say that was not said yet; ``parts``
        reads a look-up's key parts (when a stalling rank missed a graph another rank hit with another key)."""
        findings = self._heard(now, beats)
        findings += self._stalls_now(now, parts)
        findings += self._divergent()
        findings += self._silent(now)
        return findings

    def at_end(self, now: float, beats: Mapping[int, Heartbeat], error: BaseException) -> list[Finding]:
        """This rank stopped with ``error``: the ranks that had not ended then, and when each was last heard."""
        self._heard(now, beats)
        running = sorted(r for r, seen in self._ranks.items() if not seen.beat.ended)
        missing = sorted(set(range(self.world_size)) - set(self._ranks))
        findings = []
        if running:
            last = [(r, self._ranks[r].beat.step, now - self._ranks[r].heard_at) for r in running[:8]]
            detail = "; ".join(f"rank {r} at step {step}, {ago:.1f} s before" for r, step, ago in last)
            line = f"when this rank stopped ({type(error).__name__}), {rank_list(running)} had not ended "
            line += f"(last heard: {detail})"
            findings.append(Finding("not_ended", tuple(running), line, why=error_text(error)[:240]))
        if missing:
            findings.append(
                Finding("not_ended", tuple(missing), f"{rank_list(missing)} never published a heartbeat in this run")
            )
        return findings

    # -- each judgement ---------------------------------------------------------------------------------
    def _heard(self, now: float, beats: Mapping[int, Heartbeat]) -> list[Finding]:
        findings = []
        for rank, beat in beats.items():
            seen = self._ranks.get(rank)
            if seen is None:
                seen = self._ranks[rank] = _Rank(Heartbeat(rank), now)
                seen.heard(beat, now)  # as after a heartbeat of nothing yet: done compiling if it compiled
            elif beat.seq != seen.beat.seq:
                if seen.silent_said:
                    quiet_s = now - seen.heard_at
                    line = f"rank {rank} is heard again after {quiet_s:.0f} s, at step {beat.step}"
                    findings.append(Finding("heard_again", (rank,), line, step=beat.step, seconds=quiet_s))
                seen.silent_said = False
                seen.graphs_lost |= beat.graph_count - seen.beat.graph_count > len(beat.graphs)
                seen.heard(beat, now)
            for graph in beat.graphs:
                seen.graphs.setdefault(graph.hash, graph)
            for looked in beat.lookups:
                if looked.state == "hit" and looked.graph not in seen.hits:
                    seen.hits[looked.graph] = looked
                    if len(seen.hits) > HITS_KEPT:
                        del seen.hits[next(iter(seen.hits))]
            self._longest_s = max(self._longest_s, beat.longest_compile_s)
        return findings

    def _stalls_now(self, now: float, parts: PartsOf | None = None) -> list[Finding]:
        compiling = {r: seen for r, seen in self._ranks.items() if seen.beat.compiling and not seen.beat.ended}
        findings = self._ended_stalls(compiling)
        for rank, seen in compiling.items():
            beat = seen.beat
            if (rank, beat.compiles) not in self._stalls:
                began_at = seen.heard_at - beat.compiling_s
                self._stalls[rank, beat.compiles] = _Stall(
                    beat.compiling, beat.step, beat.stage, began_at, self.delay_s()
                )
        waiting = {r: seen for r, seen in self._ranks.items() if r not in compiling and not seen.beat.ended}
        due: dict[tuple[str, int], list[int]] = {}
        # the longest-waiting rank waits on a compile since it began, or since that rank finished a compile of
        # its own (the same graph, compiled faster: ranks compiling alike are not a stall), whichever is later
        free_since = min((seen.compiled_at for seen in waiting.values()), default=now)
        waited_s: dict[int, float] = {}  # by the compiling rank, for those due now
        for (rank, _), stall in self._stalls.items():
            waited = now - max(stall.began_at, free_since)
            if waiting:
                stall.waiting.update(waiting)
                stall.waiting_step = Counter(seen.beat.step for seen in waiting.values()).most_common(1)[0][0]
            if waiting and waited >= stall.next_at_s:
                due.setdefault((stall.what, int(waited)), []).append(rank)
                stall.said, stall.next_at_s = True, waited * 2
                waited_s[rank] = waited
        for (what, _), ranks in due.items():
            ranks.sort()
            stall = self._stalls[(ranks[0], self._ranks[ranks[0]].beat.compiles)]
            elapsed, waited = now - stall.began_at, waited_s[ranks[0]]
            so_far = f" ({waited:.0f} s so far)" if f"{waited:.0f}" != f"{elapsed:.0f}" else ""
            why = self._cold(ranks[0], parts)
            line = (
                f"{rank_list(ranks)} {'has' if len(ranks) == 1 else 'have'} been compiling {what} for "
                f"{elapsed:.0f} s ({stall.stage} step {stall.step}) while {counted(len(waiting), 'rank')} "
                f"{'waits' if len(waiting) == 1 else 'wait'} at step {stall.waiting_step}{so_far}"
                + (f": {why}" if why else "")
            )
            findings.append(stall.finding("stall", tuple(ranks), line, elapsed, tuple(sorted(waiting)), why))
        return findings

    def _cold(self, rank: int, parts: PartsOf | None) -> str:
        """Why a compiling rank compiles where others did not: the compile cache it missed, for the same graph
        another rank hit, and the part of the key that differs (or that none does); "" when it missed nothing."""
        beat = self._ranks[rank].beat
        # a backward graph compiles because its forward's look-up in AOTAutograd's cache (which holds both) missed
        current = {compile_hash(beat.compiling), compile_hash(beat.compiling.removeprefix(BACKWARD))}
        misses = [looked for looked in beat.lookups if looked.compile in current and looked.state == "miss"]
        for miss in misses:
            for other, seen in sorted(self._ranks.items()):
                hit = seen.hits.get(miss.graph) if other != rank else None
                if hit is not None:
                    cache = CACHE_NAMES.get(miss.layer, miss.layer)
                    return f"it missed {cache} where rank {other} hit; {_differs(rank, miss, other, hit, parts)}"
        if misses:
            missed = CACHE_NAMES.get(misses[0].layer, misses[0].layer)
            return f"it missed {missed} (no other rank was heard hitting this graph)"
        return ""

    def _ended_stalls(self, compiling: Mapping[int, _Rank]) -> list[Finding]:
        findings = []
        for key in [k for k in self._stalls if k[0] not in compiling or compiling[k[0]].beat.compiles != k[1]]:
            stall = self._stalls.pop(key)
            if not stall.said:
                continue
            rank = key[0]
            beat = self._ranks[rank].beat
            seconds = beat.last_compile_s if beat.compiles == key[1] and beat.last_compile_s else 0.0
            waited = sorted(stall.waiting)
            took = f" after {seconds:.1f} s" if seconds else ""
            line = f"rank {rank} finished compiling {stall.what}{took}; {rank_list(waited)} waited for it at step "
            line += f"{stall.waiting_step}"
            findings.append(stall.finding("stall_ended", (rank,), line, seconds, tuple(waited)))
        return findings

    def _divergent(self) -> list[Finding]:
        """A graph some ranks compiled and the others went past without compiling: said once, with the
        ranks that compiled it when they are the fewer."""
        if len(self._ranks) < self.world_size:
            return []  # a rank not heard from yet may have compiled it
        holders: dict[str, list[int]] = {}
        for rank, seen in self._ranks.items():
            for digest in seen.graphs:
                if digest not in self._said_graphs:
                    holders.setdefault(digest, []).append(rank)
        # graphs said in the same words (one frame recompiled for each of its callers) are one finding
        said: dict[tuple[tuple[int, ...], str, int, str], list[str]] = {}
        for digest, ranks in holders.items():
            if len(ranks) * 2 > self.world_size:
                continue
            graph = self._ranks[ranks[0]].graphs[digest]
            others = [seen for r, seen in self._ranks.items() if r not in ranks]
            passed = all(
                not seen.graphs_lost
                and (seen.beat.ended or (seen.beat.step > graph.step + 1 and not seen.beat.compiling))
                for seen in others
            )
            if passed:
                self._said_graphs.add(digest)
                said.setdefault((tuple(sorted(ranks)), graph.frame, graph.step, graph.why), []).append(digest)
        findings = []
        for (group, frame, step, why), digests in said.items():
            others_count = self.world_size - len(group)
            who = "no other rank compiled" if len(group) == 1 else f"the other {counted(others_count, 'rank')} did not"
            graphs = "a graph" if len(digests) == 1 else f"{len(digests)} graphs"
            line = f"{rank_list(group)} compiled {graphs} for {frame} at step {step} that {who} ({why})"
            findings.append(Finding("divergent_graph", group, line, step=step, what=frame, why=why, graph=digests[0]))
        return findings

    def _silent(self, now: float) -> list[Finding]:
        findings = []
        for rank, seen in self._ranks.items():
            beat = seen.beat
            quiet_s = now - seen.heard_at
            if beat.ended or beat.compiling or seen.silent_said or quiet_s < self.silent_after_s:
                continue
            seen.silent_said = True
            line = f"rank {rank} has not been heard from for {quiet_s:.0f} s (last at {beat.stage or 'step'} "
            line += f"step {beat.step}): it died, hangs, or holds Python's lock; what it does now is not seen"
            findings.append(Finding("silent", (rank,), line, step=beat.step, stage=beat.stage, seconds=quiet_s))
        return findings


def _differs(rank: int, miss: Looked, other: int, hit: Looked, parts: PartsOf | None) -> str:
    """The part of the key that differs between a miss and another rank's hit of the same graph, and how long
    the hit's entry took to compile cold (how long the others will wait)."""
    both = " (forward and backward)" if hit.layer == "aot_autograd" else ""  # an entry of AOTAutograd's holds both
    cold = f"; the cold compile of that graph took {hit.saved_s:.1f} s{both}" if hit.saved_s else ""
    if miss.key == hit.key:
        return (
            f"the same key, and rank {rank}'s cache directory does not hold it (share TORCHINDUCTOR_CACHE_DIR, or "
            f"load the mega-cache: torch.compiler.save_cache_artifacts, load_cache_artifacts){cold}"
        )
    mine = parts(rank, miss) if parts is not None else None
    theirs = parts(other, hit) if parts is not None else None
    if not mine or not theirs:
        return f"its key differs from rank {other}'s (the parts were not published){cold}"
    changed = [
        name for name in sorted(mine.keys() | theirs.keys()) if mine.get(name, ("",))[0] != theirs.get(name, ("",))[0]
    ]
    if not changed:
        return f"its key differs from rank {other}'s in a part torch does not name{cold}"
    words = []
    for name in changed[:2]:
        base, new = theirs.get(name, ("", ""))[1], mine.get(name, ("", ""))[1]
        words.append(f"{name} ({base or '?'} -> {new or '?'})" if base or new else name)
    more = f" and {counted(len(changed) - 2, 'more part')}" if len(changed) > 2 else ""
    return f"its key differs from rank {other}'s in {', '.join(words)}{more}{cold}"
