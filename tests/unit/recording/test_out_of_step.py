"""The rank watcher's judgements, fed made-up heartbeats and clock readings: no store, no thread, no
compiling (the real jobs are in tests/e2e/test_out_of_step.py)."""

from __future__ import annotations

import warnings

import pytest

from telemetry_jit import boundary
from telemetry_jit.boundary import SettingError
from telemetry_jit.compat.compile_cache import Lookup
from telemetry_jit.recording.out_of_step import (
    STALL_MARGIN_S,
    STALL_MIN_S,
    Graph,
    Heartbeat,
    Looked,
    OutOfStep,
    Parts,
    compile_hash,
)
from telemetry_jit.recording.rank_watch import HeartbeatPublisher, RankWatcher, RankWatchSettings
from telemetry_jit.schema import RanksAttr
from tests.faults import injected

FORWARD = "forward (model.py) [0/1, recompile: tensor 'x' size mismatch at index 0. expected 8, actual 5]"


def beat(rank: int, seq: int, step: int, **fields: object) -> Heartbeat:
    return Heartbeat(rank=rank, seq=seq, step=step, stage="train", **fields)  # type: ignore[arg-type]


COLD = "forward (model.py:12) [0/0]"


STUCK = f"rank 1 has been compiling {COLD} for 5 s (train step 0) while 1 rank waits at step 0"


def cold_rank_stall(rank0: list[Looked], rank1: list[Looked], parts: dict[tuple[int, str], Parts] | None = None) -> str:
    """The stall line the watcher says when rank 1 compiles ``COLD`` for 5 s while rank 0, done with its own
    compile of it, waits: each rank's look-ups as their heartbeats carry them."""
    judge = OutOfStep(world_size=2)
    asked: list[int] = []

    def parts_of(rank: int, looked: Looked) -> Parts | None:
        asked.append(rank)
        return (parts or {}).get((rank, looked.graph))

    waiting = beat(0, 1, 0, compiles=1, last_compile_s=1.5, lookups=rank0)
    compiling = beat(1, 1, 0, compiling=COLD, compiles=1, lookups=rank1)
    assert judge.scan(100.0, {0: waiting, 1: compiling}, parts_of) == []
    [said] = judge.scan(100.0 + STALL_MIN_S, {0: waiting, 1: compiling}, parts_of)
    assert said.kind == "stall" and said.line.startswith(f"{STUCK}: ") and said.why == said.line[len(STUCK) + 2 :]
    assert bool(asked) == (parts is not None)  # the parts are read only to tell keys that differ apart
    return said.why


def looked(layer: str, state: str, key: str, saved_s: float = 0.0, compile_: str = COLD) -> Looked:
    return Looked(compile_hash(compile_), layer, 0, state, key, saved_s)


def test_a_rank_compiling_while_the_others_wait_is_said_after_the_delay_then_at_doubling_intervals() -> None:
    judge = OutOfStep(world_size=3)
    assert judge.delay_s() == STALL_MIN_S
    waiting = {0: beat(0, 1, 4), 1: beat(1, 1, 4)}
    compiling = beat(2, 1, 4, compiling=FORWARD, compiling_s=0.5, compiles=2)
    assert judge.scan(100.0, {**waiting, 2: compiling}) == []
    assert judge.scan(100.0 + STALL_MIN_S - 1, {**waiting, 2: compiling}) == []
    [said] = judge.scan(100.0 + STALL_MIN_S, {**waiting, 2: compiling})
    assert said.kind == "stall" and said.ranks == (2,) and said.waiting == (0, 1)
    assert said.line == f"rank 2 has been compiling {FORWARD} for 6 s (train step 4) while 2 ranks wait at step 4"
    assert judge.scan(110.0, {**waiting, 2: compiling}) == []  # next at twice as long: 11 s
    [again] = judge.scan(112.0, {**waiting, 2: compiling})
    assert again.kind == "stall" and round(again.seconds) == 12
    done = beat(2, 2, 5, compiles=2, last_compile_s=13.2, longest_compile_s=13.2)
    [ended] = judge.scan(113.0, {**waiting, 2: done})
    assert ended.kind == "stall_ended" and ended.seconds == 13.2 and ended.waiting == (0, 1)
    assert ended.line == f"rank 2 finished compiling {FORWARD} after 13.2 s; ranks 0, 1 waited for it at step 4"
    assert judge.delay_s() == pytest.approx(13.2 + STALL_MARGIN_S)  # beyond the compile times seen so far


def test_ranks_that_all_compile_wait_for_nobody_and_a_quick_compile_is_never_said() -> None:
    judge = OutOfStep(world_size=2)
    both = {r: beat(r, 1, 0, compiling=FORWARD, compiles=1) for r in range(2)}
    assert judge.scan(0.0, both) == [] and judge.scan(60.0, both) == []  # nobody waits
    quick = OutOfStep(world_size=2)
    quick.scan(0.0, {0: beat(0, 1, 3), 1: beat(1, 1, 3, compiling=FORWARD, compiles=2)})
    assert quick.scan(1.0, {0: beat(0, 2, 3), 1: beat(1, 2, 4, compiles=2, last_compile_s=1.0)}) == []


def test_a_rank_that_compiled_the_same_graph_faster_waits_only_since_it_finished() -> None:
    """Ranks compiling alike on a loaded machine: one finishes first and waits for the other only from then on,
    so a slower compile of the same graph is said only once that wait is long (a CI run said it after 1 s)."""
    judge = OutOfStep(world_size=2)
    both = {r: beat(r, 1, 0, compiling=FORWARD, compiles=1) for r in range(2)}
    assert judge.scan(100.0, both) == []
    done = beat(1, 2, 0, compiles=1, last_compile_s=3.0, longest_compile_s=3.0)
    slower = beat(0, 1, 0, compiling=FORWARD, compiles=1)
    assert judge.scan(103.0, {0: slower, 1: done}) == []
    assert judge.scan(107.0, {0: slower, 1: done}) == []  # compiling for 7 s, but rank 1 has waited 4
    [said] = judge.scan(103.0 + STALL_MIN_S, {0: slower, 1: done})
    assert said.kind == "stall" and said.ranks == (0,) and said.waiting == (1,)
    assert said.line == (
        f"rank 0 has been compiling {FORWARD} for 8 s (train step 0) while 1 rank waits at step 0 (5 s so far)"
    )


def test_a_rank_first_heard_after_compiling_waits_from_when_it_was_first_heard() -> None:
    """The watcher's first look (it started late, or the rank joined late) finds a rank done with a compile:
    its wait is counted from that look, never from before the watcher knew it."""
    judge = OutOfStep(world_size=2)
    slower = beat(0, 1, 0, compiling=FORWARD, compiling_s=2.0, compiles=1)
    judge.scan(100.0, {0: slower, 1: beat(1, 1, 0, compiles=1, last_compile_s=1.0)})
    assert judge.scan(103.0, {0: slower, 1: beat(1, 1, 0, compiles=1, last_compile_s=1.0)}) == []
    [said] = judge.scan(100.0 + STALL_MIN_S, {0: slower, 1: beat(1, 1, 0, compiles=1, last_compile_s=1.0)})
    assert said.line.endswith("while 1 rank waits at step 0 (5 s so far)")


def test_stalls_due_together_are_one_line_for_any_number_of_ranks() -> None:
    judge = OutOfStep(world_size=1000, stall_delay_s=2.0)
    beats = {r: beat(r, 1, 7, compiling=FORWARD, compiles=1) for r in range(1, 1000)}
    beats[0] = beat(0, 1, 7)
    judge.scan(0.0, beats)
    [said] = judge.scan(2.0, beats)
    assert said.ranks == tuple(range(1, 1000))
    assert said.line.startswith("ranks 1, 2, 3, 4, 5, 6, 7, 8 and 991 more have been compiling")
    assert said.attributes()[RanksAttr.RANK_COUNT] == 999 and len(said.attributes()[RanksAttr.RANKS]) == 64


def test_a_graph_only_one_rank_compiled_is_said_once_after_the_others_went_past_it() -> None:
    judge = OutOfStep(world_size=4)
    odd = Graph("abc", 37, "forward", "recompile: self.branch == False")
    shared = Graph("zzz", 0, "forward", "first compile")
    beats = {r: beat(r, 1, 37, graphs=[shared], graph_count=1) for r in range(3)}
    beats[3] = beat(3, 1, 38, graphs=[shared, odd], graph_count=2)
    assert judge.scan(0.0, beats) == []  # the others are still at step 37: they may compile it too
    beats = {r: beat(r, 2, 39, graphs=[shared], graph_count=1) for r in range(3)} | {3: beats[3]}
    [said] = judge.scan(1.0, beats)
    assert said.kind == "divergent_graph" and said.ranks == (3,) and said.graph == "abc"
    assert said.line == (
        "rank 3 compiled a graph for forward at step 37 that no other rank compiled (recompile: self.branch == False)"
    )
    assert judge.scan(2.0, beats) == []  # said once


def test_graphs_said_in_the_same_words_are_one_finding() -> None:
    # one layer class called on the batch and on activations: a shape only rank 1 sees recompiles it for each
    judge = OutOfStep(world_size=2)
    why = "recompile: tensor 'x' size mismatch at index 0. expected 4, actual 3"
    callers = [Graph("a1", 1, "forward", why), Graph("b2", 1, "forward", why)]
    judge.scan(0.0, {0: beat(0, 1, 1), 1: beat(1, 1, 1, graphs=callers, graph_count=2)})
    [said] = judge.scan(1.0, {0: beat(0, 2, 3), 1: beat(1, 2, 3, graphs=callers, graph_count=2)})
    assert said.line == f"rank 1 compiled 2 graphs for forward at step 1 that no other rank compiled ({why})"


def test_a_graph_half_the_ranks_or_more_compiled_is_not_called_divergent_and_lost_graphs_are_not_guessed() -> None:
    judge = OutOfStep(world_size=2)
    odd = Graph("abc", 1, "forward", "first compile")
    beats = {0: beat(0, 1, 9, graphs=[odd], graph_count=1), 1: beat(1, 1, 9, graph_count=0)}
    assert [f.ranks for f in judge.scan(0.0, beats)] == [(0,)]  # one of two: said, the one that compiled it
    many = OutOfStep(world_size=3)
    many.scan(0.0, {r: beat(r, 1, 0) for r in range(3)})
    late = Graph("new", 1, "forward", "first compile")
    lost = {0: beat(0, 2, 9, graphs=[late], graph_count=1), 1: beat(1, 2, 9, graph_count=40), 2: beat(2, 2, 9)}
    found = many.scan(1.0, lost)
    assert found == []  # rank 1 compiled 40 graphs between two looks: it may have compiled this one


def test_a_silent_rank_is_said_once_and_again_when_heard() -> None:
    judge = OutOfStep(world_size=2, silent_after_s=15.0)
    judge.scan(0.0, {0: beat(0, 1, 3), 1: beat(1, 1, 3)})
    assert judge.scan(14.0, {0: beat(0, 2, 3), 1: beat(1, 1, 3)}) == []
    [silent] = judge.scan(16.0, {0: beat(0, 3, 3), 1: beat(1, 1, 3)})
    assert silent.kind == "silent" and silent.ranks == (1,) and "rank 1 has not been heard from for 16 s" in silent.line
    assert judge.scan(17.0, {0: beat(0, 4, 3), 1: beat(1, 1, 3)}) == []
    [back] = judge.scan(30.0, {0: beat(0, 5, 3), 1: beat(1, 2, 4)})
    assert back.kind == "heard_again"


def test_when_the_watchers_rank_fails_the_ranks_that_had_not_ended_are_named() -> None:
    judge = OutOfStep(world_size=3)
    judge.scan(10.0, {0: beat(0, 1, 5), 1: beat(1, 1, 4), 2: beat(2, 1, 5, ended="finished")})
    [gone] = judge.at_end(12.0, {0: beat(0, 2, 5)}, RuntimeError("Connection reset by peer"))
    assert gone.kind == "not_ended" and gone.ranks == (0, 1)
    assert "rank 1 at step 4, 2.0 s before" in gone.line and gone.why == "RuntimeError: Connection reset by peer"


def test_a_heartbeat_survives_its_encoding_and_garbage_reads_as_none() -> None:
    original = beat(3, 9, 12, compiling=FORWARD, graphs=[Graph("a", 1, "f", "first compile")], graph_count=1)
    assert Heartbeat.decode(original.encode()) == original
    for raw in (b"", b"{", b'{"rank": "x"}', b"\xff\xfe", b"[]"):
        assert Heartbeat.decode(raw) is None
    assert len(original.encode()) < 600


def test_a_cold_rank_with_the_same_key_as_a_rank_that_hit_is_told_its_cache_directory_lacks_it() -> None:
    why = cold_rank_stall(
        [looked("aot_autograd", "hit", "a1b2c3d4e5f6", saved_s=18.94)], [looked("aot_autograd", "miss", "a1b2c3d4e5f6")]
    )
    assert why == (
        "it missed AOTAutograd's cache where rank 0 hit; the same key, and rank 1's cache directory does not hold it "
        "(share TORCHINDUCTOR_CACHE_DIR, or load the mega-cache: torch.compiler.save_cache_artifacts, "
        "load_cache_artifacts); the cold compile of that graph took 18.9 s (forward and backward)"
    )


def test_a_cold_rank_whose_key_differs_is_told_the_part_that_differs_read_from_the_store_only_then() -> None:
    hit, miss = looked("fx_graph", "hit", "fkey0", saved_s=4.0), looked("fx_graph", "miss", "fkey1")
    same = {"gm": ("g1", ""), "torch_version": ("t1", "2.13.0")}
    parts = {
        (0, hit.graph): {**same, "inductor_config[max_autotune]": ("c0", "False")},
        (1, miss.graph): {**same, "inductor_config[max_autotune]": ("c1", "True")},
    }
    why = cold_rank_stall([hit], [miss], parts)
    assert why == (
        "it missed inductor's FX graph cache where rank 0 hit; its key differs from rank 0's in "
        "inductor_config[max_autotune] (False -> True); the cold compile of that graph took 4.0 s"
    )
    assert "the parts were not published" in cold_rank_stall([hit], [miss], {})


def test_a_miss_no_other_rank_hit_says_the_cache_and_a_rank_that_missed_nothing_says_nothing_more() -> None:
    other = looked("aot_autograd", "hit", "a1", compile_="forward (model.py:12) [1/0]")  # another graph
    assert cold_rank_stall([other], [looked("aot_autograd", "miss", "a1")]) == (
        "it missed AOTAutograd's cache (no other rank was heard hitting this graph)"
    )
    judge = OutOfStep(world_size=2)
    beats = {0: beat(0, 1, 0, compiles=1), 1: beat(1, 1, 0, compiling=COLD, compiles=1)}
    judge.scan(0.0, beats)
    [said] = judge.scan(STALL_MIN_S, beats)
    assert said.line == STUCK and said.why == ""


def test_a_backward_graph_compiled_after_its_forward_missed_where_another_rank_hit_says_that_miss() -> None:
    """The rank that hit AOTAutograd's cache took the backward graph from it too; the one that missed compiles the
    backward graph at the first backward, while the other waits: the forward's miss says why."""
    judge = OutOfStep(world_size=2, stall_delay_s=0.0)
    hit, miss = looked("aot_autograd", "hit", "a1", saved_s=3.0), looked("aot_autograd", "miss", "a1")
    beats = {
        0: beat(0, 1, 0, compiles=1, lookups=[hit]),
        1: beat(1, 1, 0, compiling=f"the backward graph of {COLD}", compiles=2, lookups=[miss]),
    }
    judge.scan(0.0, beats)
    [said] = judge.scan(1.0, beats)
    assert said.why.startswith("it missed AOTAutograd's cache where rank 0 hit; the same key")


def test_a_hit_seen_earlier_still_explains_a_miss_after_it_left_the_heartbeat() -> None:
    judge = OutOfStep(world_size=2)
    hit = looked("aot_autograd", "hit", "a1", saved_s=3.0)
    judge.scan(0.0, {0: beat(0, 1, 0, lookups=[hit]), 1: beat(1, 1, 0)})
    later = {
        0: beat(0, 2, 0, compiles=1),
        1: beat(1, 2, 0, compiling=COLD, compiles=1, lookups=[looked("aot_autograd", "miss", "a1")]),
    }
    judge.scan(1.0, later)
    [said] = judge.scan(1.0 + STALL_MIN_S, later)
    assert "where rank 0 hit; the same key" in said.why


def test_look_ups_are_numbered_per_compile_and_cache_however_many_it_makes() -> None:
    """A compile DDP's optimizer splits makes one inductor look-up per subgraph: more than a heartbeat keeps."""
    import torch.distributed as dist

    publisher = HeartbeatPublisher(dist.HashStore(), 0, lambda: (0, "train"), interval_s=60.0)
    for description in (COLD, "forward (model.py:12) [1/0]"):
        publisher.compile_started(description)
        for _ in range(6):
            publisher.looked_up(Lookup("fx_graph", "miss", "f"))
    publisher._publish()
    assert [(looked.compile, looked.n) for looked in publisher._beat.lookups] == [
        (compile_hash("forward (model.py:12) [1/0]"), n) for n in range(2, 6)
    ]


def test_a_ranks_cache_look_ups_reach_the_watcher_through_a_real_store() -> None:
    """Two publishers and a watcher on torch's own in-process c10d store: the look-ups ride on the heartbeat,
    their parts on a key per rank, each settings table once for the job; the watcher reads them back to name
    the setting that differs."""
    import torch.distributed as dist

    store = dist.HashStore()
    tables = [{"inductor_config[max_autotune]": ("c0", "False")}, {"inductor_config[max_autotune]": ("c1", "True")}]
    for rank, state, digest in ((0, "hit", "d0"), (1, "miss", "d1"), (2, "hit", "d0")):
        publisher = HeartbeatPublisher(store, rank, lambda: (0, "train"), interval_s=60.0)
        publisher.compile_started(COLD)
        table = tables[digest == "d1"]
        parts = {"gm": ("g", "")}
        publisher.looked_up(
            Lookup("aot_autograd", state, f"akey{digest}", parts, table, saved_s=2.0, settings_digest=digest)
        )
        if rank != 1:
            publisher.compile_finished()
        publisher._publish()
    assert store.num_keys() == 3 + 3 + 2  # heartbeats, parts, and one table per digest: rank 2 shares rank 0's
    watcher = RankWatcher(store, 3, RankWatchSettings(), print)
    beats = watcher.read()
    assert [(b.lookups[0].state, b.lookups[0].key) for b in beats.values()] == [
        ("hit", "akeyd0"),
        ("miss", "akeyd1"),
        ("hit", "akeyd0"),
    ]
    assert beats[0].lookups[0].graph == beats[1].lookups[0].graph
    assert watcher.parts(1, beats[1].lookups[0]) == {"gm": ("g", ""), **tables[1]}
    with warnings.catch_warnings(), injected("ranks.read", "raise") as site:
        warnings.simplefilter("ignore")
        assert watcher.parts(0, beats[0].lookups[0]) is None  # a store that fails costs the explanation only
    assert site.hits == 1
    boundary.count_into(boundary.Account())  # say each failure again
    assert len(beats[1].encode()) < 700
    watcher.judge.scan(0.0, beats, watcher.parts)
    [said] = watcher.judge.scan(STALL_MIN_S, beats, watcher.parts)
    assert said.why == (
        "it missed AOTAutograd's cache where rank 0 hit; its key differs from rank 0's in "
        "inductor_config[max_autotune] (False -> True); the cold compile of that graph took 2.0 s "
        "(forward and backward)"
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TELEMETRY_JIT_HEARTBEAT_S", "0", "give a number of seconds above zero"),
        ("TELEMETRY_JIT_STALL_DELAY_S", "nan", "give a number of seconds above zero"),
        ("TELEMETRY_JIT_SILENT_AFTER_S", "-1", "give a number of seconds above zero"),
        ("TELEMETRY_JIT_RANK_WATCH", "maybe", "set it to 1"),
        ("TELEMETRY_JIT_WATCHER_RANK", "first", "give a rank number"),
        ("TELEMETRY_JIT_WATCHER_RANK", "\u00b2", "give a rank number in ASCII digits"),  # "²".isdigit() is true
    ],
)
def test_settings_that_cannot_mean_anything_are_named_with_what_they_take(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ValueError, match=f"{variable}={value!r}: {message}"):
        RankWatchSettings.from_environment({variable: value})


def test_a_watcher_rank_beyond_the_job_is_refused() -> None:
    with pytest.raises(SettingError, match="TELEMETRY_JIT_WATCHER_RANK=99: no such rank in a job of 2 ranks"):
        RankWatchSettings.from_environment({"TELEMETRY_JIT_WATCHER_RANK": "99", "WORLD_SIZE": "2"})
    with pytest.raises(SettingError, match="no such rank in a job of 4 ranks"):
        RankWatchSettings(watcher_rank=4).check_watcher(4)  # the world size the process group gives, at start
    RankWatchSettings(watcher_rank=3).check_watcher(4)


def test_settings_from_the_environment() -> None:
    settings = RankWatchSettings.from_environment(
        {"TELEMETRY_JIT_RANK_WATCH": "0", "TELEMETRY_JIT_HEARTBEAT_S": "4", "TELEMETRY_JIT_STALL_DELAY_S": "30"}
    )
    assert (settings.enabled, settings.interval_s, settings.stall_delay_s) == (False, 4.0, 30.0)
    assert settings.silent_after() == 20.0 and RankWatchSettings().silent_after() == 15.0
