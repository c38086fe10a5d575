"""Memory (liveness model). Ops run in graph order t = 0..T-1. A tensor is live from the step that
produces it (graph inputs: from the start) through its last reader (graph outputs: to the end);
weights are live throughout. At step t device d holds:

- held: every live tensor's pieces on d (replicas and partial slices count in full);
- gathered: the activation blocks op t reads on d;
- fetched: the weight blocks gathered on d for every op v with fetch(v) <= t <= step(v):
  lowering exchanges an op's weights ahead of it, from step fetch(v) (`planning/prefetch.py`,
  the rule both read), and holds them until it runs;
- packed: where the transport charges per message, lowering packs each peer's small weight
  blocks into one message (`prefetch.worth_packing`), held at the fetch step beside the blocks
  it is unpacked into; a peer sends its 1/k of a block k devices read, one message unpacked
  before the next;
- folded: a graph output left in partial sums is folded at the end on the device of each
  block's slice 0, which receives the other n - 1 slices and adds them into a new block: n
  blocks' bytes there at the last step.

A block its device already holds whole is read in place (a view, no bytes). Whether it is
depends on the producer's choice too, which a row over one node's choice cannot see; the rows
assume what a plan does unless it pays an exchange for nothing: a block only one device reads
is held there, so only blocks several devices read (in part) count as gathered or fetched (a
weight stored once and gathered, FSDP; an activation all-gathered), and no weight block where
weights may be placed freely (replicas are not stored once). So, with x[v,c] the choice,

    m[v,c,d,t] = held[v,c,d]     [lo(v) <= t <= hi(v)]
               + gathered[v,c,d] [t = step(v)]
               + fetched[v,c,d]  [fetch(v) <= t <= step(v)]
               + packed[v,c,d]   [t = fetch(v)]
               + folded[v,c,d]   [t = T - 1]
    row (d, t):  sum_v sum_c m[v,c,d,t] x[v,c] <= capacity(d)

This gives one row per (device, step); rows that no choice can violate are dropped before
solving. `peak.py` sums the same footprints for one plan: the rows and a plan's peak are one
computation (`backend/footprint.py` walks what the programs allocate, to check it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..core.geometry import Region, intersect, region_shape
from ..frontend.ir import DTYPE_BYTES, Graph
from ..planning.candidates import OpCandidates
from ..planning.cost import consumer_needs, resident_bytes
from ..planning.prefetch import fetch_steps, worth_packing
from .memo import BuildMemo


@dataclass(frozen=True)
class Footprint:
    """One node's part of every row: each term, per candidate per device, bytes over its
    steps (`terms`): held over lo..hi, gathered at lo (the op's step), fetched over
    fetch..lo, packed at fetch, folded at last."""
    held: Sequence[Sequence[int]]
    gathered: Sequence[Sequence[int]]
    fetched: Sequence[Sequence[int]]
    packed: Sequence[Sequence[int]]
    folded: Sequence[Sequence[int]]
    lo: int
    hi: int
    fetch: int
    last: int  # T - 1

    def at(self, c: int, d: int, t: int) -> int:
        """Candidate c's bytes on device d at step t: m[v,c,d,t]."""
        return sum(b[c][d] for b, lo, hi in self.terms() if lo <= t <= hi)

    def terms(self):
        """(bytes per candidate per device, first step, last step) of each term."""
        return ((self.held, self.lo, self.hi), (self.gathered, self.lo, self.lo),
                (self.fetched, self.fetch, self.lo), (self.packed, self.fetch, self.fetch),
                (self.folded, self.last, self.last))


def _liveness(graph: Graph, nodes: Mapping[str, OpCandidates]) -> dict[str, tuple[int, int]]:
    steps = max(1, len(graph.ops))
    step_of = {op.name: i for i, op in enumerate(graph.ops)}
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            last[name] = i
    for y in graph.outputs:
        last[y] = steps - 1
    live = {}
    for k, oc in nodes.items():
        info = graph.tensor(oc.op.output)
        first = step_of.get(k, 0)
        end = steps - 1 if info.kind == "weight" else last.get(oc.op.output, first)
        live[k] = (first, max(first, end))
    return live


def _shared_needs(needs: Sequence[tuple[Region, int]]) -> list[tuple[Region, int, int]]:
    """(block, device, k) of each need whose block k > 1 devices read (in part)."""
    devices: dict[Region, set[int]] = {}
    for q, d in needs:
        devices.setdefault(q, set()).add(d)
    out = []
    for q, d in needs:
        readers = set(devices[q])
        for r, ds in devices.items():
            if r != q and intersect(q, r) is not None:
                readers |= ds
        if len(readers) > 1:
            out.append((q, d, len(readers)))
    return out


def _node_bytes(graph: Graph, oc: OpCandidates, layouts: Sequence, n: int, is_op: bool,
                weights: str, packs: bool, devices: Sequence, layers: int):
    """Per candidate: bytes held per device (a weight's for every one of `layers` blocks),
    activation bytes gathered per device at its own step, and weight bytes gathered per
    device (held from their fetch step)."""
    info = graph.tensor(oc.op.output)
    copies = layers if info.kind == "weight" else 1
    held = [[b * copies for b in resident_bytes(l, info.dtype, n)] for l in layouts]
    gathered, fetched, packed = [], [], []
    for c in oc.cands:
        acts, fetch, pack = [0] * n, [0] * n, [0] * n
        if is_op:
            for name in dict.fromkeys(oc.op.inputs):
                t = graph.tensor(name)
                weight = t.kind == "weight"
                if weight and weights != "sharded":
                    continue
                for q, d, k in _shared_needs(consumer_needs(oc.op, c, name)):
                    b = math.prod(region_shape(q)) * DTYPE_BYTES[t.dtype]
                    if not weight:
                        acts[d] += b
                        continue
                    fetch[d] += b
                    dev = devices[d]
                    if packs and worth_packing(b // k, dev, dev):
                        pack[d] += b // k
        gathered.append(acts)
        fetched.append(fetch)
        packed.append(pack)
    folded = [[0] * n for _ in layouts]
    if oc.op.output in graph.outputs:
        for fold, pieces in zip(folded, layouts):
            for p in pieces:
                if p.n_slices > 1 and p.slice == 0:
                    fold[p.device] += p.n_slices * math.prod(region_shape(p.region)) \
                        * DTYPE_BYTES[info.dtype]
    return held, gathered, fetched, packed, folded


def footprints(graph: Graph, topology, nodes: Mapping[str, OpCandidates],
               layouts: Mapping[str, list], weights: str, shared: BuildMemo | None = None,
               layers: int = 1) -> dict[str, Footprint]:
    """Every node's footprint (the one source of the MIP's rows and of a plan's peak), under
    the weights option `weights` ("sharded" or "free"), the graph one of `layers` blocks."""
    n = topology.world_size
    step_of = {op.name: i for i, op in enumerate(graph.ops)}
    live = _liveness(graph, nodes)
    fetch = fetch_steps(graph, topology)
    packs = topology.charges_per_message  # lowering's coalescing packs weight messages
    devices = topology.devices

    def node_bytes(k: str, oc: OpCandidates):
        if shared is None:
            return _node_bytes(graph, oc, layouts[k], n, k in step_of, weights, packs,
                               devices, layers)
        sop, cands = shared.struct(oc)
        sig = (tuple((graph.tensor(x).dtype, graph.tensor(x).kind == "weight")
                     for x in oc.op.inputs),
               tuple(oc.op.inputs.index(x) for x in oc.op.inputs),  # which inputs coincide
               graph.tensor(oc.op.output).dtype, k in step_of,
               oc.op.output in graph.outputs)
        return shared.get(("bytes", sop, cands, sig, weights, packs, layers),
                          lambda: _node_bytes(graph, oc, layouts[k], n, k in step_of,
                                              weights, packs, devices, layers))
    return {k: Footprint(*node_bytes(k, oc), *live[k], fetch.get(k, live[k][0]),
                         steps_of(graph) - 1)
            for k, oc in nodes.items()}


def steps_of(graph: Graph) -> int:
    return max(1, len(graph.ops))


def load(fp: Mapping[str, Footprint], choice: Mapping[str, int], n: int, steps: int
         ) -> list[list[int]]:
    """Bytes per device per step of one choice (node -> candidate index):
    load[d][t] = sum_v m[v, choice(v), d, t]."""
    diff = [[0] * (steps + 1) for _ in range(n)]  # difference arrays per device
    for k, c in choice.items():
        for d in range(n):
            for terms, lo, hi in fp[k].terms():
                b = terms[c][d]
                if b:
                    diff[d][lo] += b
                    diff[d][hi + 1] -= b
    out = []
    for d in range(n):
        acc, row = 0, []
        for t in range(steps):
            acc += diff[d][t]
            row.append(acc)
        out.append(row)
    return out


def memory_rows(graph: Graph, topology, nodes: Mapping[str, OpCandidates],
                layouts: Mapping[str, list], weights: str, shared: BuildMemo | None = None,
                layers: int = 1):
    """Rows (device, step) of the liveness model that some choice could overfill, as
    (node -> row -> per candidate bytes, capacities, the rows' (device, step)); all None when
    no choice can break any row (then the constraints are redundant and left out)."""
    n = topology.world_size
    steps = steps_of(graph)
    fp = footprints(graph, topology, nodes, layouts, weights, shared, layers)
    worst = [[0.0] * (steps + 1) for _ in range(n)]  # difference arrays per device
    for f in fp.values():  # each term at its largest over the candidates: an upper bound
        for terms, lo, hi in f.terms():
            for d, b in enumerate(map(max, zip(*terms))):
                if b:
                    worst[d][lo] += b
                    worst[d][hi + 1] -= b
    keep = []
    for d in range(n):
        acc = 0.0
        cap = float(topology.devices[d].mem_bytes)
        for t in range(steps):
            acc += worst[d][t]
            if acc > cap:
                keep.append((d, t))
    if not keep:
        return None, None, None
    memory = {k: tuple(tuple(float(f.at(c, d, t)) for c in range(len(f.held))) for d, t in keep)
              for k, f in fp.items()}
    return memory, tuple(float(topology.devices[d].mem_bytes) for d, _ in keep), tuple(keep)




# A row may sit this far (relative) over its capacity and still fit: the solver keeps rows
# feasible to about 1e-7 of their size, so its own answers must pass.
FIT_REL_TOL = 1e-6


def fits(memory: Mapping[str, Sequence[Sequence[float]]] | None,
         capacities: Sequence[float] | None, assignment: Mapping[str, int]) -> bool:
    """Whether a choice (node -> candidate index) keeps every kept (device, step) row of the
    liveness model within its capacity. No rows: every choice fits."""
    if memory is None or capacities is None:
        return True
    return all(sum(memory[k][i][c] for k, c in assignment.items()) <= cap * (1 + FIT_REL_TOL)
               for i, cap in enumerate(capacities))
