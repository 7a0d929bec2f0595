"""What the rank watch costs, and how it scales (prints figures; not a test).

    python benchmarks/rank_heartbeats.py [--ranks 1000 10000] [--interval 2] [--seconds 20]

For each rank count, one process hosts a real c10d ``TCPStore`` (as rank 0 of a job does), four processes
publish the heartbeats of all the simulated ranks at the real rate (each rank one ``set`` every
``--interval`` seconds, a heartbeat of realistic size: 8 graphs), and the watcher reads every key and
judges them each interval, as rank 0 would. Reported:

- the store's load: ``set``s per second, bytes per second, and the CPU share of the process hosting it;
- a publisher's ``set`` latency, idle and under that load (median, 99th percentile);
- the watcher's scan: reading every heartbeat, decoding, judging (median, max), and its bytes;
- what publishing adds to a training step: the publisher's work per heartbeat (encode + set) measured in
  this process, as a share of a core at the real rate (the step itself only stores two numbers);
- the share of a real job's training time the publisher and the watcher take: a 2-rank gloo job (spawned
  here) trains a compiled MLP for ``--job-steps``, all-reducing every step, under ``CompileTelemetry`` with the
  rank watch at its defaults; each publication and each look is timed on its own thread's CPU clock
  (``time.thread_time_ns``: what it held the interpreter for, the training thread's cost), against the
  loop's wall time, on the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import time
from datetime import timedelta

from torch.distributed import TCPStore

from telemetry_jit.recording.out_of_step import Graph, Heartbeat, OutOfStep, heartbeat_key

PUBLISHERS = 4


def sample_beat(rank: int, seq: int) -> Heartbeat:
    graphs = [Graph(f"{i:012x}", i * 10, "forward", "recompile: tensor 'x' size mismatch at index 0") for i in range(8)]
    return Heartbeat(rank, seq, step=seq, stage="train", graph_count=8, graphs=graphs, longest_compile_s=12.5)


def host(port: int, ready: multiprocessing.synchronize.Event, stop: multiprocessing.synchronize.Event) -> None:
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    ready.set()
    stop.wait()
    del store


def publish(port: int, ranks: range, interval: float, seconds: float, latencies: multiprocessing.Queue) -> None:
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    payloads = {rank: sample_beat(rank, 1).encode() for rank in ranks}
    per_set = interval / len(ranks)
    measured: list[float] = []
    started = time.perf_counter()
    n = 0
    while time.perf_counter() - started < seconds:
        rank = ranks[n % len(ranks)]
        t = time.perf_counter()
        store.set(heartbeat_key(rank), payloads[rank])
        measured.append(time.perf_counter() - t)
        n += 1
        delay = started + n * per_set - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    latencies.put((n, measured[:: max(1, len(measured) // 5000)]))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    return f"median {statistics.median(ordered) * 1e3:.2f} ms, p99 {ordered[int(len(ordered) * 0.99)] * 1e3:.2f} ms"


def one_scale(ranks: int, interval: float, seconds: float) -> None:
    context = multiprocessing.get_context("spawn")
    port = free_port()
    ready, stop = context.Event(), context.Event()
    server = context.Process(target=host, args=(port, ready, stop))
    server.start()
    ready.wait(60)
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    for rank in range(ranks):  # every rank has published once
        store.set(heartbeat_key(rank), sample_beat(rank, 0).encode())
    idle = []
    for _ in range(2000):
        t = time.perf_counter()
        store.set(heartbeat_key(0), sample_beat(0, 0).encode())
        idle.append(time.perf_counter() - t)
    latencies: multiprocessing.Queue = context.Queue()
    share = [range(i, ranks, PUBLISHERS) for i in range(PUBLISHERS)]
    workers = [context.Process(target=publish, args=(port, part, interval, seconds, latencies)) for part in share]
    cpu_before = cpu_seconds(server.pid or 0)
    for worker in workers:
        worker.start()
    judge = OutOfStep(world_size=ranks)
    keys = [heartbeat_key(rank) for rank in range(ranks)]
    scans, scan_bytes = [], 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        t = time.perf_counter()
        raws = store.multi_get(keys)
        beats = {rank: beat for rank, raw in enumerate(raws) if (beat := Heartbeat.decode(raw)) is not None}
        judge.scan(time.monotonic(), beats)
        scans.append(time.perf_counter() - t)
        scan_bytes = sum(map(len, raws))
        time.sleep(max(0.0, interval - scans[-1]))
    loaded: list[float] = []
    sets = 0
    for _ in workers:
        n, measured = latencies.get(timeout=120)
        sets += n
        loaded += measured
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    server_cpu = cpu_seconds(server.pid or 0) - cpu_before
    stop.set()
    server.join()
    bytes_per_s = sets * len(sample_beat(0, 1).encode()) / seconds
    print(f"{ranks} ranks, one heartbeat each every {interval:g} s, {seconds:.0f} s:")
    print(
        f"  store: {sets / seconds:.0f} sets/s, {bytes_per_s / 1e6:.2f} MB/s in, "
        f"its host process {server_cpu / elapsed:.1%} of a core"
    )
    print(f"  a publisher's set: idle {quantiles(idle)}; under this load {quantiles(loaded)}")
    print(
        f"  the watcher's scan (read {ranks} heartbeats, {scan_bytes / 1e6:.2f} MB, decode, judge): "
        f"median {statistics.median(scans) * 1e3:.1f} ms, max {max(scans) * 1e3:.1f} ms"
    )


def publishing_cost(interval: float) -> None:
    """One rank's publishing work per heartbeat, against a store in this process."""
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    beat = sample_beat(0, 1)
    times = []
    for seq in range(5000):
        t = time.perf_counter()
        beat.seq = seq
        store.set(heartbeat_key(0), beat.encode())
        times.append(time.perf_counter() - t)
    per = statistics.median(times)
    print(
        f"publishing, per heartbeat (encode + set): median {per * 1e6:.0f} us; at one every {interval:g} s "
        f"that is {per / interval:.4%} of one core, off the training thread"
    )


def train_rank(rank: int, port: int, job_steps: int, results: multiprocessing.Queue) -> None:
    import torch
    import torch.distributed as dist

    import telemetry_jit
    from telemetry_jit.recording import rank_watch

    spent = {"publish": 0, "look": 0}

    def timed(name: str, function):  # noqa: ANN001, ANN202 - wraps a method, keeps its signature
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.thread_time_ns()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.thread_time_ns() - start

        return wrapper

    rank_watch.HeartbeatPublisher._publish = timed("publish", rank_watch.HeartbeatPublisher._publish)
    rank_watch.RankWatcher.look = timed("look", rank_watch.RankWatcher.look)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    telemetry_jit.configure("rank-watch-cost", file=os.devnull)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 1))
    compiled = torch.compile(model, backend="eager")
    steps = 0
    with telemetry_jit.CompileTelemetry(live=False) as telemetry:
        began = time.perf_counter()
        while steps < job_steps:
            telemetry.step(steps)
            compiled(torch.randn(8, 10)).pow(2).mean().backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            steps += 1
        wall = time.perf_counter() - began
    telemetry_jit.shutdown()
    dist.destroy_process_group()
    results.put((rank, steps, wall, spent["publish"] / 1e9, spent["look"] / 1e9))


def job_share(job_steps: int) -> None:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    port = free_port()
    ranks = [context.Process(target=train_rank, args=(rank, port, job_steps, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    rows = sorted(results.get(timeout=600) for _ in ranks)
    for process in ranks:
        process.join()
    for rank, steps, wall, publish_s, look_s in rows:
        share = (publish_s + look_s) / wall
        print(
            f"a 2-rank job, rank {rank}: {steps} steps in {wall:.1f} s ({wall / steps * 1e3:.2f} ms a step); "
            f"publishing {publish_s * 1e3:.1f} ms, watching {look_s * 1e3:.1f} ms of CPU: {share:.4%} of the "
            f"loop's time, {share * wall / steps * 1e6:.2f} us a step"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--job-steps", type=int, default=3000, help="steps of the 2-rank job")
    args = parser.parse_args()
    publishing_cost(args.interval)
    job_share(args.job_steps)
    for ranks in args.ranks:
        one_scale(ranks, args.interval, args.seconds)


if __name__ == "__main__":
    main()
