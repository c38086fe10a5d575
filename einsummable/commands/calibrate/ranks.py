"""The gloo half of `einsummable calibrate`: this machine's figures per rank, measured with all
ranks running at once.

Every rank-local figure is measured with all ranks running at once, at the torch thread count
the runtime gives each rank, because that is the condition the runtime's programs run under
(ranks share cores and memory). Communication uses isend/irecv only, every wait bounded.

    matmul rate     2 n^3 / t of an n x n matmul per dtype                 -> peak_flops
    memory bw       3 · bytes / t of out = a + b on tensors far above cache  -> mem_bw
    launch          seconds per kernel of the runtime on a 1-rank program of tiny ops, the
                    Free of its output included (`device.launch_runtime_s`)
    kernels         GEMM, causal SDPA, elementwise and norm calls at the llama-tiny block's
                    sizes (`device.kernel_points`, `device.CPU_RANKS`), from which
                    `cpu_yaml.achieved` fits the topology's achieved curves and memory fraction
    p2p latency     half the round trip of a 1-element message, median over all pairs
    p2p bandwidth   bytes / (half round trip - latency) of a large message
    message         host seconds one more message adds to a batch, every rank exchanging
                    with every peer at once: (T(m) - T(1)) / ((m - 1) · 2 · (world - 1)) for
                    batches of m tiny sends and receives per peer

The three communication figures are independent batches (nothing waits on a result); they are
kept for comparison. Last, the ranks time dependent exchange rounds (`rounds.py`: chains of
transfers each rank waits on), from which the link latency, bandwidth and per-message figures
a topology gets are fitted so that the simulator reproduces them.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...backend.runtime.dist import WAIT_TIMEOUT_S, p2p_barrier
from ...backend.runtime.workers import free_port, threads_per_rank, worker_env
from ...errors import RuntimeFault
from . import device, rounds

DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Effort:
    """How long each measurement runs; `quick` is for tests, the default for real figures."""
    matmul_n: int
    matmul_n_half: int     # fp16/bf16 matmuls are far slower on most CPUs: smaller problem
    mem_elems: int
    msg_bytes: int
    budget_s: float        # minimum timed span of one trial
    trials: int
    launch_ops: int
    batch_messages: int = 8  # m above: messages per peer in the large batch
    chains: rounds.ChainEffort = rounds.FULL  # the dependent rounds (`rounds.py`)
    kernels: device.Shapes = device.CPU_RANKS  # the calls the achieved curves are fitted to


FULL = Effort(matmul_n=512, matmul_n_half=256, mem_elems=1 << 23, msg_bytes=1 << 24,
              budget_s=0.25, trials=5, launch_ops=200)
QUICK = Effort(matmul_n=128, matmul_n_half=64, mem_elems=1 << 20, msg_bytes=1 << 20,
               budget_s=0.01, trials=1, launch_ops=20, batch_messages=4, chains=rounds.QUICK,
               kernels=device.QUICK)
# Timed batches per trial of the message measurement (after one warm-up batch).
MESSAGE_REPS = 6


@dataclass(frozen=True)
class Measured:
    """Figures of one machine (per rank, except the link figures which are per pair)."""
    world_size: int
    threads_per_rank: int
    peak_flops: dict[str, float]
    mem_bw: float
    mem_bytes: float
    launch_s: float
    p2p_bw: float
    p2p_latency_s: float
    message_s: float = 0.0
    chains: tuple[rounds.ChainTime, ...] = ()  # the dependent rounds, measured
    kernels: tuple[device.Point, ...] = ()  # kernel calls, median seconds over the ranks


def _rate(fn: Callable[[], Any], work: float, effort: Effort) -> float:
    """Work per second of `fn`, median of trials (each lasting at least the budget): the
    median, not the best, since ranks contend for cores and the runtime sees that too."""
    fn()
    rates = []
    for _ in range(effort.trials):
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            dt = time.perf_counter() - t0
            if dt >= effort.budget_s:
                break
        rates.append(work * reps / dt)
    return statistics.median(rates)


def _matmul_rates(effort: Effort) -> dict[str, float]:
    out = {}
    for name in DTYPES:
        n = effort.matmul_n if name == "float32" else effort.matmul_n_half
        dt = getattr(torch, name)
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        c = torch.empty(n, n, dtype=dt)
        out[name] = _rate(lambda a=a, b=b, c=c: torch.matmul(a, b, out=c), 2.0 * n ** 3,
                          effort)
    return out


def _mem_bw(effort: Effort) -> float:
    a, b = torch.randn(effort.mem_elems), torch.randn(effort.mem_elems)
    c = torch.empty_like(a)
    return _rate(lambda: torch.add(a, b, out=c), 3.0 * a.numel() * a.element_size(), effort)


def _pingpong(rank: int, peer: int, nbytes: int, effort: Effort, timeout: datetime.timedelta,
              lead: bool) -> float:
    """Median one-way seconds of `nbytes` between rank and peer (half a round trip)."""
    import torch.distributed as dist
    buf = torch.zeros(max(1, nbytes // 4))
    reps = 8 if nbytes > 4096 else 64
    times = []
    for k in range(effort.trials * reps + 2):
        t0 = time.perf_counter()
        for turn in ((0, 1) if lead else (1, 0)):
            op = dist.isend if turn == 0 else dist.irecv
            w = op(buf, peer, tag=k * 2 + (turn ^ (not lead)))
            if w.wait(timeout) is False:
                raise TimeoutError(f"rank {rank}: ping-pong with {peer} timed out")
        if k >= 2:
            times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def _batch_s(rank: int, world: int, m: int, tag: int, timeout: datetime.timedelta) -> float:
    """Seconds of one batch in which this rank sends m tiny messages to, and receives m from,
    every peer (all ranks at once, as in a program's exchange)."""
    import torch.distributed as dist
    peers = [p for p in range(world) if p != rank]
    ops = [dist.P2POp(fn, torch.zeros(1), p, tag=tag + k)
           for p in peers for k in range(m) for fn in (dist.isend, dist.irecv)]
    p2p_barrier(rank, world)
    t0 = time.perf_counter()
    for w in dist.batch_isend_irecv(ops):
        if w.wait(timeout) is False:
            raise TimeoutError(f"rank {rank}: message batch timed out")
    return time.perf_counter() - t0


def _message_s(rank: int, world: int, effort: Effort, timeout: datetime.timedelta) -> float:
    """Host seconds one more message costs (see the module docstring), median of trials."""
    if world == 1:
        return 0.0
    m = effort.batch_messages
    per = []
    for trial in range(effort.trials):
        tag = trial * (MESSAGE_REPS + 1) * 2 * m
        one, many = [], []
        for rep in range(MESSAGE_REPS + 1):
            base = tag + rep * 2 * m
            t1 = _batch_s(rank, world, 1, base, timeout)
            tm = _batch_s(rank, world, m, base + m, timeout)
            if rep:  # the first pair warms the transport up
                one.append(t1)
                many.append(tm)
        extra = statistics.median(many) - statistics.median(one)
        per.append(max(extra, 0.0) / ((m - 1) * 2 * (world - 1)))
    return statistics.median(per)


def pairs_rounds(world: int) -> list[list[tuple[int, int]]]:
    """Round-robin schedule: every pair once, each rank in at most one pair per round."""
    ranks = list(range(world)) + ([None] if world % 2 else [])
    m = len(ranks)
    rounds = []
    for _ in range(m - 1):
        rounds.append([(a, b) for a, b in zip(ranks[:m // 2], reversed(ranks[m // 2:]))
                       if a is not None and b is not None])
        ranks = [ranks[0], ranks[-1]] + ranks[1:-1]
    return rounds


def _measure_rank(rank: int, world: int, port: int, effort: Effort, results) -> None:
    import torch.distributed as dist
    try:
        threads = threads_per_rank(world)
        torch.set_num_threads(threads)
        timeout = datetime.timedelta(seconds=WAIT_TIMEOUT_S)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timeout)
        p2p_barrier(rank, world)
        flops = _matmul_rates(effort)
        p2p_barrier(rank, world)
        mem = _mem_bw(effort)
        p2p_barrier(rank, world)
        launch = device.launch_runtime_s(torch.device("cpu"), effort.launch_ops,
                                         effort.kernels.budget)
        p2p_barrier(rank, world)
        kernels = device.kernel_points(torch.device("cpu"), effort.kernels, ("float32",),
                                       causal_only=True)
        lat, bw = [], []
        for rnd in pairs_rounds(world):
            p2p_barrier(rank, world)
            for a, b in rnd:
                if rank in (a, b):
                    peer = b if rank == a else a
                    small = _pingpong(rank, peer, 4, effort, timeout, rank == a)
                    big = _pingpong(rank, peer, effort.msg_bytes, effort, timeout, rank == a)
                    lat.append(small)
                    bw.append(effort.msg_bytes / max(big - small, 1e-9))
        p2p_barrier(rank, world)
        message = _message_s(rank, world, effort, timeout)
        p2p_barrier(rank, world)
        chains = (rounds.time_chains(rank, world, pairs_rounds(world), effort.chains,
                                     WAIT_TIMEOUT_S) if world > 1 else {})
        p2p_barrier(rank, world)
        dist.destroy_process_group()
        results.put((rank, "done", {"flops": flops, "mem": mem, "launch": launch,
                                    "lat": lat, "bw": bw, "threads": threads,
                                    "message": message, "chains": chains,
                                    "kernels": kernels}))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails cleanly
        results.put((rank, "error", f"{type(e).__name__}: {e}"))


def measure(world: int, effort: Effort = FULL, limit_s: float = 600.0) -> Measured:
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_measure_rank, args=(r, world, port, effort, results),
                         daemon=True) for r in range(world)]
    with worker_env():  # the runtime's workers start with WORKER_ENV; so do these
        for p in procs:
            p.start()
    got: dict[int, dict] = {}
    deadline = time.monotonic() + limit_s
    try:
        while len(got) < world:
            try:
                rank, kind, payload = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in got]
                if dead or time.monotonic() > deadline:
                    raise RuntimeFault(f"calibration rank(s) {dead or 'all'} stopped answering",
                                       fix="rerun; check that local TCP ports are usable")
                continue
            if kind == "error":
                raise RuntimeFault(f"calibration rank {rank} failed: {payload}",
                                   fix="rerun with fewer ranks or check the gloo setup")
            got[rank] = payload
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
    med = statistics.median
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    lat = [x for g in got.values() for x in g["lat"]] or [0.0]
    bw = [x for g in got.values() for x in g["bw"]] or [1.0]
    # Every rank measured the same calls in the same order: the median seconds of each.
    kernels = tuple(dataclasses.replace(p, seconds=med(got[r]["kernels"][i].seconds
                                                       for r in got))
                    for i, p in enumerate(got[0]["kernels"]))
    return Measured(world, got[0]["threads"],
                    {k: med(g["flops"][k] for g in got.values()) for k in DTYPES},
                    med(g["mem"] for g in got.values()), float(pages // world),
                    med(g["launch"] for g in got.values()), med(bw), med(lat),
                    med(g["message"] for g in got.values()),
                    rounds.summarize([got[r]["chains"] for r in range(world)], effort.chains)
                    if world > 1 else (), kernels)
