"""When a weight's exchange runs: lowering sends the weights of the next `PREFETCH_OPS`
weight-reading ops ahead of an op's kernels (so they cross while it computes), and on a
transport that charges per message every weight at the start, in one batch, so that
coalescing packs each peer's blocks into one message. The memory model counts a gathered
weight from that step to its reader's, as the programs hold it; both read this rule.

With w_0 < w_1 < ... the weight-reading ops and seen(i) = #{j : step(w_j) <= i}, op w_j's
weights are exchanged during step i = the first step with seen(i) + prefetch > j (before
that step's kernels), prefetch = PREFETCH_OPS, or every weighted op where messages cost.
Which blocks coalescing packs into one message (`worth_packing`) is here for the same reason:
the memory model holds a packed message beside the blocks it is unpacked into.
"""
from __future__ import annotations

from ..frontend.ir import Graph, Op

# Times each packed byte is moved through memory: read and written by the pack, and again
# by the unpack when the part lands in a buffer rather than being used as a view.
PACK_PASSES = 4
# Weight-reading ops whose weights are in flight ahead of the op running: enough that a large
# matmul's weights start crossing while the small ops before it (norms, rotary) run.
PREFETCH_OPS = 4


def worth_packing(nbytes: int, sender, receiver) -> bool:
    """Whether message coalescing (`backend/coalesce.py`) packs a block: when the message it
    saves costs more than copying it twice."""
    saved = min(sender.message_s, receiver.message_s)
    copy = PACK_PASSES * nbytes / min(sender.mem_bw, receiver.mem_bw)
    return saved > copy


def weighted_ops(graph: Graph) -> list[Op]:
    """The ops that read a weight, in graph order."""
    return [op for op in graph.ops if any(graph.tensor(n).kind == "weight" for n in op.inputs)]


def prefetch_depth(graph: Graph, topology, prefetch: int = PREFETCH_OPS,
                   coalesce: bool = True) -> int:
    """How many weight-reading ops ahead lowering exchanges weights."""
    if coalesce and topology.charges_per_message:
        return len(weighted_ops(graph))
    return prefetch


def fetch_steps(graph: Graph, topology, prefetch: int = PREFETCH_OPS,
                coalesce: bool = True) -> dict[str, int]:
    """Weight-reading op -> the step whose exchanges carry its weights."""
    depth = prefetch_depth(graph, topology, prefetch, coalesce)
    weighted = {op.name for op in weighted_ops(graph)}
    order = [op.name for op in graph.ops if op.name in weighted]
    out: dict[str, int] = {}
    seen = 0
    for i, op in enumerate(graph.ops):
        seen += op.name in weighted
        while len(out) < min(seen + depth, len(order)):
            out[order[len(out)]] = i
    return out
