"""Measured runs: N gloo ranks on loopback, timed inside the ranks.

Protocol (the same for every system, so the numbers compare):
- one process per rank (torch.multiprocessing, spawn), gloo over 127.0.0.1, a timeout on the
  process group and on the whole run, so nothing waits forever;
- torch uses ONE intra-op thread per rank: ranks share this machine's cores, and more threads
  per rank would only oversubscribe them and time the scheduler;
- every rank builds the same block from the same seed and takes its shards from it;
- each system's output is checked against module(x) once, before timing;
- warm-up passes, then `repeats` rounds; in each round every system runs once, in an order that
  rotates per round (interleaved, so drift hits all systems alike); before each timed pass a
  barrier lines the ranks up; a pass's time is the slowest rank's, from barrier to its output;
- the result per system is the median over rounds, with the 25th/75th percentiles as spread.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from einsummable.backend.runtime.workers import free_port, worker_env

from .workloads import Workload

THREADS_PER_RANK = 1
# Output agreement with module(x) that counts as correct (float32; collectives reorder sums).
CHECK_ATOL = 1e-3


@dataclass(frozen=True)
class MeasureRequest:
    workload: Workload
    systems: tuple[str, ...]
    world: int
    warmup: int = 2
    repeats: int = 10
    weights: str = "sharded"
    timeout_s: float = 300.0
    # Extra per-system inputs prepared in the parent (e.g. an einsummable plan as JSON).
    payload: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Timing:
    system: str
    median_s: float | None = None
    p25_s: float | None = None
    p75_s: float | None = None
    samples_s: tuple[float, ...] = ()
    max_abs_err: float | None = None
    note: str = ""
    error: str | None = None

    @property
    def spread_s(self) -> float | None:
        """Interquartile range of the rounds: what run-to-run noise looks like here."""
        return None if self.p25_s is None else self.p75_s - self.p25_s

    def to_dict(self) -> dict:
        return {**asdict(self), "samples_s": list(self.samples_s), "spread_s": self.spread_s}

    @staticmethod
    def from_dict(d: dict) -> "Timing":
        fields = {k: v for k, v in d.items() if k != "spread_s"}
        return Timing(**{**fields, "samples_s": tuple(fields.get("samples_s", ()))})


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 1]."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# Runs of the ranks before a death is reported: a rank has been seen to abort inside gloo
# ("terminate called without an active exception") now and then on this 2-core box, and the
# same run then succeeds; a second death is reported in the rows.
ATTEMPTS = 2


def measure(request: MeasureRequest) -> dict[str, Timing]:
    """Spawn the ranks, wait (bounded), and return one Timing per requested system."""
    for _ in range(ATTEMPTS):
        got, died = _measure_once(request)
        if not died:
            break
    return got


def _measure_once(request: MeasureRequest) -> tuple[dict[str, Timing], bool]:
    """The timings, and whether a rank died (then every timing carries the reason)."""
    got, why, died = run_ranks(_measure_body, request, request.world, request.timeout_s,
                               f"measured run of {request.workload.name}")
    if got is None:
        return {name: Timing(name, error=why) for name in request.systems}, died
    return {name: Timing.from_dict(t) for name, t in got.items()}, False


def _measure_body(rank: int, request: MeasureRequest) -> dict:
    return {k: v.to_dict() for k, v in _measure_in_rank(rank, request).items()}


def run_ranks(body: Callable, payload, world: int, timeout_s: float,
              what: str) -> tuple[dict | None, str | None, bool]:
    """Spawn `world` gloo ranks on loopback, each running body(rank, payload) (a top-level
    function: spawn pickles it) after joining the process group; wait at most `timeout_s`.
    Returns (rank 0's dict, None, False), or (None, why, whether a rank died)."""
    with tempfile.TemporaryDirectory(prefix="es-measure-") as tmp:
        out_path = os.path.join(tmp, "result.json")
        with worker_env():  # every system's ranks run in the runtime's worker environment
            ctx = mp.start_processes(_rank_main, args=(body, payload, world, timeout_s,
                                                       free_port(), out_path),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} on {world} ranks exceeded {timeout_s:.0f} s")
        except (ProcessException, TimeoutError) as e:
            if isinstance(e, ProcessException) and _complete(out_path):
                # Rank 0 writes the file only after every rank's timings were gathered: the
                # rank died tearing down (gloo's abort at exit), not while measuring.
                return _load(out_path), None, False
            # a rank died (retried once, see ATTEMPTS) or the run stalled (not retried): every
            # system of this run gets the reason, and the caller goes on with its other runs
            died = isinstance(e, ProcessException)
            why = (f"the ranks did not finish ({ATTEMPTS} attempts)" if died
                   else "the run stalled") + f": {str(e).splitlines()[0]}"
            return None, why, died
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        return _load(out_path), None, False


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _read(path: str) -> dict[str, Timing]:
    return {name: Timing.from_dict(t) for name, t in _load(path).items()}


def _complete(path: str) -> bool:
    """Whether rank 0 finished writing its results (a whole JSON object)."""
    try:
        _load(path)
    except (OSError, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------- inside a rank

def _rank_main(rank: int, body: Callable, payload, world: int, timeout_s: float, port: int,
               out_path: str) -> None:
    torch.set_num_threads(THREADS_PER_RANK)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=max(30.0, timeout_s / 2)))
    try:
        results = body(rank, payload)
        if rank == 0:
            with open(out_path + ".part", "w") as f:  # whole or absent (see _complete)
                json.dump(results, f)
            os.replace(out_path + ".part", out_path)
    finally:
        dist.destroy_process_group()


def time_rounds(runs: dict[str, Callable[[], object]], warmup: int, repeats: int,
                world: int) -> dict[str, list[float]]:
    """Per system, its seconds in each of `repeats` rounds, the slowest rank's (the protocol
    of the module docstring: warm-up passes, a barrier before each timed pass, the order
    rotating each round)."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            dist.barrier()
            runs[name]()
    local = torch.zeros(len(names), repeats, dtype=torch.float64)
    for r in range(repeats):
        for k in range(len(names)):
            i = (k + r) % len(names)  # rotate the order each round
            dist.barrier()
            t0 = time.perf_counter()
            runs[names[i]]()
            local[i, r] = time.perf_counter() - t0
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    slowest = torch.stack(every).amax(dim=0)  # per system and round: the slowest rank
    return {name: slowest[i].tolist() for i, name in enumerate(names)}


def _agree(ok: bool) -> bool:
    """True only if every rank says ok (so all ranks drop a broken system together)."""
    flag = torch.tensor([0.0 if ok else 1.0])
    dist.all_reduce(flag)
    return flag.item() == 0.0


def _measure_in_rank(rank: int, request: MeasureRequest) -> dict[str, Timing]:
    from .systems import rank_step  # late: keeps spawn start-up light and avoids cycles

    block, x = request.workload.build()
    payload = dict(request.payload)
    with torch.no_grad():
        reference = block(x) if rank == 0 else None
    steps: dict[str, Callable] = {}
    failures: dict[str, Timing] = {}
    for name in request.systems:
        step, err = None, None
        try:
            step = rank_step(name, block, x, rank, request.world, weights=request.weights,
                             payload=payload.get(name))
            full = step.gather(step.run())
            max_err = float((full - reference).abs().max()) if rank == 0 else 0.0
        except Exception as e:  # reported in the row; a broken system must not stop the others
            err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if os.environ.get("EINSUMMABLE_BENCH_DEBUG"):
                traceback.print_exc()
        if not _agree(err is None):
            failures[name] = Timing(name, error=err or "failed on another rank")
            continue
        if rank == 0 and max_err > CHECK_ATOL:
            note = f"{step.note}; WRONG OUTPUT (max |err| {max_err:.2e})"
        else:
            note = step.note
        steps[name] = step
        failures[name] = Timing(name, max_abs_err=max_err if rank == 0 else None, note=note)

    rounds = time_rounds({name: step.run for name, step in steps.items()}, request.warmup,
                         request.repeats, request.world)

    results: dict[str, Timing] = {}
    for name in request.systems:
        base = failures[name]
        if name not in steps:
            results[name] = base
            continue
        xs = rounds[name]
        results[name] = Timing(name, statistics.median(xs), percentile(xs, 0.25),
                               percentile(xs, 0.75), tuple(xs), base.max_abs_err, base.note)
    return results
