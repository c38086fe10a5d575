"""Boxes: a region of a tensor is one half-open range per dimension.

Every stage speaks of tensor pieces as boxes: the decompositions cut the join space into them,
the exchange synthesiser intersects and subtracts them, the bounds count their volumes,
lowering slices buffers by them. For boxes A = Π [a_k, a'_k) and B = Π [b_k, b'_k):

    A ∩ B = Π_k [max(a_k, b_k), min(a'_k, b'_k))          (empty if any factor is)
    A \\ B = at most 2·rank disjoint boxes (peel B off A one dimension at a time)
"""
from __future__ import annotations

import math
from functools import lru_cache

Range = tuple[int, int]
Region = tuple[Range, ...]  # one half-open range per tensor dimension


@lru_cache(maxsize=None)
def block_bounds(size: int, parts: int) -> tuple[Range, ...]:
    """Split [0, size) into `parts` contiguous ranges whose lengths differ by at most one."""
    if not 1 <= parts <= size:
        raise ValueError(f"cannot split {size} elements into {parts} parts")
    base, extra = divmod(size, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return tuple(out)


def cut_along(x: Region, dim: int, k: int) -> list[Region]:
    """x cut along `dim` into k consecutive parts whose extents differ by at most one."""
    lo = x[dim][0]
    return [x[:dim] + ((lo + a, lo + b),) + x[dim + 1:]
            for a, b in block_bounds(x[dim][1] - lo, k)]


def region_shape(reg: Region) -> tuple[int, ...]:
    return tuple(hi - lo for lo, hi in reg)


def volume(reg: Region) -> int:
    return math.prod(hi - lo for lo, hi in reg)


def intersect(a: Region, b: Region) -> Region | None:
    """Overlap of two regions of one tensor, or None when they do not meet."""
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def contains(outer: Region, inner: Region) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def subtract(a: Region, b: Region) -> list[Region]:
    """a \\ b as disjoint boxes (b need not lie inside a)."""
    cut = intersect(a, b)
    if cut is None:
        return [a]
    out: list[Region] = []
    rest = list(a)
    for k, ((lo, hi), (clo, chi)) in enumerate(zip(a, cut)):
        if lo < clo:
            out.append(tuple(rest[:k]) + ((lo, clo),) + tuple(rest[k + 1:]))
        if chi < hi:
            out.append(tuple(rest[:k]) + ((chi, hi),) + tuple(rest[k + 1:]))
        rest[k] = (clo, chi)
    return out


def relative(inner: Region, outer: Region) -> Region:
    """`inner` in the coordinates of a buffer holding `outer` (inner lies inside outer)."""
    return tuple((a - o, b - o) for (a, b), (o, _) in zip(inner, outer))


def contiguous_slice(shape, region) -> bool:
    """A slice of a contiguous tensor is contiguous iff every dimension before the last one it
    cuts has extent one."""
    ext = [hi - lo for lo, hi in region]
    cuts = [i for i, (e, n) in enumerate(zip(ext, shape)) if e != n]
    return not cuts or all(e == 1 for e in ext[:cuts[-1]])
