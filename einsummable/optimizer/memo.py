"""The memo of one model build: what repeated blocks share."""
from __future__ import annotations

from typing import Sequence

from ..frontend.ir import Graph
from ..planning.candidates import OpCandidates, structural
from ..planning.cost import ComputeCost, compute_cost, consumer_needs, finished_needs
from ..planning.placement import needs_layout, output_layout
from ..planning.plan import Options
from .pricing import EdgeMatrix, EdgePricer


def _project(values: Sequence) -> tuple[tuple[int, ...], list]:
    index: dict = {}
    proj = []
    for v in values:
        proj.append(index.setdefault(v, len(index)))
    return tuple(proj), list(index)



class BuildMemo:
    """Memo for one model build. Repeated blocks have ops that differ only in names, so their
    layouts, needs, compute costs and edge matrices are computed once, keyed on the op's
    structure (names stripped) and its candidate tuple, and the very same objects are reused."""

    def __init__(self, graph: Graph, topology, options: Options, pricer: EdgePricer) -> None:
        self.graph, self.topology, self.options, self.pricer = graph, topology, options, pricer
        self.computed = {op.output for op in graph.ops}
        self._struct: dict[str, object] = {}
        self._memo: dict[tuple, object] = {}

    def struct(self, oc: OpCandidates):
        s = self._struct.get(oc.key)
        if s is None:
            s = (structural(oc.op), oc.cands)
            self._struct[oc.key] = s
        return s

    def get(self, key: tuple, make):
        """The memoised value of `key`, made by `make()` on first use."""
        hit = self._memo.get(key)
        if hit is None:
            hit = make()
            self._memo[key] = hit
        return hit

    def layouts(self, oc: OpCandidates) -> list:
        sop, cands = self.struct(oc)
        return self.get(("layouts", sop, cands),
                         lambda: [output_layout(sop, c) for c in cands])

    def compute(self, oc: OpCandidates) -> tuple[ComputeCost, ...]:
        sop, cands = self.struct(oc)
        g = self.graph
        sig = (tuple(g.tensor(n).dtype for n in oc.op.inputs), g.tensor(oc.op.output).dtype,
               oc.op.output in self.computed)
        return self.get(("compute", sop, cands, sig), lambda: tuple(
            compute_cost(oc.op, c, g, self.topology, self.options.cost) for c in oc.cands))

    def projected_layouts(self, oc: OpCandidates):
        sop, cands = self.struct(oc)
        return self.get(("rows", sop, cands), lambda: _project(self.layouts(oc)))

    def projected_needs(self, oc: OpCandidates, tensor: str):
        sop, cands = self.struct(oc)
        where = tuple(i for i, n in enumerate(oc.op.inputs) if n == tensor)
        return self.get(("cols", sop, cands, where), lambda: _project(
            [consumer_needs(oc.op, c, tensor) for c in oc.cands]))

    def projected_sources(self, oc: OpCandidates, tensor: str):
        """A head reader's needs of `tensor` as the layouts its later readers read from
        (`placement.rereads`): the projection of its candidates, and one layout per need."""
        cols, needs = self.projected_needs(oc, tensor)
        return cols, self.get(("sources", id(needs)), lambda: [needs_layout(n) for n in needs])

    def projected_finished(self, oc: OpCandidates):
        sop, cands = self.struct(oc)
        return self.get(("finished", sop, cands), lambda: _project(
            [finished_needs(p) for p in self.layouts(oc)]))

    def matrix(self, info, lay: list, needs: list, agg) -> EdgeMatrix:
        key = ("matrix", info.shape, info.dtype, agg, id(lay), id(needs))
        return self.get(key, lambda: EdgeMatrix(self.pricer, info, lay, needs, agg))

