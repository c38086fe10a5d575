"""Helpers the tests share: oracles and builders that more than one test file needs."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from einsummable.core.geometry import Region
from einsummable.frontend.ir import Op
from einsummable.frontend.reference import evaluate_op
from einsummable.frontend.scalar import combine
from einsummable.planning.spec import Decomposition, tuples


def block_of(t: torch.Tensor, reg: Region) -> torch.Tensor:
    return t[tuple(slice(lo, hi) for lo, hi in reg)]


def evaluate_by_tuples(op: Op, dec: Decomposition, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Evaluate `op` tuple by tuple under `dec` and aggregate the partials (to check a
    decomposition against `evaluate_op` on whole inputs)."""
    out_shape = [math.prod(op.size[m] for m in g) for g in op.out_dims]
    result = torch.empty(out_shape, dtype=blocks[0].dtype if blocks else torch.float32)
    acc: dict[tuple[int, ...], torch.Tensor] = {}
    regions: dict[tuple[int, ...], Region] = {}
    for t in tuples(op, dec):
        part = evaluate_op(op, [block_of(b, r) for b, r in zip(blocks, t.in_regions)],
                           t.range_of(op))
        key = t.out_block
        regions[key] = t.out_region
        if key in acc:
            acc[key] = combine(op.agg, acc[key], part) if op.agg else part
        else:
            acc[key] = part
    for key, val in acc.items():
        result[tuple(slice(lo, hi) for lo, hi in regions[key])] = val
    return result

