"""Discrete-event timing of lowered programs on a topology.

Each rank runs its program in order, as the dist executor does, one instruction at a time (one
thread per rank: work on a rank is serialised): a send starts a flow and the rank moves on; a
receive is posted and the rank waits only when it reads the buffer. Every term comes from the
topology (for cpu4: measured by `einsummable calibrate`):

    launch    = per kernel: Compute, Reduce, Assemble, Const, the pack of a strided send, and
                one per p2p batch (a run of Send/Recv issued as one NCCL group). Place, Alloc,
                Slice (views), Recv posting, Free and Output launch nothing.
    compute   = `kernel_time`: launch + max(tuple_flops / achieved rate, tuple_bytes / achieved
                memory rate), the optimizer's compute model (`planning/kernel_time.py`)
                tuple_flops = op.flops · tuple share; tuple_bytes = inputs read + output written
    reduce    = launch + (inputs + 1) · bytes / memory rate   (read every input, write one)
    assemble  = launch + 2 · copied bytes / memory rate       (read the parts, write the block;
                receives that land in place copy nothing)
    const     = launch + bytes / memory rate
    send      = launch + 2 · bytes / memory rate to pack a strided slice before it leaves
    message   = per Send and per Recv, the device's `message_s` (host work of the transport)
    pack      = launch + 2 · bytes / memory rate (several blocks for one peer as one message)
    unpack    = launch + 2 · bytes / memory rate of the parts it copies into place (views: free)

Prefetch sends (weights, `Send.queue` > 0) leave in queue order, one queue number after
another per rank (one stream), so the weights needed first arrive first; other sends start at
once and take the bandwidth first (the prefetch stream has low priority and gets what they leave). A send and its receive are one transfer: one flow that loads its link and, where the link names
a port, the sender's egress and the receiver's ingress port (an NVSwitch GPU's 300 GB/s is its
total to all peers). Rates are max-min fair over all of a flow's resources (progressive
filling, recomputed at every start and end); a message is usable `latency` after its last byte
leaves. Predicted time = the last rank's end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...core.geometry import contiguous_slice, region_shape
from ...core.program import (
    Alloc,
    Assemble,
    Compute,
    Const,
    Free,
    Output,
    Pack,
    Place,
    Recv,
    Reduce,
    Send,
    Slice,
    Unpack,
    p2p_batches,
    reads,
)
from ...errors import RuntimeFault
from ...frontend.ir import DTYPE_BYTES
from ...planning.cost import CostModel
from ...planning.kernel_time import copy_s, kernel_time, memory_s
from ...topology import load_topology
from ..lowering import Lowered, lower

# A flow with less than this left is finished (float drift on integer byte counts).
_DONE_BYTES = 1e-6
# ... and so is one that would finish within this many seconds: at large clock values and
# gigabyte messages, drift leaves remainders whose time to drain no longer moves the clock,
# which would otherwise be stepped through forever. Far below any latency or launch term.
_DONE_S = 1e-12


@dataclass(frozen=True)
class SimResult:
    time_s: float
    rank_end_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    link_bytes: dict[tuple[int, int], int] = field(default_factory=dict)
    # With trace=True: (rank, pc, kind, ready_s, start_s, end_s) per instruction run, where
    # ready_s is when the rank reached it and start_s when its inputs were there.
    trace: tuple[tuple[int, int, str, float, float, float], ...] = ()

    def __str__(self) -> str:
        busiest = sorted(self.link_bytes.items(), key=lambda kv: -kv[1])[:4]
        links = ", ".join(f"{a}->{b}: {n / 1e6:.2f} MB" for (a, b), n in busiest)
        return (f"predicted {self.time_s * 1e3:.3f} ms; compute per rank "
                f"{[round(c * 1e3, 3) for c in self.compute_s]} ms; busiest links {links or '-'}")


@dataclass
class _Flow:
    tag: int
    resources: tuple[tuple[str, float], ...]  # (resource, its capacity in B/s) the bytes load
    latency: float
    remaining: float
    urgent: bool = True  # False: a prefetch, served from what urgent flows leave
    rate: float = 0.0


class _Network:
    def __init__(self) -> None:
        self.now = 0.0
        self.flows: list[_Flow] = []
        self.arrived: dict[int, float] = {}
        self.on_done = lambda tag: None  # called as each flow's last byte leaves (may start more)

    def _rates(self) -> None:
        """Max-min fair rates (progressive filling): raise every unfrozen flow's rate together
        until some resource is full, freeze the flows on it, repeat. A flow on an NVSwitch
        link thus gets min(link, egress port share at its sender, ingress share at its
        receiver), and bandwidth one flow cannot use goes to the others. Urgent flows are
        filled first; prefetches share what they leave (a low-priority stream)."""
        cap: dict[str, float] = {}
        for f in self.flows:
            for res, bw in f.resources:
                cap[res] = bw
        for urgent in (True, False):
            self._fill([f for f in self.flows if f.urgent == urgent], cap)

    @staticmethod
    def _fill(flows: list["_Flow"], cap: dict[str, float]) -> None:
        # Counts of unfrozen flows per resource are kept up to date, so a step costs one pass
        # over the resources instead of one over every (resource, flow) pair.
        users: dict[str, list[_Flow]] = {}
        for f in flows:
            for res, _ in f.resources:
                users.setdefault(res, []).append(f)
        free = {id(f) for f in flows}
        count = {r: len(fl) for r, fl in users.items()}
        while free:
            share, res = min((max(cap[r], 0.0) / n, r) for r, n in count.items() if n)
            for f in users[res]:
                if id(f) in free:
                    f.rate = share
                    free.discard(id(f))
                    for r, _ in f.resources:
                        cap[r] -= share
                        count[r] -= 1
            del users[res], count[res]

    def next_done(self) -> float:
        return min((self.now + f.remaining / f.rate for f in self.flows if f.rate > 0),
                   default=math.inf)

    def advance(self, t: float) -> list[int]:
        """Move to time t, finishing flows on the way; returns the tags whose arrival is known."""
        done: list[int] = []
        while self.flows:
            t_next = self.next_done()
            if t_next > t:
                break
            self._progress(t_next)
            for f in [f for f in self.flows if f.remaining <= _DONE_BYTES
                      or (f.rate > 0 and f.remaining / f.rate <= _DONE_S)]:
                self.flows.remove(f)
                self.arrived[f.tag] = t_next + f.latency
                done.append(f.tag)
                self.on_done(f.tag)
            self._rates()
        self._progress(t)
        return done

    def _progress(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self.flows:
                f.remaining = max(0.0, f.remaining - f.rate * dt)
        self.now = max(self.now, t)

    def start(self, flow: _Flow) -> None:
        if flow.remaining <= 0:
            self.arrived[flow.tag] = self.now + flow.latency
            self.on_done(flow.tag)
            return
        self.flows.append(flow)
        self._rates()


class _PrefetchQueue:
    """One rank's prefetch sends: queue numbers go out in order, each once the previous one's
    bytes have all left (one stream); the flows of one queue number run together."""

    def __init__(self, net: _Network) -> None:
        self.net = net
        self.active: int | None = None
        self.inflight: set[int] = set()
        self.pending: list[tuple[int, _Flow]] = []  # (queue, flow) in program order

    def send(self, queue: int, flow: _Flow) -> None:
        if self.active is None or (self.active == queue and not self.pending):
            self.active = queue
            self.inflight.add(flow.tag)
            self.net.start(flow)
        else:
            self.pending.append((queue, flow))

    def done(self, tag: int) -> None:
        if tag not in self.inflight:
            return
        self.inflight.discard(tag)
        if self.inflight:
            return
        self.active = None
        if self.pending:
            nxt = self.pending[0][0]
            batch = [f for q, f in self.pending if q == nxt]
            self.pending = [(q, f) for q, f in self.pending if q != nxt]
            self.active = nxt
            self.inflight.update(f.tag for f in batch)
            for f in batch:
                self.net.start(f)


def _numel(shape) -> int:
    return math.prod(shape)


# Instructions that run a kernel on the device. Place (the block is already resident), Slice
# (a view), Recv (posting a receive), Free and Output are bookkeeping: no launch.
KERNELS = (Compute, Reduce, Assemble, Const)


def simulate_programs(low: Lowered, topology: Any, *, trace: bool = False,
                      cost_model: CostModel = CostModel()) -> SimResult:
    """Predicted time of `low` on `topology` (module docstring); kernels priced by
    `kernel_time` with `cost_model`'s derating, as the optimizer prices them."""
    topo = load_topology(topology)
    g = low.graph
    ops = {op.name: op for op in g.ops}
    n = low.world_size
    shapes: list[dict[int, tuple[int, tuple[int, ...]]]] = [dict() for _ in range(n)]  # buf -> (elem bytes, shape)
    ready: list[dict[int, float]] = [dict() for _ in range(n)]
    recv_tag: list[dict[int, list[int]]] = [dict() for _ in range(n)]  # buf -> tags filling it
    t = [0.0] * n
    pc = [0] * n
    compute = [0.0] * n
    link_bytes: dict[tuple[int, int], int] = {}
    net = _Network()
    queues = [_PrefetchQueue(net) for _ in range(n)]
    queue_of: dict[int, _PrefetchQueue] = {}  # tag -> the queue that sent it

    def flow_done(tag: int) -> None:
        q = queue_of.pop(tag, None)
        if q is not None:
            q.done(tag)

    net.on_done = flow_done
    blocked: dict[int, int] = {}  # rank -> tag it waits for
    events: list[tuple[int, int, str, float, float, float]] = []

    strided: list[set[int]] = [set() for _ in range(n)]  # bufs that are non-contiguous views

    def nbytes(r: int, b: int) -> int:
        elem, shape = shapes[r][b]
        return elem * _numel(shape)

    batch_opens = [p2p_batches(p.instrs) for p in low.programs]

    def cost(r: int, ins) -> float:
        dev = topo.devices[r]
        launch = dev.launch_s
        mem_eff = cost_model.mem_efficiency
        if isinstance(ins, Compute):
            op = ops[ins.op]
            share = math.prod(hi - lo for lo, hi in ins.ranges) / math.prod(op.size.values())
            traffic = sum(nbytes(r, b) for b in ins.inputs) + nbytes(r, ins.out)
            return kernel_time(op, op.flops * share, traffic, g.tensor(op.output).dtype, dev,
                               cost_model.flop_efficiency, mem_eff).total_s
        if isinstance(ins, Reduce):
            return launch + memory_s(dev, (len(ins.inputs) + 1) * nbytes(r, ins.out), mem_eff)
        if isinstance(ins, Assemble):  # only the parts it copies: receives landed in place
            copied = sum(_numel(region_shape(b)) for _, _, b in ins.parts) * shapes[r][ins.out][0]
            return copy_s(dev, 2 * copied, 1, mem_eff)
        if isinstance(ins, Const):
            return copy_s(dev, nbytes(r, ins.out), 1, mem_eff)
        if isinstance(ins, Pack):
            return copy_s(dev, 2 * nbytes(r, ins.out), 1, mem_eff)
        if isinstance(ins, Unpack):  # views are free; parts landing in a buffer are copied
            copied = sum(_numel(shape) for _, shape, into, _ in ins.parts if into is not None)
            return copy_s(dev, 2 * copied * DTYPE_BYTES[ins.dtype], 1, mem_eff) if copied else 0.0
        dt = launch if pc[r] in batch_opens[r] else 0.0  # the batch's one p2p kernel
        if isinstance(ins, Send | Recv):
            dt += dev.message_s  # the transport's per-message host work
        if isinstance(ins, Send) and ins.src in strided[r]:
            dt += copy_s(dev, 2 * nbytes(r, ins.src), 1, mem_eff)  # pack kernel: read, write
        return dt

    def record_shape(r: int, ins) -> None:
        if isinstance(ins, Place | Const):
            info = g.tensor(ins.tensor)
            shapes[r][ins.out] = (DTYPE_BYTES[info.dtype], tuple(b - a for a, b in ins.region))
        elif isinstance(ins, Compute):
            op = ops[ins.op]
            rng = dict(zip(op.modes, ins.ranges))
            shape = tuple(math.prod(rng[m][1] - rng[m][0] for m in grp) for grp in op.out_dims)
            shapes[r][ins.out] = (DTYPE_BYTES[g.tensor(op.output).dtype], shape)
        elif isinstance(ins, Slice):
            src_shape = shapes[r][ins.src][1]
            shapes[r][ins.out] = (shapes[r][ins.src][0], tuple(b - a for a, b in ins.region))
            if ins.src in strided[r] or not contiguous_slice(src_shape, ins.region):
                strided[r].add(ins.out)
        elif isinstance(ins, Assemble | Alloc):
            shapes[r][ins.out] = (DTYPE_BYTES[ins.dtype], ins.shape)
        elif isinstance(ins, Recv):
            shapes[r][ins.out] = (DTYPE_BYTES[ins.dtype], ins.shape)
        elif isinstance(ins, Reduce):
            shapes[r][ins.out] = shapes[r][ins.inputs[0]]
        elif isinstance(ins, Pack):
            shapes[r][ins.out] = (DTYPE_BYTES[ins.dtype],
                                  (sum(_numel(shapes[r][b][1]) for b in ins.srcs),))
        elif isinstance(ins, Unpack):
            for out, shape, _, _ in ins.parts:
                shapes[r][out] = (DTYPE_BYTES[ins.dtype], shape)

    def step(r: int) -> bool:
        """Run rank r's next instruction if its inputs are ready; False if it must wait."""
        ins = low.programs[r].instrs[pc[r]]
        start = t[r]
        # An Unpack only names views of a packed receive: its readers wait, it does not.
        for b in (() if isinstance(ins, Unpack) else reads(ins)):
            for tag in recv_tag[r].get(b, ()):
                if tag not in net.arrived:
                    blocked[r] = tag
                    return False
                ready[r][b] = max(ready[r].get(b, 0.0), net.arrived[tag])
            start = max(start, ready[r].get(b, 0.0))
        record_shape(r, ins)
        dt = cost(r, ins)
        if isinstance(ins, Compute):
            compute[r] += dt
        if trace:
            events.append((r, pc[r], type(ins).__name__, t[r], start, start + dt))
        t[r] = start + dt
        if isinstance(ins, Recv):
            recv_tag[r].setdefault(ins.out if ins.into is None else ins.into, []).append(ins.tag)
        elif isinstance(ins, Unpack):
            tags = recv_tag[r].get(ins.src, [])
            for out, _, into, _ in ins.parts:
                recv_tag[r].setdefault(out if into is None else into, []).extend(tags)
        elif isinstance(ins, Send):
            size = nbytes(r, ins.src)
            link = topo.link(r, ins.peer)
            # No direct link (lowering splits relays into hops, so rare): the bytes load every
            # link of the route at once (cut-through) and pay every latency.
            route = (link,) if link is not None else topo.route(r, ins.peer)
            res = tuple((l.resource, l.bw) for l in route) \
                + tuple(p for l in route for p in l.port_resources)
            for tag in net.advance(t[r]):
                wake(tag)
            flow = _Flow(ins.tag, res, sum(l.latency_s for l in route), float(size),
                         urgent=not ins.queue)
            if ins.queue:
                queue_of[ins.tag] = queues[r]
                queues[r].send(ins.queue, flow)
            else:
                net.start(flow)
            link_bytes[(r, ins.peer)] = link_bytes.get((r, ins.peer), 0) + size
        elif not isinstance(ins, Free | Output):
            w = getattr(ins, "out", None)
            if w is not None:
                ready[r][w] = t[r]
        pc[r] += 1
        return True

    def wake(tag: int) -> None:
        for r, want in list(blocked.items()):
            if want == tag:
                del blocked[r]

    lengths = [len(p.instrs) for p in low.programs]
    while True:
        runnable = [r for r in range(n) if pc[r] < lengths[r] and r not in blocked]
        if not runnable and not net.flows:
            break
        t_rank = min((t[r] for r in runnable), default=math.inf)
        t_net = net.next_done()
        if t_net <= t_rank:
            for tag in net.advance(t_net):
                wake(tag)
            continue
        r = min(runnable, key=lambda k: (t[k], k))
        for tag in net.advance(t[r]):
            wake(tag)
        if r in blocked:
            continue
        while pc[r] < lengths[r] and step(r):
            # Keep running this rank while it stays the earliest (others cannot affect it sooner).
            others = [t[k] for k in range(n) if k != r and pc[k] < lengths[k] and k not in blocked]
            if t[r] > min(others + [net.next_done()]):
                break
    if any(pc[r] < lengths[r] for r in range(n)):
        raise RuntimeFault(f"simulation deadlocked: ranks {sorted(blocked)} wait for messages",
                           fix="the programs are inconsistent; lower the plan again")
    return SimResult(max(t), tuple(t), tuple(compute), link_bytes, tuple(events))


def simulate(plan: Any, choice=None, topology=None, *, mode: str = "optimized",
             cost_model: CostModel | None = None) -> SimResult:
    """Predicted time of a plan (a Plan, or graph + choice + topology) or of a Lowered. A
    Plan is priced with the cost model it was solved on, unless `cost_model` says otherwise."""
    if cost_model is None:
        options = getattr(plan, "options", None)
        cost_model = options.cost if options is not None else CostModel()
    if isinstance(plan, Lowered):
        if topology is None:
            raise ValueError("simulate(lowered, topology=...) needs the topology")
        return simulate_programs(plan, topology, cost_model=cost_model)
    topo = topology if choice is not None else plan.topology
    return simulate_programs(lower(plan, choice, topology, mode=mode), topo,
                             cost_model=cost_model)
