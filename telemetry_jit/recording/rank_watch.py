"""Ranks out of step, said while it happens: every rank publishes its heartbeat on the job's own c10d store (no
new server, no new port), one rank watches them all (docs/distributed.md, "Ranks out of step"). Both run on
threads of their own, off the training step (a step only updates two numbers the publisher reads); whatever the
store does (refuses, times out, vanishes with a dead rank) costs one warning and stops that thread, never the run."""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from telemetry_jit.boundary import FAILED, SettingError, call_site
from telemetry_jit.compat import compile_cache
from telemetry_jit.compat.distributed import Store, job_store
from telemetry_jit.notices import Notices
from telemetry_jit.probes.dynamo import TORCH
from telemetry_jit.recording.listener import CompileListener
from telemetry_jit.recording.out_of_step import (
    GRAPHS_KEPT,
    LOOKUPS_KEPT,
    SETTINGS_PART,
    Finding,
    Graph,
    Heartbeat,
    Looked,
    OutOfStep,
    Parts,
    compile_hash,
    decode_parts,
    encode_parts,
    graph_of,
    heartbeat_key,
    parts_key,
    settings_key,
)
from telemetry_jit.records import CompileRecord
from telemetry_jit.terminal import error_text

_STORE = call_site("ranks.store", "torch.distributed (a connection of telemetry's own to the job's store)")
_PUBLISH = call_site("ranks.publish", "the job's c10d store (publishing this rank's heartbeat)")
_READ = call_site("ranks.read", "the job's c10d store (reading the ranks' heartbeats)")
_notices = Notices()

Position = Callable[[], tuple[int, str]]  # the step and stage the rank is at now


@dataclass(frozen=True)
class RankWatchSettings:
    """How ranks watch each other; each field but the last has its ``TELEMETRY_JIT_*`` variable
    (docs/distributed.md)."""

    enabled: bool = True  # TELEMETRY_JIT_RANK_WATCH=0 turns publishing and watching off
    interval_s: float = 2.0  # publish at least this often, and scan this often (TELEMETRY_JIT_HEARTBEAT_S)
    # say a rank compiling while others wait after this long (TELEMETRY_JIT_STALL_DELAY_S); by default a few
    # seconds beyond the longest compile seen so far
    stall_delay_s: float | None = None
    # say a rank not heard from this long (TELEMETRY_JIT_SILENT_AFTER_S); by default five heartbeats, at least 15 s
    silent_after_s: float | None = None
    watcher_rank: int = 0  # TELEMETRY_JIT_WATCHER_RANK
    store_timeout_s: float = 5.0  # one store operation of telemetry's is cut off after this long

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> RankWatchSettings:
        """The defaults, overridden by the ``TELEMETRY_JIT_*`` variables set; ``SettingError`` (a ``ValueError``)
        names a variable holding what it cannot mean, and what it takes."""
        switch = environ.get("TELEMETRY_JIT_RANK_WATCH", "").strip().lower()
        if switch not in ("", "0", "1", "true", "false", "on", "off"):
            raise SettingError(
                f"TELEMETRY_JIT_RANK_WATCH={switch!r}: set it to 1 (watch ranks, the default) or 0 (do not)."
            )
        given: dict[str, float] = {}
        for name, field_name, allow_zero in (
            ("TELEMETRY_JIT_HEARTBEAT_S", "interval_s", False),
            ("TELEMETRY_JIT_STALL_DELAY_S", "stall_delay_s", True),
            ("TELEMETRY_JIT_SILENT_AFTER_S", "silent_after_s", False),
        ):
            raw = environ.get(name, "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
                raise SettingError(f"{name}={raw!r}: give a number of seconds above zero (for example {name}=5).")
            given[field_name] = value
        rank = environ.get("TELEMETRY_JIT_WATCHER_RANK", "").strip()
        if rank and not (rank.isascii() and rank.isdigit()):  # "²".isdigit() is true, and int() refuses it
            raise SettingError(
                f"TELEMETRY_JIT_WATCHER_RANK={rank!r}: give a rank number in ASCII digits (0 is the default)."
            )
        settings = cls(switch in ("", "1", "true", "on"), watcher_rank=int(rank or 0), **given)
        world = environ.get("WORLD_SIZE", "").strip()
        if rank and world.isascii() and world.isdigit():
            settings.check_watcher(int(world))
        return settings

    def check_watcher(self, world_size: int) -> None:
        """Refuse a watcher rank that is no rank of a job of ``world_size`` (nobody would watch)."""
        if self.watcher_rank >= world_size > 0:
            raise SettingError(
                f"TELEMETRY_JIT_WATCHER_RANK={self.watcher_rank}: no such rank in a job of {world_size} ranks (0 to "
                f"{world_size - 1}), so no rank would watch the others. Give one of them (0 is the default)."
            )

    def silent_after(self) -> float:
        return self.silent_after_s if self.silent_after_s is not None else max(15.0, 5 * self.interval_s)


class HeartbeatPublisher(CompileListener):
    """Publishes this rank's :class:`Heartbeat` when a compile begins or ends, when a graph is recorded, and
    otherwise every ``interval_s``; the store is written by its own thread."""

    def __init__(self, store: Store, rank: int, position: Position, interval_s: float) -> None:
        self._store, self._position, self.interval_s = store, position, interval_s
        self._beat = Heartbeat(rank)
        self._graphs: deque[Graph] = deque(maxlen=GRAPHS_KEPT)
        self._since = 0.0
        self._lookups: deque[Looked] = deque(maxlen=LOOKUPS_KEPT)
        self._parts: dict[str, Parts] = {}  # the kept look-ups' key parts, by graph
        self._tables: dict[str, Parts] = {}  # settings tables not yet published, by digest
        self._tables_said: set[str] = set()
        self._parts_changed = False
        self._compile = compile_hash("")  # what compiled last, hashed: a look-up after its end still belongs to it
        self._looked_in: dict[str, int] = {}  # look-ups of that compile so far, by cache
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._published = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="telemetry-jit heartbeat", daemon=True)

    def start(self) -> None:
        self._wake.set()  # the first heartbeat at once: the watcher learns the rank exists
        self._thread.start()

    def stop(self, ended: str, timeout_s: float) -> None:
        """Publish the last heartbeat, saying how the run ended (bounded by ``timeout_s``)."""
        with self._lock:
            self._beat.ended, self._stopping = ended, True
        self._wake.set()
        self._thread.join(timeout_s)

    def publish_now(self, timeout_s: float) -> None:
        """Publish and wait (at most ``timeout_s``) until it is on the store: before the watcher's last look."""
        if not self._thread.is_alive():
            return  # stopped publishing (the store failed): nobody would answer
        self._published.clear()
        self._wake.set()
        self._published.wait(timeout_s)

    def compile_started(self, description: str) -> None:
        with self._lock:
            self._beat.compiling, self._since = description, time.monotonic()
            self._compile, self._looked_in = compile_hash(description), {}
            self._beat.compiles += 1
        self._wake.set()

    def compile_finished(self) -> None:
        with self._lock:
            if not self._beat.compiling:
                return
            took = time.monotonic() - self._since
            self._beat.compiling, self._beat.last_compile_s = "", took
            self._beat.longest_compile_s = max(self._beat.longest_compile_s, took)
        self._wake.set()

    def recorded(self, record: CompileRecord) -> None:
        graph = graph_of(record)
        with self._lock:
            self._graphs.append(graph)
            self._beat.graph_count += 1
        self._wake.set()

    def looked_up(self, lookup: compile_cache.Lookup) -> None:
        """A compile-cache look-up (``compile_cache.watch``, inside torch's compile: cheap, never raises) for the
        next heartbeat; its key's parts and its settings table (once a job) are published apart."""
        digest, layer = lookup.settings_digest, lookup.layer
        with self._lock:
            n = self._looked_in[layer] = self._looked_in.get(layer, -1) + 1
            looked = Looked(self._compile, layer, n, lookup.state, lookup.key[:12], round(lookup.saved_s, 3))
            self._lookups.append(looked)
            self._parts[looked.graph] = {**lookup.parts, SETTINGS_PART: (digest, "")} if digest else dict(lookup.parts)
            self._parts = {seen.graph: self._parts[seen.graph] for seen in self._lookups if seen.graph in self._parts}
            if digest and digest not in self._tables_said:
                self._tables_said.add(digest)
                self._tables[digest] = lookup.settings
            self._parts_changed = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            stopping = self._stopping
            failed = _PUBLISH.call(self._publish) is FAILED
            self._published.set()
            if failed or stopping:
                return  # a store that fails now fails the next time too: said once, publishing stops

    def _publish(self) -> None:
        step, stage = self._position()
        with self._lock:
            beat = self._beat
            beat.seq += 1
            beat.step, beat.stage = step, stage
            beat.compiling_s = time.monotonic() - self._since if beat.compiling else 0.0
            beat.graphs = list(self._graphs)
            beat.lookups = list(self._lookups)
            raw = beat.encode()
            tables, self._tables = self._tables, {}
            parts = encode_parts(self._parts) if self._parts_changed else None
            self._parts_changed = False
        # the parts before the heartbeat that names their look-ups: only when a look-up was added, never per step
        for digest, table in tables.items():  # the ranks of a job share their tables: one write for all
            if not self._store.check([settings_key(digest)]):
                self._store.set(settings_key(digest), encode_parts({"table": table}))
        if parts is not None:
            self._store.set(parts_key(beat.rank), parts)
        self._store.set(heartbeat_key(beat.rank), raw)


class RankWatcher:
    """Reads every rank's heartbeat each ``interval_s`` and says what :class:`OutOfStep` finds."""

    def __init__(
        self, store: Store, world_size: int, settings: RankWatchSettings, say: Callable[[Finding], None]
    ) -> None:
        self._store, self._say, self.settings = store, say, settings
        self.judge = OutOfStep(world_size, settings.stall_delay_s, settings.silent_after())
        self._known: list[int] = []
        self._unknown = list(range(world_size))
        self._tables: dict[str, Parts] = {}  # settings tables read, by digest
        self._stop = threading.Event()
        self._looking = threading.Lock()  # a look from the training thread at a loop's end, or the watcher's
        self._thread = threading.Thread(target=self._run, name="telemetry-jit rank watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, error: BaseException | None) -> None:
        """Stop after a last look (a short run may end between scans); with ``error``, say which ranks had not ended."""
        self._stop.set()
        self._thread.join(self.settings.store_timeout_s + 1.0)
        if not self._thread.is_alive():  # else stuck in the store until its timeout: no last look
            self.look(error)

    def look(self, error: BaseException | None = None) -> bool:
        """Read every heartbeat, judge and say; ``False`` when the store failed (said once)."""
        with self._looking:
            beats = _READ.call(self.read)
            if beats is FAILED:
                return False
            now = time.monotonic()
            findings = self.judge.scan(now, beats, self.parts)
            if error is not None:
                findings += self.judge.at_end(now, beats, error)
        self._tell(findings)
        return True

    def read(self) -> dict[int, Heartbeat]:
        """Every published heartbeat, by rank (a rank's key is checked for until it exists: a get would wait)."""
        found = [rank for rank in self._unknown if self._store.check([heartbeat_key(rank)])]
        if found:
            self._known = sorted({*self._known, *found})
            self._unknown = [rank for rank in self._unknown if rank not in found]
        if not self._known:
            return {}
        raws = self._store.multi_get([heartbeat_key(rank) for rank in self._known])
        beats = {rank: Heartbeat.decode(raw) for rank, raw in zip(self._known, raws, strict=True)}
        return {rank: beat for rank, beat in beats.items() if beat is not None}

    def parts(self, rank: int, looked: Looked) -> Parts | None:
        """The key parts of one of ``rank``'s look-ups, its settings table merged in (asked to explain a miss);
        ``None`` when the rank no longer publishes them or the store fails (said once)."""
        found = _READ.call(self._read_parts, rank, looked)
        return None if found is FAILED else found

    def _read_parts(self, rank: int, looked: Looked) -> Parts | None:
        if not self._store.check([parts_key(rank)]):
            return None
        found = decode_parts(self._store.multi_get([parts_key(rank)])[0]).get(looked.graph)
        if found is None:
            return None
        digest = found.pop(SETTINGS_PART, ("", ""))[0]
        if digest and digest not in self._tables:
            key = settings_key(digest)
            raw = self._store.multi_get([key])[0] if self._store.check([key]) else b"{}"
            self._tables[digest] = decode_parts(raw).get("table", {})
        return {**self._tables.get(digest, {}), **found}

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            if not self.look():
                return  # said once by the guard; the ranks are not watched from here on

    def _tell(self, findings: list[Finding]) -> None:
        for finding in findings:
            try:
                self._say(finding)
            except Exception as error:  # noqa: BLE001 - what the watcher found must not end its thread, or the run
                _notices.warn("ranks.say", f"telemetry-jit: could not say what the rank watcher found ({error!r}).")


class RankWatch:
    """This rank's publisher and, on the watcher rank, the watcher."""

    def __init__(self, publisher: HeartbeatPublisher, watcher: RankWatcher | None, settings: RankWatchSettings) -> None:
        self.publisher, self.watcher, self.settings = publisher, watcher, settings

    @classmethod
    def start(cls, settings: RankWatchSettings, position: Position, say: Callable[[Finding], None]) -> RankWatch | None:
        """Start publishing (and watching, on the watcher rank); ``None`` where turned off, without a process
        group of several ranks, or with a store telemetry cannot reach."""
        if not settings.enabled:
            return None
        found = _STORE.call(job_store, settings.store_timeout_s)
        if found is FAILED or isinstance(found, str):
            return None
        store, rank, world_size = found
        settings.check_watcher(world_size)
        publisher = HeartbeatPublisher(store, rank, position, settings.interval_s)
        TORCH.call(compile_cache.watch, publisher.looked_up)
        publisher.start()
        watcher = None
        if rank == settings.watcher_rank:
            reader = _STORE.call(job_store, settings.store_timeout_s)  # its own connection: never queues behind
            if reader is not FAILED and not isinstance(reader, str):
                watcher = RankWatcher(reader[0], world_size, settings, say)
                watcher.start()
        return cls(publisher, watcher, settings)

    def loop_ended(self) -> None:
        """A loop ends (every rank reaches this): publish and look once more, so that a short loop is judged
        while the run still records."""
        self.publisher.publish_now(self.settings.store_timeout_s)
        if self.watcher is not None:
            self.watcher.look()

    def stop(self, error: BaseException | None) -> None:
        TORCH.call(compile_cache.unwatch, self.publisher.looked_up)
        ended = "finished" if error is None else f"failed: {error_text(error)}"[:240]
        self.publisher.stop(ended, self.settings.store_timeout_s + 1.0)
        if self.watcher is not None:
            self.watcher.stop(error)
