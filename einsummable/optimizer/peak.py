"""A plan's memory peak per device by the liveness model (`memory.py`): the same footprints the
MIP's memory rows are made of, summed for the chosen candidates, so that the rows, the peak a
plan reports and the diagnosis of an infeasible model never disagree.

    peak(d) = max over steps t of load[d][t],   load[d][t] = sum_v m[v, choice(v), d, t]

plus, with weights placed freely, the weight blocks an op reads on a device where the weight's
layout does not hold them (`stored_otherwise`): the rows cannot see them, so a plan's peak
can exceed its rows there; `gather_cuts.py` cuts off such plans, and `api.optimize` never
returns one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..core.geometry import intersect, region_shape
from ..frontend.ir import DTYPE_BYTES, Graph
from ..planning.candidates import OpCandidates
from ..planning.cost import consumer_needs
from ..planning.placement import INPUT_PREFIX, output_layout
from ..planning.plan import Plan
from .memory import FIT_REL_TOL, Footprint, footprints, load, steps_of
from .model import Model, fixed_nodes

# How many of the largest tensors alive at a peak its account names.
TOP_TENSORS = 4
MB = 1e6


def _mb(nbytes: float) -> str:
    """Megabytes to three figures, whole ones past 100 (no exponents: 71410 MB, 0.852 MB)."""
    x = nbytes / MB
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


@dataclass(frozen=True)
class DevicePeak:
    """Device `device` holds `bytes` at step `step` (graph op `op` running), the most it holds
    at any step; `largest`: the largest parts then alive, (what, bytes), where what is a
    tensor's name or a term of the model ("inputs gathered by <op>", ...)."""
    device: int
    bytes: int
    step: int
    op: str | None
    largest: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        parts = ", ".join(f"{what} {_mb(b)} MB" for what, b in self.largest)
        at = f"at op {self.op!r} (step {self.step})" if self.op else f"at step {self.step}"
        return (f"device {self.device} needs {_mb(self.bytes)} MB {at}; largest alive: "
                f"{parts}")


@dataclass(frozen=True)
class StoredOtherwise:
    """Op `op` reads, on `device`, `bytes` of weight blocks that the layout of its weight
    input node `weight` does not hold there: gathered over steps first..last."""
    op: str
    weight: str  # the weight's input node ("input:<name>")
    device: int
    bytes: int
    first: int
    last: int


def stored_otherwise(graph: Graph, nodes: Mapping[str, OpCandidates], fp
                     ) -> list[StoredOtherwise]:
    """The weight blocks each op reads on a device that the weight's chosen layout does not
    hold there, under weights placed freely. The MIP's rows leave these out (whether a block
    is held depends on two nodes' choices, which a row over one node's choice cannot see:
    `memory.py`; `gather_cuts.py` adds them as cuts); for one plan both choices are known, so
    a plan's peak counts them, over the same fetch..step window."""
    out = []
    for k, oc in nodes.items():
        if k.startswith(INPUT_PREFIX):
            continue
        for name in dict.fromkeys(oc.op.inputs):
            info = graph.tensor(name)
            src = nodes.get(INPUT_PREFIX + name)
            if info.kind != "weight" or src is None:
                continue
            missing = missing_bytes(consumer_needs(oc.op, oc.cands[0], name),
                                    output_layout(src.op, src.cands[0]),
                                    DTYPE_BYTES[info.dtype])
            out += [StoredOtherwise(k, INPUT_PREFIX + name, d, b, fp[k].fetch, fp[k].lo)
                    for d, b in missing.items()]
    return out


def missing_bytes(needs, layout, itemsize: int) -> dict[int, int]:
    """Device -> bytes of the blocks `needs` ((region, device) pairs) asks for there that the
    pieces of `layout` on that device do not hold (pieces of one layout do not overlap)."""
    held: dict[int, list] = {}
    for piece in layout:
        held.setdefault(piece.device, []).append(piece.region)
    missing: dict[int, int] = {}
    for q, d in needs:
        covered = sum(math.prod(region_shape(r)) for h in held.get(d, ())
                      if (r := intersect(q, h)) is not None)
        left = math.prod(region_shape(q)) - covered
        if left > 0:
            missing[d] = missing.get(d, 0) + left * itemsize
    return missing


@dataclass(frozen=True)
class Loads:
    """One plan's bytes per device per step (`rows[d][t]`, its gathered weight blocks
    counted), the footprints they sum and those blocks (`extra`)."""
    fp: Mapping[str, Footprint]
    rows: list[list[int]]
    extra: tuple[StoredOtherwise, ...]

    def fullest(self, d: int) -> int:
        """Device d's fullest step (the first of equals)."""
        return max(range(len(self.rows[d])), key=lambda s: (self.rows[d][s], -s))


def fixed_loads(graph: Graph, topology, nodes: Mapping[str, OpCandidates], weights: str,
                layers: int = 1) -> Loads:
    """The loads where each node has exactly one candidate (the chosen one), under the
    weights option `weights`, the graph one of `layers` blocks."""
    layouts = {k: [output_layout(oc.op, c) for c in oc.cands] for k, oc in nodes.items()}
    fp = footprints(graph, topology, nodes, layouts, weights, layers=layers)
    rows = load(fp, {k: 0 for k in nodes}, topology.world_size, steps_of(graph))
    extra = () if weights == "sharded" else tuple(stored_otherwise(graph, nodes, fp))
    for x in extra:
        for t in range(x.first, x.last + 1):
            rows[x.device][t] += x.bytes
    return Loads(fp, rows, extra)


def fixed_peaks(graph: Graph, topology, nodes: Mapping[str, OpCandidates], weights: str,
                layers: int = 1) -> tuple[DevicePeak, ...]:
    """Every device's peak where each node has exactly one candidate (the chosen one), under
    the weights option `weights`, the graph one of `layers` blocks."""
    loads = fixed_loads(graph, topology, nodes, weights, layers)
    fp, rows, extra = loads.fp, loads.rows, loads.extra
    out = []
    for d in range(topology.world_size):
        t = loads.fullest(d)
        parts = []
        for k, f in fp.items():
            y = nodes[k].op.output
            labels = (y, f"inputs gathered by {k}", f"weights gathered for {k}",
                      f"packed weight messages for {k}", f"partial sums of {y} folded")
            for label, (terms, lo, hi) in zip(labels, f.terms()):
                if lo <= t <= hi and terms[0][d]:
                    parts.append((label, terms[0][d]))
        parts += [(f"weights gathered for {x.op}", x.bytes) for x in extra
                  if x.device == d and x.first <= t <= x.last]
        parts.sort(key=lambda p: (-p[1], p[0]))
        op = graph.ops[t].name if graph.ops else None
        out.append(DevicePeak(d, rows[d][t], t, op, tuple(parts[:TOP_TENSORS])))
    return tuple(out)


def peak_bytes(plan: Plan) -> tuple[DevicePeak, ...]:
    """A plan's peak per device by the liveness model the optimizer bounds memory with."""
    return fixed_peaks(plan.graph, plan.topology,
                       fixed_nodes(plan.graph, plan.topology, plan.options, plan.chosen),
                       plan.options.weights, plan.options.layers)


def chosen_nodes(model: Model, assignment: Mapping[str, int]) -> dict[str, OpCandidates]:
    """The model's nodes, each with its chosen candidate (node -> candidate index) alone."""
    return {k: OpCandidates(k, oc.op, (oc.cands[assignment[k]],),
                            (oc.level_parts[assignment[k]],))
            for k, oc in model.nodes.items()}


def assignment_peaks(model: Model, assignment: Mapping[str, int]) -> tuple[DevicePeak, ...]:
    """The peaks of one assignment of a model (node -> candidate index)."""
    return fixed_peaks(model.graph, model.topology, chosen_nodes(model, assignment),
                       model.options.weights, model.options.layers)


def assignment_loads(model: Model, assignment: Mapping[str, int]) -> Loads:
    """The loads of one assignment of a model (node -> candidate index)."""
    return fixed_loads(model.graph, model.topology, chosen_nodes(model, assignment),
                       model.options.weights, model.options.layers)


def overfilled(model: Model, assignment: Mapping[str, int]) -> DevicePeak | None:
    """The first device whose peak under `assignment` exceeds its memory, or None. With
    weights stored once the rows count every block (a solution meets them): None."""
    if model.options.weights == "sharded":
        return None
    return next((p for p in assignment_peaks(model, assignment)
                 if p.bytes > model.topology.devices[p.device].mem_bytes * (1 + FIT_REL_TOL)),
                None)
