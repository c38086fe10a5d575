"""Kernels specialised on an operand whose values are known when the kernel is bound.

Capture spells some views as contractions with small constant matrices: a slice of the rotary
tables is `(a c) b, a d -> c b` against a one-hot selector, rotate-half is `... (d e), d f ->
... (f e)` against [[0, 1], [-1, 0]]. As products they broadcast-multiply the large operand once
per term; with the constant's values at hand they are a gather and a scale.

The math. Let K (the known operand) have one contracted mode k and at most one kept mode f
(modes of K in neither x nor the output have size one). If every column f of K has exactly one
nonzero, K[j_f, f] = c_f, then

    out[..., f, ...] = sum_k x[..., k, ...] K[k, f] = c_f * x[..., j_f, ...]

so out is x gathered at j along k's axis (that axis becoming f's), each column f not scaled
by 1 then scaled in place (negated for -1), and permuted into the output's mode order. When
j_f = j_0 + f and every c_f = 1 the gather is a slice, taken as a view. Anything else (two
nonzeros in a column, a batch mode shared by x and K, more contracted modes) is left to the
generic kernels: `selection_kernel` returns None.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .einsum import flat_modes
from .ir import Op

Kernel = Callable[[Sequence[torch.Tensor]], torch.Tensor]


def selection_kernel(op: Op, ext: dict[str, int], known: int,
                     value: torch.Tensor) -> Kernel | None:
    """The op as a gather when input `known` (holding `value`, a block of extents `ext`) is a
    one-nonzero-per-column selector; None when the op or the values are not of that form."""
    product = op.join.scaled_product()
    if len(op.inputs) != 2 or op.agg != "sum" or product is None \
            or sorted(product[0]) != [0, 1] or product[1] != 1.0:
        return None
    xi = 1 - known
    dx, dk = flat_modes(op.in_dims[xi]), flat_modes(op.in_dims[known])
    out = op.out_modes
    contracted = [m for m in dk if m in dx and m not in out]
    kept = [m for m in dk if m in out]
    if len(contracted) != 1 or len(kept) > 1 or any(m in dx for m in kept) \
            or any(m not in out and m not in dk for m in dx) \
            or any(ext[m] != 1 for m in dk if m not in dx and m not in out):
        return None
    k = contracted[0]
    f = kept[0] if kept else None
    # K as (k, f): its own modes in its own order, the others of size one
    order = [dk.index(k)] + ([dk.index(f)] if f else [])
    mat = value.reshape([ext[m] for m in dk])
    mat = mat.permute(order + [i for i in range(len(dk)) if i not in order])
    mat = mat.reshape(ext[k], ext[f] if f else 1)
    nonzero = mat != 0
    if not bool((nonzero.sum(0) == 1).all()):
        return None
    index = nonzero.to(torch.int64).argmax(0)          # j_f per column
    coef = mat.gather(0, index[None, :])[0]            # c_f
    # columns whose coefficient is not 1: (column, coefficient), applied in place on the copy
    scaled = [(j, float(c)) for j, c in enumerate(coef.tolist()) if c != 1]
    axis = dx.index(k)
    have = [(f or k) if m == k else m for m in dx]     # x's modes, k's axis now f's
    if f is None:  # a column of one: k's axis has size one and leaves the output
        have.remove(k)
    perm = [have.index(m) for m in out if m in have]
    fine = [ext[m] for m in dx]
    out_shape = [math.prod(ext[m] for m in g) for g in op.out_dims]

    def laid_out(y: torch.Tensor) -> torch.Tensor:
        """The selected rows, k's axis now f's, in the output's mode order and shape."""
        if f is None:
            y = y.squeeze(axis)
        if perm != list(range(len(perm))):
            y = y.permute(perm)
        return y.reshape(out_shape)

    # Consecutive rows, unscaled (a slice of the rotary tables): a view, nothing copied.
    # Programs never write a kernel's output in place, so a view of an input is safe.
    start = int(index[0]) if len(index) else 0
    if not scaled and torch.equal(index, torch.arange(start, start + len(index))):
        length = len(index)
        return lambda blocks: laid_out(blocks[xi].reshape(fine).narrow(axis, start, length))

    def run(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        x = blocks[xi].reshape(fine)
        y = x.index_select(axis, index.to(x.device))  # a fresh tensor: safe to scale in place
        for j, c in scaled:
            part = y.narrow(axis, j, 1)
            part.neg_() if c == -1 else part.mul_(c)
        return laid_out(y)
    return run
