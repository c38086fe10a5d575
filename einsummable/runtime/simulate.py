"""Discrete-event timing of lowered programs on a topology.

Each rank runs its program in order, as the dist executor does, one instruction at a time (one
thread per rank: work on a rank is serialised): a send starts a flow and the rank moves on; a
receive is posted and the rank waits only when it reads the buffer. Every term comes from the
topology (for cpu4: measured by `einsummable calibrate`):

    overhead  = launch                     per instruction the runtime interprets (not Free/Output)
    compute   = overhead + max(tuple_flops / peak(dtype), tuple_bytes / mem_bw)   (roofline:
                matmuls are bound by the rate, elementwise ops by memory traffic)
                tuple_flops = op.flops · tuple share; tuple_bytes = inputs read + output written
    reduce    = overhead + (inputs + 1) · bytes / mem_bw       (read every input, write one)
    assemble  = overhead + 2 · bytes / mem_bw                  (read the parts, write the block)
    const     = overhead + bytes / mem_bw
    send      = overhead (+ 2 · bytes / mem_bw to pack a strided slice before it leaves)
    recv      = overhead                   slice, place: overhead (views, no copy)

A flow crosses one link (lowering splits relayed transfers into hops). Flows on the same link
resource share its bandwidth equally (progressive filling, recomputed at every start and end);
a message is usable `latency` (the per-message cost of one small send/recv) after its last byte
leaves. Predicted time = the last rank's end.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from ..ir import DTYPE_BYTES
from .program import (Assemble, Compute, Const, Free, Lowered, Output, Place, Recv, Reduce, Send,
                      Slice, reads)


# A flow with less than this left is finished (float drift on integer byte counts).
_DONE_BYTES = 1e-6


@dataclass(frozen=True)
class SimResult:
    time_s: float
    rank_end_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    link_bytes: dict[tuple[int, int], int] = field(default_factory=dict)

    def __str__(self) -> str:
        busiest = sorted(self.link_bytes.items(), key=lambda kv: -kv[1])[:4]
        links = ", ".join(f"{a}->{b}: {n / 1e6:.2f} MB" for (a, b), n in busiest)
        return (f"predicted {self.time_s * 1e3:.3f} ms; compute per rank "
                f"{[round(c * 1e3, 3) for c in self.compute_s]} ms; busiest links {links or '-'}")


@dataclass
class _Flow:
    tag: int
    resource: str
    bw: float
    latency: float
    remaining: float
    rate: float = 0.0


class _Network:
    def __init__(self) -> None:
        self.now = 0.0
        self.flows: list[_Flow] = []
        self.arrived: dict[int, float] = {}

    def _rates(self) -> None:
        count: dict[str, int] = {}
        for f in self.flows:
            count[f.resource] = count.get(f.resource, 0) + 1
        for f in self.flows:
            f.rate = f.bw / count[f.resource]

    def next_done(self) -> float:
        return min((self.now + f.remaining / f.rate for f in self.flows), default=math.inf)

    def advance(self, t: float) -> list[int]:
        """Move to time t, finishing flows on the way; returns the tags whose arrival is known."""
        done: list[int] = []
        while self.flows:
            t_next = self.next_done()
            if t_next > t:
                break
            self._progress(t_next)
            for f in [f for f in self.flows if f.remaining <= _DONE_BYTES]:
                self.flows.remove(f)
                self.arrived[f.tag] = t_next + f.latency
                done.append(f.tag)
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
            return
        self.flows.append(flow)
        self._rates()


def _numel(shape) -> int:
    return math.prod(shape)


def charged(ins) -> bool:
    """Whether the runtime pays its per-instruction overhead (`launch`) for `ins`: everything
    but the bookkeeping of Free and Output."""
    return not isinstance(ins, Free | Output)


def contiguous_slice(shape, region) -> bool:
    """A slice of a contiguous tensor is contiguous iff every dimension before the last one it
    cuts has extent one."""
    ext = [hi - lo for lo, hi in region]
    cuts = [i for i, (e, n) in enumerate(zip(ext, shape)) if e != n]
    return not cuts or all(e == 1 for e in ext[:cuts[-1]])


def simulate_programs(low: Lowered, topology: Any) -> SimResult:
    from ..topology import load_topology
    topo = load_topology(topology)
    g = low.graph
    ops = {op.name: op for op in g.ops}
    n = low.world_size
    shapes: list[dict[int, tuple[int, tuple[int, ...]]]] = [dict() for _ in range(n)]  # buf -> (elem bytes, shape)
    ready: list[dict[int, float]] = [dict() for _ in range(n)]
    recv_tag: list[dict[int, int]] = [dict() for _ in range(n)]   # buf -> tag
    t = [0.0] * n
    pc = [0] * n
    compute = [0.0] * n
    link_bytes: dict[tuple[int, int], int] = {}
    net = _Network()
    blocked: dict[int, int] = {}  # rank -> tag it waits for

    strided: list[set[int]] = [set() for _ in range(n)]  # bufs that are non-contiguous views

    def nbytes(r: int, b: int) -> int:
        elem, shape = shapes[r][b]
        return elem * _numel(shape)

    def cost(r: int, ins) -> float:
        dev = topo.devices[r]
        overhead = dev.launch_s if charged(ins) else 0.0
        if isinstance(ins, Compute):
            op = ops[ins.op]
            share = math.prod(hi - lo for lo, hi in ins.ranges) / math.prod(op.size.values())
            flops_s = op.flops * share / dev.peak(g.tensor(op.output).dtype)
            traffic = sum(nbytes(r, b) for b in ins.inputs) + nbytes(r, ins.out)
            return overhead + max(flops_s, traffic / dev.mem_bw)
        if isinstance(ins, Reduce):
            return overhead + (len(ins.inputs) + 1) * nbytes(r, ins.out) / dev.mem_bw
        if isinstance(ins, Assemble):
            return overhead + 2 * nbytes(r, ins.out) / dev.mem_bw
        if isinstance(ins, Const):
            return overhead + nbytes(r, ins.out) / dev.mem_bw
        if isinstance(ins, Send) and ins.src in strided[r]:
            return overhead + 2 * nbytes(r, ins.src) / dev.mem_bw
        return overhead

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
        elif isinstance(ins, Assemble):
            shapes[r][ins.out] = (DTYPE_BYTES[ins.dtype], ins.shape)
        elif isinstance(ins, Recv):
            shapes[r][ins.out] = (DTYPE_BYTES[ins.dtype], ins.shape)
        elif isinstance(ins, Reduce):
            shapes[r][ins.out] = shapes[r][ins.inputs[0]]

    def step(r: int) -> bool:
        """Run rank r's next instruction if its inputs are ready; False if it must wait."""
        ins = low.programs[r].instrs[pc[r]]
        start = t[r]
        for b in reads(ins):
            if b in recv_tag[r]:
                tag = recv_tag[r][b]
                if tag not in net.arrived:
                    blocked[r] = tag
                    return False
                ready[r][b] = net.arrived[tag]
            start = max(start, ready[r].get(b, 0.0))
        record_shape(r, ins)
        dt = cost(r, ins)
        if isinstance(ins, Compute):
            compute[r] += dt
        t[r] = start + dt
        if isinstance(ins, Recv):
            recv_tag[r][ins.out] = ins.tag
        elif isinstance(ins, Send):
            size = nbytes(r, ins.src)
            link = topo.link(r, ins.peer)
            if link is None:  # no direct link: charge the route's slowest link and latency
                route = topo.route(r, ins.peer)
                bw, lat, res = min(l.bw for l in route), sum(l.latency_s for l in route), \
                    "route:%d->%d" % (r, ins.peer)
            else:
                bw, lat, res = link.bw, link.latency_s, link.resource
            for tag in net.advance(t[r]):
                wake(tag)
            net.start(_Flow(ins.tag, res, bw, lat, float(size)))
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
        from ..errors import RuntimeFault
        raise RuntimeFault(f"simulation deadlocked: ranks {sorted(blocked)} wait for messages",
                           fix="the programs are inconsistent; lower the plan again")
    return SimResult(max(t), tuple(t), tuple(compute), link_bytes)


def simulate(plan: Any, choice=None, topology=None, *, mode: str = "optimized") -> SimResult:
    """Predicted time of a plan (Plan-like, or graph + choice + topology) or of a Lowered."""
    if isinstance(plan, Lowered):
        if topology is None:
            raise ValueError("simulate(lowered, topology=...) needs the topology")
        return simulate_programs(plan, topology)
    from ..lower import lower
    topo = topology if choice is not None else plan.topology
    return simulate_programs(lower(plan, choice, topology, mode=mode), topo)
