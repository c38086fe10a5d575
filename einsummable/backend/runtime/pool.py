"""The worker pool behind `run(..., backend="gloo")`: ranks as spawned processes joined in one
process group, kept alive between calls (weights sent once per plan and kept), and watched by
the parent, which turns a dead, failed or silent rank into a RuntimeFault naming it and stops
the others.

Every wait has a timeout. A rank that dies is seen within a heartbeat (its process is gone);
one that stops running without dying (stopped, frozen, swapped out) stops sending its
heartbeats, and is named after `FROZEN_AFTER_S`, before any peer's receive times out
(`WAIT_TIMEOUT_S`) and blames the wrong rank.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import math
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ...errors import PlanError, RuntimeFault
from ...frontend.inputs import conform_inputs
from ...frontend.ir import DTYPE_BYTES
from ..lowering import Lowered
from .dist import WAIT_TIMEOUT_S, execute, forbid_collectives, p2p_barrier, rank_blocks
from .resident import check_fed, gather, kept_inputs
from .workers import free_port, threads_per_rank, worker_env

# How often the parent checks that every worker is still alive.
HEARTBEAT_S: float = 0.2
# After a rank reports an error, how long the parent looks for a dead rank that caused it.
DEATH_GRACE_S: float = 1.0
# How long the parent waits for a worker to start and join the process group.
STARTUP_TIMEOUT_S: float = 120.0
# How often a worker says it is alive, and how long its silence means it has stopped: a
# tenth of a second of Python every half second survives any load a run puts on the machine
# (kernels release the GIL), and the silence is named well within a receive's timeout.
BEAT_S: float = 0.5
FROZEN_AFTER_S: float = 10.0
assert FROZEN_AFTER_S < WAIT_TIMEOUT_S
# What a job sends back: the outputs, the program's seconds, its timeline, or (no run) the
# blocks the rank keeps of the inputs named.
OUTPUTS, TIME, TRACE, KEPT = "outputs", "time", "trace", "kept"


def _beat(rank: int, stamps, busy: threading.Event) -> None:
    """The worker's heartbeat while it has a job: its clock (monotonic clocks are the
    machine's, so the parent can compare) written to its slot of shared memory every BEAT_S.
    Shared memory, not a queue: a queue's put hands the bytes to a feeder thread, which a
    rank that enters a wait holding the GIL never lets run, so its last beat never arrived
    and it tied with the rank it waited on. An idle worker does not beat; a worker stopped
    while idle never takes its next job, so its stamp stays older than everyone's."""
    while True:
        busy.wait()
        time.sleep(BEAT_S)
        if busy.is_set():
            stamps[rank] = time.monotonic()


def _quietest(alive_at: Mapping[int, float], done: Any, now: float,
              since: float = -math.inf) -> int | None:
    """The rank silent longest past FROZEN_AFTER_S among those not done, or None. Silence is
    counted from its last stamp or `since` (the job's start), whichever is later; the longest
    is the oldest stamp, not the lowest rank: a starved parent may look only once several are
    quiet, and a rank waiting on a stopped one (in a C wait that holds the GIL) goes quiet
    after it, having stamped when it took the job."""
    silent = [r for r, t in alive_at.items()
              if r not in done and now - max(t, since) > FROZEN_AFTER_S]
    return min(silent, key=lambda r: (alive_at[r], r)) if silent else None


def _failure(e: BaseException) -> str:
    """A rank's error for the parent: the exception on the first line, where it came from
    below it (a RuntimeFault's own text is already in the user's words)."""
    if isinstance(e, RuntimeFault):
        return str(e).split("\n  fix:")[0]
    head = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return head + "\n" + traceback.format_exc(limit=3).rstrip()


def _worker(rank: int, world: int, backend: str, port: int, jobs, results, stamps,
            no_collectives: bool) -> None:
    import torch.distributed as dist
    torch.set_num_threads(threads_per_rank(world))
    try:
        device: Any = "cpu"
        if backend == "nccl":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(seconds=WAIT_TIMEOUT_S))
        if no_collectives:
            forbid_collectives()
        results.put((rank, "ready", None))
        busy = threading.Event()
        threading.Thread(target=_beat, args=(rank, stamps, busy), daemon=True).start()
    except Exception as e:  # noqa: BLE001
        results.put((rank, "error", f"rank {rank} could not join the group: {e}"))
        return
    plans: dict[str, Lowered] = {}
    weights: dict[str, dict] = {}
    consts: dict[str, dict] = {}
    parent = os.getppid()
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned: the parent is gone
                return
            continue
        if job is None:
            break
        key, low_json, new_weights, acts, fault_after, want = job
        # a first stamp as the job is taken, written here: a rank that enters a wait holding
        # the GIL within BEAT_S would otherwise tie with a rank stopped before the job
        stamps[rank] = time.monotonic()
        busy.set()
        try:
            if low_json is not None:
                plans[key] = Lowered.from_json(low_json)
                weights[key], consts[key] = {}, {}
            # the plan's weights and the blocks its last run kept (`Keep`), by (input, region)
            weights[key].update(new_weights)
            if want == KEPT:
                results.put((rank, "done", {k: v.cpu() for k, v in weights[key].items()
                                            if k[0] in acts}))
                continue
            blocks = {**weights[key], **acts}
            if want != OUTPUTS:  # start together, time only the program (not the transport)
                p2p_barrier(rank, world)
                t0 = time.perf_counter()
            timeline: list | None = [] if want == TRACE else None
            kept: dict = {}
            outs = execute(plans[key], rank, blocks, device, fault_after=fault_after,
                           consts=consts[key], timeline=timeline, kept=kept)
            weights[key].update(kept)
            if backend == "nccl":
                torch.cuda.synchronize()
            if want == TIME:
                results.put((rank, "done", time.perf_counter() - t0))
            elif want == TRACE:
                results.put((rank, "done", timeline))
            else:
                results.put((rank, "done", {k: v.cpu() for k, v in outs.items()}))
        except Exception as e:  # noqa: BLE001
            results.put((rank, "error", _failure(e)))
        finally:
            busy.clear()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


@dataclass
class Pool:
    """`world_size` worker processes joined in one process group, reused across runs."""
    backend: str
    world_size: int
    no_collectives: bool = False
    _procs: list = field(default_factory=list)
    _jobs: list = field(default_factory=list)
    _results: Any = None
    _stamps: Any = None  # each rank's last heartbeat, in shared memory (`_beat`)
    _sent: dict = field(default_factory=dict)  # plan key -> {weight: (id, version)}
    _kept: dict = field(default_factory=dict)  # plan key -> the inputs its programs keep
    _held: dict = field(default_factory=dict)  # plan key -> the inputs the ranks keep now
    last_sent: dict = field(default_factory=dict)  # input -> bytes the last run sent the ranks
    _keys: dict = field(default_factory=dict)  # id(lowered) -> (lowered, plan key)

    def start(self) -> "Pool":
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        port = free_port()
        self._results = ctx.Queue()
        self._stamps = ctx.Array("d", self.world_size, lock=False)
        with worker_env():
            for r in range(self.world_size):
                q = ctx.Queue()
                p = ctx.Process(target=_worker, args=(r, self.world_size, self.backend, port, q,
                                                      self._results, self._stamps,
                                                      self.no_collectives),
                                daemon=True)
                p.start()
                self._procs.append(p)
                self._jobs.append(q)
        got = self._collect("ready", STARTUP_TIMEOUT_S)
        del got
        return self

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def _collect(self, want: str, limit_s: float) -> dict[int, Any]:
        out: dict[int, Any] = {}
        deadline = time.monotonic() + limit_s
        since = time.monotonic()
        while len(out) < self.world_size:
            try:
                rank, kind, payload = self._results.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                kind = None
            alive_at = dict(enumerate(self._stamps))
            r = _quietest(alive_at, out, time.monotonic(), since)
            if r is not None and want != "ready":
                quiet_s = time.monotonic() - max(alive_at[r], since)
                self.close()
                raise RuntimeFault(f"rank {r} stopped responding: no heartbeat for "
                                   f"{quiet_s:.0f} s though its process is there (stopped, "
                                   "frozen or starved); the other ranks were stopped",
                                   fix=f"see what stopped rank {r}'s process (a debugger, a "
                                   "signal, the machine's memory); rerun")
            if kind is None:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    self.close()
                    r, code = dead[0]
                    raise RuntimeFault(f"rank {r} died (exit code {code}); the other ranks "
                                       "were stopped", fix="see the rank's error output; "
                                       "rerun, or check memory and the plan") from None
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeFault(f"ranks {sorted(set(range(self.world_size)) - set(out))}"
                                       f" sent nothing for {limit_s:.0f} s; all were stopped",
                                       fix="a rank hangs; check the plan and the backend")
                continue
            if kind == "error":
                # A peer's error is usually the echo of a rank that died: name the dead one.
                grace = time.monotonic() + DEATH_GRACE_S
                dead: list = []
                while not dead and time.monotonic() < grace:
                    dead = [(r, p.exitcode) for r, p in enumerate(self._procs) if not p.is_alive()]
                    time.sleep(HEARTBEAT_S / 4)
                self.close()
                if dead:
                    r, code = dead[0]
                    raise RuntimeFault(f"rank {r} died (exit code {code}); rank {rank} saw: "
                                       f"{str(payload).splitlines()[0]}", fix="the other ranks were stopped; see the "
                                       "dead rank's error output and rerun")
                head, _, below = str(payload).partition("\n")
                raise RuntimeFault(f"rank {rank} failed: {head}", fix="the other ranks were "
                                   "stopped; fix the cause and rerun" + (
                                       "\n  where:\n    " + below.replace("\n", "\n    ")
                                       if below else ""))
            out[rank] = payload
        return out

    def run(self, low: Lowered, inputs: Mapping[str, torch.Tensor], *,
            fault: tuple[int, int] | None = None, limit_s: float = 600.0) -> dict[str, torch.Tensor]:
        return self._submit(low, inputs, fault, limit_s, OUTPUTS)[0]

    def time(self, low: Lowered, inputs: Mapping[str, torch.Tensor], *,
             limit_s: float = 600.0) -> float:
        """Seconds of one run of the programs alone: every rank starts after a p2p barrier
        and the run lasts until the slowest rank ends (job transport excluded)."""
        return max(self._submit(low, inputs, None, limit_s, TIME).values())

    def trace(self, low: Lowered, inputs: Mapping[str, torch.Tensor], *,
              limit_s: float = 600.0) -> list[tuple[int, int, str, float, float, float]]:
        """One run's timeline, started as `time` starts it: (rank, pc, kind, reached_s,
        start_s, end_s) per instruction, on the machine's monotonic clock (`chrome.py`)."""
        got = self._submit(low, inputs, None, limit_s, TRACE)
        return [(r, *e) for r in sorted(got) for e in got[r]]

    def _key(self, low: Lowered) -> tuple[str, str | None]:
        """The plan's key (a hash of its JSON) and, where it was worked out now, the JSON.
        Kept per Lowered object (held, so its id is not reused): writing a training step's
        programs as JSON takes milliseconds, a fair share of a small step."""
        hit = self._keys.get(id(low))
        if hit is not None and hit[0] is low:
            return hit[1], None
        text = low.to_json()
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        self._keys[id(low)] = (low, key)
        return key, text

    def kept(self, low: Lowered, names, limit_s: float = 600.0) -> dict[str, torch.Tensor]:
        """The inputs `names` whole (on the CPU), gathered from the blocks the ranks keep of
        them after the plan's last run (`resident.py`); the ranks run nothing."""
        key, _ = self._key(low)
        names = set(names)
        if not names <= self._held.get(key, set()):
            raise PlanError(f"the ranks keep no {sorted(names - self._held.get(key, set()))} "
                            "of this plan", fix="run the plan (lowered with a carry) first")
        for q in self._jobs:
            q.put((key, None, {}, names, None, KEPT))
        got = self._collect("done", limit_s)
        return gather(low, names, {k: v for r in sorted(got) for k, v in got[r].items()})

    def _submit(self, low: Lowered, inputs: Mapping[str, torch.Tensor],
                fault: tuple[int, int] | None, limit_s: float, want: str) -> dict[int, Any]:
        if low.world_size != self.world_size:
            raise PlanError(f"the plan is for {low.world_size} ranks but the pool has "
                            f"{self.world_size}", fix=f"run with world_size={low.world_size}")
        key, text = self._key(low)
        first = key not in self._sent
        if first:
            text = text or low.to_json()
            self._kept[key] = kept_inputs(low)
        # an input the ranks keep is sent only when passed (its value replaced outside a run)
        carried, held = self._kept[key], self._held.get(key, frozenset())
        check_fed(low, inputs, held)
        weights = {t.name for t in low.graph.weights} - carried
        seen = self._sent.setdefault(key, {})
        stale = {w for w in weights if seen.get(w) != (id(inputs[w]), inputs[w]._version)}
        for w in stale:
            seen[w] = (id(inputs[w]), inputs[w]._version)
        stale |= carried & inputs.keys()
        acts = {t.name for t in low.graph.inputs if t.kind == "input"} - carried
        self.last_sent = {}
        for r in range(self.world_size):
            fa = fault[1] if fault is not None and fault[0] == r else None
            new, act = rank_blocks(low, r, inputs, stale), rank_blocks(low, r, inputs, acts)
            for name, region in (*new, *act):
                nbytes = math.prod(b - a for a, b in region) * DTYPE_BYTES[
                    low.graph.tensor(name).dtype]
                self.last_sent[name] = self.last_sent.get(name, 0) + nbytes
            self._jobs[r].put((key, text if first else None, new, act, fa, want))
        got = self._collect("done", limit_s)
        self._held[key] = carried  # every rank ran to its end: its Keeps were run
        return got

    def close(self) -> None:
        for q in self._jobs:
            try:
                q.put_nowait(None)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5.0)
        # A job a rank never took (stopped, killed) stays in its queue's pipe, and the feeder
        # thread writing it would block the interpreter's exit, which joins it: drop it.
        for q in (*self._jobs, self._results):
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self._procs, self._jobs = [], []


class Pools:
    """Live worker pools by (backend, world size, collectives forbidden), so repeated `run`
    calls reuse processes and the weights already placed in them."""

    def __init__(self) -> None:
        self._pools: dict[tuple, Pool] = {}
        atexit.register(self.close)

    def get(self, backend: str, world_size: int, no_collectives: bool = False) -> Pool:
        key = (backend, world_size, no_collectives)
        pool = self._pools.get(key)
        if pool is None or not pool.alive:
            pool = Pool(backend, world_size, no_collectives).start()
            self._pools[key] = pool
        return pool

    def close(self) -> None:
        for p in self._pools.values():
            p.close()
        self._pools.clear()


POOLS = Pools()  # process-wide resource cache (like a connection pool), closed at exit


def run_dist(low: Lowered, inputs: Mapping[str, torch.Tensor], *, backend: str = "gloo",
             world_size: int | None = None, pools: Pools | None = None,
             no_collectives: bool = False, fault: tuple[int, int] | None = None
             ) -> dict[str, torch.Tensor]:
    check_fed(low, inputs, kept_inputs(low))  # the pool checks what its ranks keep
    inputs = conform_inputs(low.graph, inputs)  # before any rank starts
    n = low.world_size if world_size is None else world_size
    if n != low.world_size:
        raise PlanError(f"the plan is for {low.world_size} ranks but world_size={n}",
                        fix=f"run with world_size={low.world_size}, or optimize for a "
                            f"{n}-device topology")
    pool = (pools or POOLS).get(backend, n, no_collectives)
    return pool.run(low, inputs, fault=fault)
