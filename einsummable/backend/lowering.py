"""Lowering: a plan (graph + one candidate per op and per graph input) -> one Program per rank.

Walk the ops in order. For each input of each op, the producer's pieces and the consumer's
needs go through `exchange.synthesize`; its transfers become Send/Recv pairs hop by hop (a relay
receives and forwards), its folds become Reduce, and each need is cut (Slice) or stitched
(Assemble) from the full buffers its device then holds; an activation several ops read is
sent from its producer to the first of them, and from that reader's needs to the others
(`placement.rereads`, as the optimizer prices it); a received block that is only copied
into place is received there directly (Alloc + Recv into a region, `landing.py`). Each
tuple becomes a Compute on every device that runs it. Weights do not depend on activations,
so the exchanges of the next `prefetch` weight-reading ops are emitted before an op's
kernels, as numbered prefetch queues (the simulator sends them in order on a low-priority
stream), and on devices with a prefetch stream their stitching copies right behind them
(`Assemble.queue`). A training step's gradient is exchanged right after the op that computes
it, and the next op's inputs made already before an op's kernels, so their transfers run
behind them; what reads the arrivals waits for the reader (`early.py`). Graph outputs are
delivered whole to rank 0 the same way, or where `carry.py` says (kept on the ranks for the
next call). Finally every buffer is freed after its last read. All ranks are emitted in one
global order (see `core/program.py`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core.geometry import (
    Region,
    contains,
    intersect,
    region_shape,
    relative,
    subtract,
)
from ..core.program import (
    Alloc,
    Assemble,
    Compute,
    Const,
    Free,
    Output,
    Pack,
    Place,
    Program,
    Recv,
    Reduce,
    Send,
    Slice,
    Unpack,
    reads,
    writes,
)
from ..errors import PlanError
from ..frontend.handoff import streamed_gradients
from ..frontend.ir import Graph, TensorInfo
from ..planning.cost import consumer_needs
from ..planning.exchange import synthesize
from ..planning.timing import replays
from ..planning.placement import (
    INPUT_PREFIX,
    Candidate,
    check_candidate,
    input_needs,
    input_op,
    needs_layout,
    output_layout,
    rereads,
)
from ..planning.prefetch import PREFETCH_OPS, prefetch_depth, weighted_ops
from ..planning.spec import tuples
from ..planning.transfers import Exchange, pack_groups
from ..topology import load_topology
# (IN_PLACE, STEADY: the deliveries' names, imported from here by the simulator and `show`)
from .carry import DELIVERIES, IN_PLACE, RANK0, STEADY, Carry, deliver_outputs  # noqa: F401
from .coalesce import coalesce as pack_messages
from .early import SIDE_QUEUE, defer_reads
from .landing import recv_in_place



@dataclass(frozen=True)
class Lowered:
    """Everything an executor needs: the graph (op definitions), one program per rank, and the
    input layout (which ranks hold which blocks of each graph input)."""
    graph: Graph
    programs: tuple[Program, ...]
    mode: str = "optimized"

    @property
    def world_size(self) -> int:
        return len(self.programs)

    def __str__(self) -> str:
        return "\n\n".join(str(p) for p in self.programs)

    def to_json(self) -> str:
        return json.dumps({"graph": self.graph.to_dict(), "mode": self.mode,
                           "programs": [p.to_dict() for p in self.programs]},
                          sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "Lowered":
        d = json.loads(text)
        return Lowered(Graph.from_dict(d["graph"]),
                       tuple(Program.from_dict(p) for p in d["programs"]), d.get("mode", "optimized"))



@dataclass
class _State:
    graph: Graph
    world: int
    instrs: list[list] = field(default_factory=list)
    next_buf: int = 0
    next_tag: int = 0
    queue: int = 0  # prefetch queue number given to the Sends being emitted (0: at once)
    # tensor -> device -> [(region, slices, buf)]
    held: dict[str, dict[int, list[tuple[Region, tuple[int, ...], int]]]] = field(default_factory=dict)

    def buf(self) -> int:
        self.next_buf += 1
        return self.next_buf - 1

    def emit(self, rank: int, ins) -> None:
        self.instrs[rank].append(ins)

    def hold(self, tensor: str, dev: int, reg: Region, slices: tuple[int, ...], buf: int) -> None:
        self.held.setdefault(tensor, {}).setdefault(dev, []).append((reg, slices, buf))

    def find(self, tensor: str, dev: int, reg: Region, slices: tuple[int, ...]) -> int:
        """A buffer on dev holding exactly `reg` (slicing a held one if needed)."""
        for r, s, b in self.held.get(tensor, {}).get(dev, ()):
            if s == slices and r == reg:
                return b
        for r, s, b in self.held.get(tensor, {}).get(dev, ()):
            if s == slices and contains(r, reg):
                out = self.buf()
                self.emit(dev, Slice(out, b, relative(reg, r)))
                return out
        raise PlanError(f"lowering: device {dev} lacks {reg} of {tensor!r} (slices {slices})",
                        fix="this is a bug in exchange synthesis; report the plan")


def _assemble(st: _State, info: TensorInfo, dev: int, reg: Region, queue: int = 0) -> int:
    full = [(r, b) for r, s, b in st.held.get(info.name, {}).get(dev, ()) if s == ()]
    for r, b in full:
        if r == reg:
            return b
    for r, b in full:
        if contains(r, reg):
            out = st.buf()
            st.emit(dev, Slice(out, b, relative(reg, r)))
            return out
    todo, parts = [reg], []
    for r, b in full:
        nxt = []
        for u in todo:
            cut = intersect(u, r)
            if cut is None:
                nxt.append(u)
                continue
            parts.append((b, relative(cut, r), relative(cut, reg)))
            nxt.extend(subtract(u, cut))
        todo = nxt
        if not todo:
            break
    if todo:
        raise PlanError(f"lowering: device {dev} cannot assemble {reg} of {info.name!r}",
                        fix="this is a bug in exchange synthesis; report the plan")
    out = st.buf()
    st.emit(dev, Assemble(out, region_shape(reg), info.dtype, tuple(parts), queue=queue))
    st.hold(info.name, dev, reg, (), out)
    return out


def _apply(st: _State, info: TensorInfo, ex: Exchange, agg: str | None, topology) -> None:
    events = sorted([(t.round, 0, i) for i, t in enumerate(ex.transfers)]
                    + [(r.round, 1, i) for i, r in enumerate(ex.reduces)])
    groups = pack_groups(ex) if replays(topology) else {}
    packed: dict[int, int] = {}  # transfer -> the contiguous view of its group's pack it sends
    for _, kind, i in events:
        if kind == 0:
            t = ex.transfers[i]
            if i in groups:
                _pack_group(st, info, [(j, ex.transfers[j]) for j in groups[i]], packed)
            buf = packed.pop(i) if i in packed else st.find(info.name, t.src, t.region,
                                                             t.slices)
            for a, c in zip(t.hops, t.hops[1:]):
                tag = st.next_tag
                st.next_tag += 1
                st.emit(a, Send(buf, c, tag, st.queue))
                new = st.buf()
                st.emit(c, Recv(new, a, tag, region_shape(t.region), info.dtype))
                buf = new
                if c != t.dst and not t.slices:  # a relay keeps the full block: the
                    st.hold(info.name, c, t.region, (), buf)  # synthesis may send it on
            st.hold(info.name, t.dst, t.region, t.slices, buf)
        else:
            r = ex.reduces[i]
            ins = tuple(st.find(info.name, r.device, r.region, s) for s in r.inputs)
            out = st.buf()
            st.emit(r.device, Reduce(out, agg or "sum", ins))
            st.hold(info.name, r.device, r.region, r.out, out)


def _pack_group(st: _State, info: TensorInfo, members, packed: dict[int, int]) -> None:
    """One pack kernel for a device's strided sends of a round (`transfers.pack_groups`):
    their slices laid end to end, then each a contiguous view of that buffer in its shape."""
    dev = members[0][1].src
    srcs = tuple(st.find(info.name, dev, t.region, t.slices) for _, t in members)
    flat = st.buf()
    st.emit(dev, Pack(flat, srcs, info.dtype))
    parts = []
    for j, t in members:
        packed[j] = st.buf()
        parts.append((packed[j], region_shape(t.region), None, None))
    st.emit(dev, Unpack(flat, tuple(parts), info.dtype))


def _covered(st: _State, name: str, dev: int, reg: Region) -> bool:
    """Whether the whole (not partial) blocks of `name` held on dev cover `reg`."""
    todo = [reg]
    for r, s, _ in st.held.get(name, {}).get(dev, ()):
        if s == ():
            todo = [p for u in todo for p in ([u] if intersect(u, r) is None
                                              else subtract(u, intersect(u, r)))]
        if not todo:
            return True
    return not todo


def _exchange(st: _State, info: TensorInfo, needs, mode: str, topology,
              source: tuple | None = None) -> None:
    """Send every need of a tensor that its device does not already hold whole (delivered for
    an earlier reader, or prefetched): exchanging it again would resend the same bytes. The
    sends start from `source` (pieces, aggregation), by default the producer's layout."""
    pieces, agg = source or st.layouts[info.name]
    todo = [(q, d) for q, d in needs if not _covered(st, info.name, d, q)]
    if todo:
        _apply(st, info, synthesize(info, pieces, todo, agg, topology, mode), agg, topology)


def _assemble_early(st: _State, info: TensorInfo, needs, queue: int, topology) -> None:
    """Stitch a prefetched weight's needs right behind its transfers, on the copy stream of
    every device that has one (`Assemble.queue`), as NCCL copies an all-gather's local shard
    inside its kernel: the reader then finds the need whole and its compute stream copies
    nothing. A need a held block already covers is left to `_deliver` (a view)."""
    for q, d in dict.fromkeys(needs):
        held = st.held.get(info.name, {}).get(d, ())
        if topology.devices[d].prefetch_stream and not any(s == () and contains(r, q)
                                                       for r, s, _ in held):
            _assemble(st, info, d, q, queue)


def _deliver(st: _State, info: TensorInfo, needs, mode: str, topology,
             source: tuple | None = None) -> dict[tuple[Region, int], int]:
    """Buffers holding each (region, device) need of a tensor (sent from `source`, see
    `_exchange`)."""
    out: dict[tuple[Region, int], int] = {}
    if info.kind == "constant":
        for q, d in needs:
            if (q, d) not in out:
                b = st.buf()
                st.emit(d, Const(b, info.name, q))
                out[(q, d)] = b
        return out
    _exchange(st, info, needs, mode, topology, source)
    for q, d in needs:
        if (q, d) not in out:
            out[(q, d)] = _assemble(st, info, d, q)
    return out


def _insert_frees(instrs: list, keep: set[int]) -> list:
    last: dict[int, int] = {}
    for i, ins in enumerate(instrs):
        for b in reads(ins):
            last[b] = i
        w = writes(ins)
        if w is not None:
            last.setdefault(w, i)
    ends: dict[int, list[int]] = {}
    for b, i in last.items():
        if b not in keep:
            ends.setdefault(i, []).append(b)
    out = []
    for i, ins in enumerate(instrs):
        out.append(ins)
        for b in sorted(ends.get(i, ())):
            out.append(Free(b))
    return out


def _unpack(plan: Any, choice: Mapping[str, Candidate] | None, topology: Any):
    if choice is None:
        choice, topology = plan.choice, plan.topology
        plan = plan.graph
    # Plan.choice may be a mapping or a tuple of (key, candidate) pairs.
    return plan, dict(choice.items() if hasattr(choice, "items") else choice), topology


def lower(plan: Any, choice: Mapping[str, Candidate] | None = None, topology: Any = None, *,
          mode: str = "optimized", prefetch: int = PREFETCH_OPS,
          coalesce: bool = True, deliver: str = RANK0, carry: Carry | None = None,
          stream: bool = True, ahead: bool = True) -> Lowered:
    """`lower(plan)` with a Plan-like object (.graph, .choice, .topology), or
    `lower(graph, choice, topology)`. `mode` is the exchange mode ("optimized" or "naive").
    `coalesce`: blocks for one peer in one p2p batch travel as one message (`coalesce.py`).
    `deliver`: where the graph outputs go: "rank0" (whole, to rank 0: what `run` returns),
    "in_place" (where the plan computes them, partial sums folded), or "steady" (each output
    a block input is paired with handed on in that input's layout, the rest in place): the
    last two are the outputs the optimizer prices, without and with steady state.
    `carry`: outputs kept on the ranks as the blocks of their paired inputs next call
    (`carry.py`). `stream`: gradients exchanged once computed (`early.py`), else at their
    update, as any other input (for comparison). `ahead`: the next op's inputs made already
    are exchanged before an op's kernels, so their transfers run behind them (`early.py`)."""
    if deliver not in DELIVERIES:
        raise PlanError(f"unknown output delivery {deliver!r}",
                        fix=f"use one of: {', '.join(DELIVERIES)}")
    graph, choice, topology = _unpack(plan, choice, topology)
    topology = load_topology(topology)
    world = topology.world_size
    st = _State(graph, world, [[] for _ in range(world)])
    st.layouts = {}
    for info in graph.inputs:
        key = INPUT_PREFIX + info.name
        if key not in choice:
            raise PlanError(f"the plan has no layout for graph input {info.name!r}",
                            fix=f"add a candidate under {key!r} over placement.input_op(info)")
        _check_devices(key, choice[key], world)
        iop = input_op(info)
        check_candidate(iop, choice[key])
        pieces = output_layout(iop, choice[key])
        for p in pieces:
            b = st.buf()
            st.emit(p.device, Place(b, info.name, p.region))
            st.hold(info.name, p.device, p.region, (), b)
        st.layouts[info.name] = (pieces, None)
    for op in graph.ops:
        if op.name not in choice:
            raise PlanError("the plan has no candidate for this op", op=op.name,
                            source=op.source, fix="give every op a candidate in plan.choice")
        check_candidate(op, choice[op.name])
        _check_devices(op.name, choice[op.name], world)
    # Weights do not depend on the activations: their transfers for the next `prefetch` ops
    # that read weights go out before this op's kernels, so they flow while it computes.
    # (A transport that charges per message: every weight at the start, `prefetch.py`.)
    weighted = weighted_ops(graph)
    prefetch = prefetch_depth(graph, topology, prefetch, coalesce)
    fetched = 0

    def fetch_weights(upto: int) -> None:
        nonlocal fetched
        while fetched < min(upto, len(weighted)):
            w_op = weighted[fetched]
            fetched += 1
            st.queue = fetched
            for i, name in enumerate(w_op.inputs):
                info = graph.tensor(name)
                if info.kind == "weight":
                    needs = input_needs(w_op, choice[w_op.name], i)
                    _exchange(st, info, needs, mode, topology)
                    _assemble_early(st, info, needs, fetched, topology)
            st.queue = 0

    # An activation several ops read: the later readers' needs are sent from the needs of
    # the first (`placement.rereads`), as the optimizer prices them.
    heads = rereads(graph)
    sources: dict[str, tuple] = {}
    streamed = streamed_gradients(graph) if stream else {}  # sent once computed (`early.py`)
    deferred: dict[str, list[list]] = {}  # reader -> per rank, what reads early arrivals
    side = [d.prefetch_stream for d in topology.devices]  # where folds run beside compute
    seen = 0  # ops of `weighted` lowered so far

    def early(name: str, reader, source) -> None:
        """`name`'s exchange for `reader` emitted now, what reads its arrivals deferred to
        the reader (`early.py`); stitched on the side stream where there is one."""
        info = graph.tensor(name)
        marks = [len(p) for p in st.instrs]
        needs = [n for i, x in enumerate(reader.inputs) if x == name
                 for n in input_needs(reader, choice[reader.name], i)]
        _exchange(st, info, needs, mode, topology, source)
        _assemble_early(st, info, needs, SIDE_QUEUE, topology)
        for rank, instrs in enumerate(defer_reads(st.instrs, marks, side)):
            deferred.setdefault(reader.name, [[] for _ in range(world)])[rank] += instrs

    for k_op, op in enumerate(graph.ops):
        cand = choice[op.name]
        for rank, instrs in enumerate(deferred.pop(op.name, ())):
            st.instrs[rank].extend(instrs)
        seen += op in weighted
        fetch_weights(seen)
        bufs = []
        for i, name in enumerate(op.inputs):
            bufs.append(_deliver(st, graph.tensor(name), input_needs(op, cand, i), mode, topology,
                                 sources.get(name)))
        for name in dict.fromkeys(op.inputs):
            if heads.get(name) == op.name:  # later readers start from what the head read
                sources[name] = (needs_layout(consumer_needs(op, cand, name)), None)
        fetch_weights(seen + prefetch)
        if ahead and k_op + 1 < len(graph.ops):  # the next op's inputs made already
            nxt = graph.ops[k_op + 1]
            for name in dict.fromkeys(nxt.inputs):
                if name in st.layouts and name not in streamed and (
                        graph.tensor(name).kind not in ("weight", "constant")):
                    early(name, nxt, sources.get(name))
        pieces = output_layout(op, cand)
        multi = pieces[0].n_slices > 1
        for t, devs in zip(tuples(op, cand.dec), cand.devices):
            for d in devs:
                ins = tuple(bufs[i][(t.in_regions[i], d)] for i in range(len(op.inputs)))
                b = st.buf()
                st.emit(d, Compute(b, op.name, t.ranges, ins))
                st.hold(op.output, d, t.out_region, (t.agg_slice,) if multi else (), b)
        st.layouts[op.output] = (pieces, op.agg)
        if op.output in streamed:
            early(op.output, graph.op(streamed[op.output]), None)
    keep = deliver_outputs(st, deliver, carry,
                           lambda info, needs: _deliver(st, info, needs, mode, topology))
    programs = tuple(Program(r, world, tuple(_insert_frees(recv_in_place(st.instrs[r]), keep[r])))
                     for r in range(world))
    if coalesce:
        programs = pack_messages(programs, topology)
    return Lowered(graph, programs, mode)


def lower_exchange(info: TensorInfo, pieces, needs, agg: str | None, topology, *,
                   mode: str = "optimized") -> Lowered:
    """The programs of one exchange alone, as `lower` emits it inside a plan: `info` held as
    `pieces`, delivered to `needs` (each read at the end, so a rank ends when its needs are
    there), messages packed as `lower` packs them. What `planning/replay.py` is checked
    against (`tests/test_replay.py`)."""
    topology = load_topology(topology)
    world = topology.world_size
    st = _State(None, world, [[] for _ in range(world)])
    for p in pieces:
        b = st.buf()
        st.emit(p.device, Place(b, info.name, p.region))
        st.hold(info.name, p.device, p.region, (p.slice,) if p.n_slices > 1 else (), b)
    st.layouts = {info.name: (tuple(pieces), agg)}
    keep: list[set[int]] = [set() for _ in range(world)]
    for (_, d), b in _deliver(st, info, needs, mode, topology).items():
        keep[d].add(b)
        st.emit(d, Output(info.name, b))
    programs = tuple(Program(r, world, tuple(_insert_frees(recv_in_place(st.instrs[r]), keep[r])))
                     for r in range(world))
    graph = Graph((TensorInfo(info.name, tuple(info.shape), info.dtype, "input"),), (),
                  (info.name,))
    return Lowered(graph, pack_messages(programs, topology), mode)


def _check_devices(name: str, cand: Candidate, world: int) -> None:
    bad = [d for d in cand.used_devices if not 0 <= d < world]
    if bad:
        raise PlanError(f"candidate uses devices {bad} but the topology has {world}", op=name,
                        fix="optimize the graph for this topology, or pick a topology whose "
                            "world size covers the plan")
