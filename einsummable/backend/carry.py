"""Where lowering leaves a plan's graph outputs, and the outputs carried to the next call.

Without a carry, a run returns its outputs whole on rank 0 (`RANK0`, what `run` returns),
leaves them where the plan computes them (`IN_PLACE`, partial sums folded), or hands each
output a block input is paired with (`frontend/handoff.steady_pairs`) on in that input's layout
(`STEADY`); the last two are the outputs the optimizer prices, and both hand the graph's
carried outputs (`Graph.carried`: a training step's parameters and state) on in their
inputs' layouts, as the optimizer prices them.

A `Carry` makes chosen outputs persist on the ranks between calls (a training step's
parameters and optimizer state). For a pair (x, y), input x arrives as the pieces
{(R_i, d_i)} of its plan layout (`Place(x, R_i)` on device d_i); output y, of x's shape and
dtype, is delivered to exactly those pieces, and device d_i keeps its block, `Keep(b, x, R_i)`.
The next call's `Place(x, R_i)` on d_i reads that block, so call t + 1 starts from
x_{t+1} = y_t and no byte of it passes through the caller. An output in `returned` also goes
whole to rank 0 (`Output`: a parameter the caller's module holds); the others (optimizer
state) never leave the ranks.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.geometry import Region
from ..core.program import Keep, Output
from ..errors import PlanError
from ..frontend.handoff import fed_back as fed_back_of
from ..frontend.ir import Graph, TensorInfo

# Where lowering leaves the graph outputs (`lower`'s `deliver`).
RANK0, IN_PLACE, STEADY = "rank0", "in_place", "steady"
DELIVERIES = (RANK0, IN_PLACE, STEADY)

Need = tuple[Region, int]  # (region, device)


@dataclass(frozen=True)
class Carry:
    """Outputs handed on to the next call (module docstring): `pairs` (input x, output y),
    y kept on the ranks as x's blocks; `returned` the ys that also go whole to rank 0."""
    pairs: tuple[tuple[str, str], ...]
    returned: tuple[str, ...] = ()

    def check(self, graph: Graph) -> None:
        """A named error unless every pair is a graph input and an output of its shape and
        dtype, each named once, and `returned` names carried outputs only."""
        inputs = {t.name: t for t in graph.inputs}
        xs = [x for x, _ in self.pairs]
        ys = [y for _, y in self.pairs]
        for x, y in self.pairs:
            if x not in inputs:
                raise PlanError(f"carried input {x!r} is not an input of the graph",
                                fix="pair each output with one of the graph's inputs")
            if y not in graph.outputs:
                raise PlanError(f"carried output {y!r} is not an output of the graph",
                                fix="pair each input with one of the graph's outputs")
            out = graph.tensor(y)
            if (out.shape, out.dtype) != (inputs[x].shape, inputs[x].dtype):
                raise PlanError(f"output {y!r} ({out.shape}, {out.dtype}) cannot stand for input "
                                f"{x!r} ({inputs[x].shape}, {inputs[x].dtype}) next call",
                                fix="pair tensors of one shape and dtype")
        if len(set(xs)) != len(xs) or len(set(ys)) != len(ys):
            raise PlanError("a carried input or output is named twice",
                            fix="pair each input with one output")
        if not set(self.returned) <= set(ys):
            raise PlanError(f"returned outputs {sorted(set(self.returned) - set(ys))} are not "
                            "carried", fix="list in `returned` carried outputs only; the others "
                            "go to rank 0 anyway")


def _needs(pieces) -> list[Need]:
    """A layout's whole blocks (no partial slices), one per (region, device)."""
    return list(dict.fromkeys((p.region, p.device) for p in pieces if p.slice == 0))


def deliver_outputs(st, deliver: str, carry: Carry | None,
                    send: Callable[[TensorInfo, list[Need]], Mapping[Need, int]]
                    ) -> list[set[int]]:
    """Emit every graph output's delivery (module docstring) on lowering's state `st` (its
    graph, world, layouts and emit); `send(info, needs)` delivers a tensor's needs and
    returns the buffer holding each. Returns, per rank, the buffers left for the caller
    (not freed)."""
    graph = st.graph
    if carry is not None and deliver != RANK0:
        raise PlanError(f"a carry keeps outputs between calls of a run; deliver={deliver!r} "
                        "prices a block alone", fix="lower with deliver='rank0' and a carry")
    carried: dict[str, str] = {}
    if carry is not None:
        carry.check(graph)
        carried = {y: x for x, y in carry.pairs}
    keep: list[set[int]] = [set() for _ in range(st.world)]
    fed_back = fed_back_of(graph, deliver == STEADY) if deliver != RANK0 else {}
    for name in graph.outputs:
        info = graph.tensor(name)
        x = carried.get(name)
        if x is not None:
            for (reg, d), b in send(info, _needs(st.layouts[x][0])).items():
                st.emit(d, Keep(b, x, reg))
            if name not in carry.returned:
                continue
        if deliver == RANK0:
            whole = tuple((0, s) for s in info.shape)
            b = send(info, [(whole, 0)])[(whole, 0)]
            st.emit(0, Output(name, b))
            keep[0].add(b)
            continue
        # left where the plan computes it (partial sums folded), or handed on in the layout
        # its block input arrived in: the output the optimizer priced
        x = fed_back.get(name)
        pieces = st.layouts[x][0] if x is not None else st.layouts[name][0]
        for (_, d), b in send(info, _needs(pieces)).items():
            keep[d].add(b)
    return keep
