"""Inputs the ranks keep between runs of a plan (`Keep`, `backend/carry.py`), from the caller's
side: which inputs a lowered plan keeps, the input check that lets a kept input go unpassed,
and a kept input gathered whole again from the blocks the ranks hold.

An input x is *resident* once a run of the plan has kept it: each rank holds, for every
`Place(x, R)` of its program, the block R that the last run's `Keep(b, x, R)` left. The caller
passes x on the first run, and again only to replace what the ranks hold (the value changed
outside the run); otherwise the ranks read their kept blocks.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ...core.program import Keep
from ...errors import RuntimeFault
from ...frontend.reference import TORCH_DTYPES, check_inputs
from ..lowering import Lowered

Blocks = Mapping[tuple, torch.Tensor]  # (input, region) -> block


def kept_inputs(low: Lowered) -> frozenset[str]:
    """The inputs whose blocks the programs keep for the next run."""
    return frozenset(ins.tensor for p in low.programs for ins in p.instrs
                     if isinstance(ins, Keep))


def check_fed(low: Lowered, inputs: Mapping[str, torch.Tensor], held: Iterable[str]) -> None:
    """`reference.check_inputs`, where an input in `held` (kept by the ranks) may be left out:
    a stand-in of its shape, which holds no memory, takes its place in the check."""
    graph = low.graph
    stand_in = {n: torch.empty(graph.tensor(n).shape, device="meta")
                for n in held if n not in inputs}
    check_inputs(graph, {**inputs, **stand_in})


def held_locally(store: Mapping[int, Blocks]) -> set[str]:
    """The inputs a local run's store (rank -> kept blocks) holds."""
    return {name for blocks in store.values() for name, _ in blocks}


def gather(low: Lowered, names: Iterable[str], blocks: Blocks) -> dict[str, torch.Tensor]:
    """Each input of `names` whole, on the CPU, from kept blocks (any rank's; a block
    replicated on several ranks holds the same values on each). A named error where the
    blocks do not cover it."""
    out: dict[str, torch.Tensor] = {}
    for name in names:
        info = low.graph.tensor(name)
        whole = torch.empty(info.shape, dtype=TORCH_DTYPES[info.dtype])
        filled = torch.zeros(info.shape, dtype=torch.bool)
        for (tensor, region), block in blocks.items():
            if tensor == name:
                at = tuple(slice(a, b) for a, b in region)
                whole[at] = block.detach().cpu()
                filled[at] = True
        if not bool(filled.all()):
            raise RuntimeFault(f"the ranks keep no whole copy of {name!r}",
                               fix="run the plan once (it keeps its carried inputs) before "
                                   "gathering them")
        out[name] = whole
    return out
