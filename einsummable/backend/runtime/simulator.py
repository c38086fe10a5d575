"""Discrete-event timing of lowered programs on a topology.

Each rank runs its program in order, as the dist executor does, one instruction at a time (one
thread per rank: work on a rank is serialised): a send starts a flow and the rank moves on; a
receive is posted and the rank waits only when it reads the buffer. Every term comes from the
topology (for cpu4: measured by `einsummable calibrate`):

    launch    = per kernel: Compute, Reduce, Assemble, the pack of a strided send, and
                one per p2p batch (a run of Send/Recv issued as one NCCL group; a weight
                prefetch's batch, or an early exchange's (`Send.side`: a streamed gradient,
                an input sent ahead of its reader), on a device with a prefetch stream
                launches there). Place, Alloc, Slice (views), Const, Recv posting, Free and
                Output launch nothing.
    compute   = `kernel_time`: launch + max(tuple_flops / achieved rate, tuple_bytes / achieved
                memory rate), the optimizer's compute model (`planning/kernel_time.py`);
                views (reshape, permute) relabel a block: free. Every kernel (compute,
                reduce, assemble, const, pack, unpack) that starts while flows to or from its
                rank run is slowed by them (`kernel_time.loaded_spans_s`, contention: the
                device's transfer_slowdown and transfer_memory, span by span as the flows
                running at its start end, `Network.load`)
                tuple_flops = op.flops · tuple share; tuple_bytes = inputs read + output written
    reduce    = launch + (inputs + 1) · bytes / memory rate   (read every input, write one);
                a streamed gradient's fold (`Reduce.queue`) on a device with a side stream
                takes no time on the rank: a flow on that stream's line, as a prefetched
                weight's copies below
    assemble  = launch + 2 · copied bytes / memory rate       (read the parts, write the block;
                receives that land in place copy nothing). A prefetched weight's copies
                (`Assemble.queue`) on a device with a prefetch stream take no time on the rank:
                they are a flow through its memory at COPY_MEMORY_SHARE of the memory rate
                (read and written), on a line of their own in program order, each once its
                parts are there; the buffer's readers wait for it, and kernels beside it are
                loaded by it (memory only: a copy engine holds no compute units)
    const     = nothing: every executor makes a constant's block on the plan's first run and
                keeps it (`rank_state._const`), and a run is timed after the first
    send      = launch + 2 · bytes / memory rate to pack a strided slice before it leaves
    message   = per Send and per Recv, the device's `message_s` (host work of the transport)
    two-way   = a message from a peer that crossed the rank's own last message to that peer
                (both in flight at once: an exchange, not a reply) is usable the device's
                `exchange_wait_s` after it arrived (host scheduling on gloo ranks whose cores
                computed just before; 0 on GPUs)
    pack      = launch + 2 · bytes / memory rate (several blocks for one peer as one message)
    unpack    = launch + 2 · bytes / memory rate of the parts it copies into place (views: free)

A rank's sends to one peer go one at a time in program order (a line per peer, another for
the weight prefetches: the next leaves when the last byte of the one before has left, as NCCL
runs a pair's operations on a stream in order), so a relay can forward the first chunk of a
block while the next arrives; the
contention rule counts the bytes waiting on the lines as the prefetches queued. Prefetch sends
(weights, `Send.queue` > 0) leave in queue order, one queue number after another per rank (one
stream; a queue number ends when every send the rank's program has in it has left, relays'
forwards included, which are posted only as their blocks arrive), so the weights needed first
arrive first; other sends start at once and take the
bandwidth first (the prefetch stream has low priority and gets what they leave). A send and
its receive are one transfer: one flow that loads its link and, where the link names
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
    prefetch_batches,
    reads,
)
from ...errors import PlanError, RuntimeFault
from ...frontend.ir import DTYPE_BYTES
from ...planning.cost import CostModel
from ...planning.kernel_time import (COPY_MEMORY_SHARE, KernelTime, kernel_time, loaded_spans_s,
                                     memory_rate, memory_s)
from ...planning.stack import stack
from ...topology import load_topology
from ..lowering import IN_PLACE, RANK0, STEADY, Lowered, lower
from ...planning.network import Flow, Network, Outbox, PrefetchQueue, rendezvous


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


# Blocks a steady-state block time is measured in: the last of them, after the others
# (`block_time`); two is enough for the weights of one block to stream behind the one before.
STEADY_BLOCKS = 2


# A reply that leaves the instant its request arrives (free view ops, no host work) must not
# count as crossing it through float rounding: two messages cross only if each left at least
# this long before the other arrived (far below any latency).
CROSSING_MARGIN_S = 1e-9

# Instructions that run a kernel on the device (Place, Slice, Recv, Free, Output: bookkeeping;
# Const: made once per plan and kept).
KERNELS = (Compute, Reduce, Assemble)


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
    net = Network()
    queues = []
    for prog in low.programs:  # each rank's sends per prefetch queue number
        expected: dict[int, int] = {}
        for ins in prog.instrs:
            if isinstance(ins, Send) and ins.queue:
                expected[ins.queue] = expected.get(ins.queue, 0) + 1
        queues.append(PrefetchQueue(net, expected))
    queue_of: dict[int, PrefetchQueue] = {}  # tag -> the queue that sent it

    def flow_done(tag: int) -> None:
        q = queue_of.pop(tag, None)
        if q is not None:
            q.done(tag)
        box = sender_of.pop(tag, None)
        if box is not None:
            box.done(tag, net.now)

    net.on_done = flow_done
    blocked: dict[int, int] = {}  # rank -> tag it waits for
    events: list[tuple[int, int, str, float, float, float]] = []

    strided: list[set[int]] = [set() for _ in range(n)]  # bufs that are non-contiguous views

    def nbytes(r: int, b: int) -> int:
        elem, shape = shapes[r][b]
        return elem * math.prod(shape)

    batch_opens = [p2p_batches(p.instrs) for p in low.programs]
    # a weight prefetch's batches, and an early exchange's, launch on the side stream of a
    # device that has one
    prefetched = {i.tag for p in low.programs for i in p.instrs
                  if isinstance(i, Send) and (i.queue or i.side)}
    for r, p in enumerate(low.programs):
        if topo.devices[r].prefetch_stream:
            batch_opens[r] -= prefetch_batches(p.instrs, prefetched)
    contended = [bool(d.achieved.transfer_slowdown or d.achieved.transfer_memory)
                 for d in topo.devices]

    def kernel(r: int, ins) -> KernelTime | None:
        """The kernel `ins` runs on rank r, unloaded (None: no kernel)."""
        dev = topo.devices[r]
        mem_eff = cost_model.mem_efficiency

        def copy(moved: float) -> KernelTime:
            return KernelTime(0.0, memory_s(dev, moved, mem_eff), dev.launch_s)

        if isinstance(ins, Compute):
            op = ops[ins.op]
            if op.is_view:  # a reshape or permute relabels the block: no kernel (as priced)
                return None
            share = op.share(ins.ranges)
            traffic = sum(nbytes(r, b) for b in ins.inputs) + nbytes(r, ins.out)
            return kernel_time(op, op.flops * share, traffic, g.tensor(op.output).dtype, dev,
                               cost_model.flop_efficiency, mem_eff)
        if isinstance(ins, Reduce):
            return copy((len(ins.inputs) + 1) * nbytes(r, ins.out))
        if isinstance(ins, Assemble):  # only the parts it copies: receives landed in place
            copied = sum(math.prod(region_shape(b)) for _, _, b in ins.parts) * shapes[r][ins.out][0]
            return copy(2 * copied)
        if isinstance(ins, Const):  # made once per plan, kept by the executors (`_const`)
            return None
        if isinstance(ins, Pack):
            return copy(2 * nbytes(r, ins.out))
        if isinstance(ins, Unpack):  # views are free; parts landing in a buffer are copied
            copied = sum(math.prod(shape) for _, shape, into, _ in ins.parts if into is not None)
            return copy(2 * copied * DTYPE_BYTES[ins.dtype]) if copied else None
        if isinstance(ins, Send) and ins.src in strided[r]:
            return copy(2 * nbytes(r, ins.src))  # pack kernel: read, write
        return None

    def cost(r: int, ins, start: float, kt: KernelTime | None) -> float:
        """Seconds `ins` keeps rank r busy from `start`: its kernel `kt`, slowed by the flows
        to or from r then running (contention), and its transport work."""
        dev = topo.devices[r]
        if kt is None:
            dt = 0.0
        else:
            queued = (sum(q.queued_bytes(r) for q in queues)
                      + sum(box.queued_bytes(r) for box in outbox)) if contended[r] else 0.0
            dt = loaded_spans_s(kt, dev, net.load(r, start, queued), cost_model.mem_efficiency)
        if pc[r] in batch_opens[r]:
            dt += dev.launch_s  # the batch's one p2p kernel
        if isinstance(ins, Send | Recv):
            dt += dev.message_s  # the transport's per-message host work
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
                                  (sum(math.prod(shapes[r][b][1]) for b in ins.srcs),))
        elif isinstance(ins, Unpack):
            for out, shape, _, _ in ins.parts:
                shapes[r][out] = (DTYPE_BYTES[ins.dtype], shape)

    def step(r: int) -> bool:
        """Run rank r's next instruction if its inputs are ready; False if it must wait. A
        Send never waits: the rank's communication engine takes it (`Outbox`)."""
        ins = low.programs[r].instrs[pc[r]]
        start = t[r]
        side = isinstance(ins, Assemble | Reduce) and ins.queue > 0 and prefetch_stream[r]
        # An Unpack only names views of a packed receive: its readers wait, it does not; a
        # Send and a copy on the copy stream wait on their own lines.
        waits_on = () if isinstance(ins, Unpack | Send) or side else reads(ins)
        for b in waits_on:
            for tag in recv_tag[r].get(b, ()):
                if tag not in net.arrived:
                    blocked[r] = tag
                    return False
                usable = net.arrived[tag]
                if exchange_wait[r] and crossed(r, tag):
                    usable += exchange_wait[r]
                ready[r][b] = max(ready[r].get(b, 0.0), usable)
            start = max(start, ready[r].get(b, 0.0))
        record_shape(r, ins)
        kt = None if side else kernel(r, ins)
        dt = cost(r, ins, start, kt)
        if isinstance(ins, Compute) and kt is not None:
            compute[r] += kt.total_s  # the work itself; contention shows in the rank's end
        if trace:
            events.append((r, pc[r], type(ins).__name__, t[r], start, start + dt))
        t[r] = start + dt
        if isinstance(ins, Recv):
            posted[ins.tag] = t[r]
            outbox[ins.peer].posted(ins.tag, t[r])  # its sender's line, if it waits
            recv_tag[r].setdefault(ins.out, []).append(ins.tag)
            if ins.into is not None:  # read through that buffer, or forwarded as the view
                recv_tag[r].setdefault(ins.into, []).append(ins.tag)
            source[ins.tag] = ins.peer
        elif isinstance(ins, Unpack):
            tags = recv_tag[r].get(ins.src, [])
            for out, _, into, _ in ins.parts:
                recv_tag[r].setdefault(out, []).extend(tags)
                if into is not None:
                    recv_tag[r].setdefault(into, []).extend(tags)
        elif isinstance(ins, Send):
            size = nbytes(r, ins.src)
            link = topo.link(r, ins.peer)
            # No direct link (lowering splits relays into hops, so rare): the bytes load every
            # link of the route at once (cut-through) and pay every latency.
            route = (link,) if link is not None else topo.route(r, ins.peer)
            res = tuple((l.resource, l.bw) for l in route) \
                + tuple(p for l in route for p in l.port_resources)
            # the arrivals known when the send was issued; not up to t[r], which may lie past
            # other ranks' clocks (a batch's launch) and would start their sends late
            for tag in net.advance(max(net.now, start)):
                wake(tag)
            flow = Flow(ins.tag, res, sum(l.latency_s for l in route), float(size),
                        urgent=not ins.queue, ends=(r, ins.peer))
            tags = recv_tag[r].get(ins.src, ())
            waiting: set = {x for x in tags if x not in net.arrived}
            met = [net.arrived[x] for x in tags if x in net.arrived]
            if rendezvous(size, bool(ins.queue)):  # it waits for the receive (`network`)
                if ins.tag in posted:
                    met.append(posted[ins.tag])
                else:
                    waiting.add(("posted", ins.tag))
            outbox[r].post(ins.peer, ins.queue, flow, waiting,
                           max([t[r], ready[r].get(ins.src, 0.0)] + met))
            link_bytes[(r, ins.peer)] = link_bytes.get((r, ins.peer), 0) + size
            last_sent[r][ins.peer] = ins.tag
        elif side:
            post_copy(r, ins, start)
        elif not isinstance(ins, Free | Output):
            w = getattr(ins, "out", None)
            if w is not None:
                ready[r][w] = t[r]
        pc[r] += 1
        return True

    def post_copy(r: int, ins: Assemble | Reduce, start: float) -> None:
        """A prefetched weight's copies, or a streamed gradient's fold, on r's side stream
        (module docstring, assemble and reduce); readers of `ins.out` wait for the flow as
        for a receive."""
        dev = topo.devices[r]
        if isinstance(ins, Reduce):  # read every input, write one: as copying half that
            srcs = ins.inputs
            copied = (len(srcs) + 1) * nbytes(r, ins.out) / 2
        else:
            srcs = tuple(src for src, _, _ in ins.parts)
            copied = sum(math.prod(region_shape(b)) for _, _, b in ins.parts) * shapes[r][ins.out][0]
        tag = -1 - len(copies)  # apart from the program's tags
        copies.append(tag)
        rate = COPY_MEMORY_SHARE * memory_rate(dev, cost_model.mem_efficiency) / 2
        flow = Flow(tag, ((f"copy{r}", rate),), dev.launch_s, float(copied), ends=(r, r),
                    sms=False)
        tags = [x for src in srcs for x in recv_tag[r].get(src, ())]
        for x in net.advance(max(net.now, start)):
            wake(x)
        outbox[r].post(r, 0, flow, {x for x in tags if x not in net.arrived},
                       max([t[r]] + [ready[r].get(src, 0.0) for src in srcs]
                           + [net.arrived[x] for x in tags if x in net.arrived]))
        recv_tag[r].setdefault(ins.out, []).append(tag)

    def crossed(r: int, tag: int) -> bool:
        """Whether message `tag` to r and r's last message to its sender were in flight at
        once (module docstring: two-way)."""
        mine = last_sent[r].get(source.get(tag, -1))
        if mine is None or mine not in started:
            return False
        return (started[tag] < net.arrived.get(mine, math.inf) - CROSSING_MARGIN_S
                and started[mine] < net.arrived[tag] - CROSSING_MARGIN_S)

    def wake(tag: int) -> None:
        for r, want in list(blocked.items()):
            if want == tag:
                del blocked[r]
        for box in outbox:
            box.arrived(tag, net.arrived[tag])

    def issue(now: float) -> None:
        for r, box in enumerate(outbox):
            for queue, flow in box.take(now):
                started[flow.tag] = now
                sender_of[flow.tag] = box
                if queue:
                    queue_of[flow.tag] = queues[r]
                    queues[r].send(queue, flow)
                else:
                    net.start(flow)

    outbox = [Outbox() for _ in range(n)]
    prefetch_stream = [d.prefetch_stream for d in topo.devices]
    copies: list[int] = []  # the copy streams' flow tags
    sender_of: dict[int, Outbox] = {}  # tag in flight -> its sender's outbox
    lengths = [len(p.instrs) for p in low.programs]
    exchange_wait = [d.exchange_wait_s for d in topo.devices]
    last_sent: list[dict[int, int]] = [dict() for _ in range(n)]  # peer -> tag of r's last send
    source: dict[int, int] = {}  # tag -> the rank that sends it
    started: dict[int, float] = {}  # tag -> when its flow left its sender's outbox
    posted: dict[int, float] = {}  # tag -> when its receiver posted the receive
    while True:
        runnable = [r for r in range(n) if pc[r] < lengths[r] and r not in blocked]
        t_send = min(box.next_ready() for box in outbox)
        if not runnable and not net.flows and t_send == math.inf:
            break
        t_rank = min((t[r] for r in runnable), default=math.inf)
        t_net = net.next_done()
        if t_send <= min(t_net, t_rank):
            for tag in net.advance(t_send):
                wake(tag)
            issue(t_send)
            continue
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
            issue(net.now)
            # Keep running this rank while it stays the earliest (others cannot affect it sooner).
            others = [t[k] for k in range(n) if k != r and pc[k] < lengths[k] and k not in blocked]
            if t[r] > min(others + [net.next_done()] + [b.next_ready() for b in outbox]):
                break
    if any(pc[r] < lengths[r] for r in range(n)) or any(box.pending for box in outbox):
        raise RuntimeFault(f"simulation deadlocked: ranks {sorted(blocked)} wait for messages",
                           fix="the programs are inconsistent; lower the plan again")
    return SimResult(max(t), tuple(t), tuple(compute), link_bytes, tuple(events))


def simulate(plan: Any, choice=None, topology=None, *, mode: str = "optimized",
             cost_model: CostModel | None = None, deliver: str | None = None) -> SimResult:
    """Predicted time of a plan (a Plan, or graph + choice + topology) or of a Lowered.

    A Plan is priced with the cost model it was solved on and its outputs go where its
    objective left them (handed on in the input layout with steady state, else folded in
    place), so its simulated time and its objective speak of the same program; a graph and
    a choice deliver their outputs to rank 0, as `run` does. `cost_model` and `deliver`
    (`lowering.DELIVERIES`) override those choices."""
    options = getattr(plan, "options", None) if choice is None else None
    if cost_model is None:
        cost_model = options.cost if options is not None else CostModel()
    if isinstance(plan, Lowered):
        if topology is None:
            raise ValueError("simulate(lowered, topology=...) needs the topology")
        return simulate_programs(plan, topology, cost_model=cost_model)
    if deliver is None:
        deliver = RANK0 if options is None else STEADY if options.steady_state else IN_PLACE
    topo = topology if choice is not None else plan.topology
    return simulate_programs(lower(plan, choice, topology, mode=mode, deliver=deliver), topo,
                             cost_model=cost_model)


def block_time(plan: Any, blocks: int = STEADY_BLOCKS) -> float:
    """Seconds one block of a steady-state plan takes in a stack: T(blocks) - T(blocks - 1)
    of the plan stacked (`planning/stack.py`), each lowered with its output handed on in the
    input's layout. The time its objective speaks of, without the first block's cold start."""
    if not plan.options.steady_state:
        raise PlanError("a block time needs a plan optimized with steady_state=True",
                        fix="simulate(plan) gives the time of a plan that is not a block")
    times = []
    for k in (blocks - 1, blocks):
        graph, choice = stack(plan.graph, plan.chosen, k)
        low = lower(graph, choice, plan.topology, deliver=STEADY)
        times.append(simulate_programs(low, plan.topology,
                                       cost_model=plan.options.cost).time_s)
    return times[1] - times[0]
