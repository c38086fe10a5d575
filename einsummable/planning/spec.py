"""Join-agg specs: every legal decomposition of an op, and the geometry of its tuples.

Splitting mode m into p_m parts cuts the join space into prod(p_m) tuples. A tuple reads one
region of each input and writes one block of the output; when an aggregated mode is split, the
tuples that share an output block each write a partial result, and `agg_slice` says which.

A windowed mode (`frontend/windows.py`: convolution and pooling read an input dimension through
a window) is never split; each tuple reads the window of its output block instead,
[y0 s - p, (y1 - 1) s + (K - 1) d - p + 1) clipped to the input, so neighbouring blocks' input
regions overlap by the halo and the exchange fetches it like any other need.

Uneven sizes split into blocks that differ by at most one (the first `size % parts` blocks are
one larger). A grouped dimension such as d = (h e) stays contiguous only if every mode after the
first one with blocks longer than one element is whole; the enumerator keeps exactly those.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

from ..core.geometry import Range, Region, block_bounds
from ..frontend.einsum import Dims
from ..frontend.ir import Op


@dataclass(frozen=True)
class Decomposition:
    """Parts per mode, in the op's canonical mode order (output modes first)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def part(self) -> dict[str, int]:
        return dict(self.parts)

    @property
    def n_tuples(self) -> int:
        return math.prod(p for _, p in self.parts)

    def split_modes(self) -> tuple[str, ...]:
        return tuple(m for m, p in self.parts if p > 1)

    def __str__(self) -> str:
        split = [f"{m}/{p}" for m, p in self.parts if p > 1]
        return " ".join(split) if split else "whole"


@dataclass(frozen=True)
class TupleGeometry:
    """One tuple: its block index per mode, global ranges, input regions and output block."""

    index: tuple[int, ...]
    ranges: tuple[Range, ...]
    in_regions: tuple[Region, ...]
    out_region: Region
    out_block: tuple[int, ...]
    agg_slice: int

    def range_of(self, op: Op) -> dict[str, Range]:
        return dict(zip(op.modes, self.ranges))


def _groups_contiguous(op: Op, dims: Dims, part: dict[str, int]) -> bool:
    """merged = m1 * (s2..sk) + ... is one contiguous run iff, after the first mode whose block
    is longer than one element, every mode is whole."""
    for group in dims:
        long_seen = False
        for m in group:
            p = part.get(m, 1)
            if long_seen and p > 1:
                return False
            long_seen = long_seen or p < op.size[m]
    return True


def is_legal(op: Op, part: dict[str, int]) -> bool:
    """Parts respect sizes, the kernel's splittable modes, and group contiguity."""
    for m in op.modes:
        p = part.get(m, 1)
        if p < 1 or p > op.size[m] or (p > 1 and not op.can_split(m)):
            return False
    return all(_groups_contiguous(op, d, part) for d in (op.out_dims, *op.in_dims))


def _factorizations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Ordered k-tuples of positive integers whose product is n."""
    if k == 0:
        if n == 1:
            yield ()
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, k - 1):
                yield (d, *rest)


def decompositions(op: Op, n: int, *, replication: bool = True) -> tuple[Decomposition, ...]:
    """Every legal decomposition into n tuples; with `replication`, also into any divisor of n
    (the remaining factor is replicated work). Deterministic order: fewer tuples first."""
    return _decompositions(op, n, replication)


@lru_cache(maxsize=4096)
def _decompositions(op: Op, n: int, replication: bool) -> tuple[Decomposition, ...]:
    counts = [d for d in range(1, n + 1) if n % d == 0] if replication else [n]
    modes = op.modes
    out: list[Decomposition] = []
    for count in counts:
        for parts in _factorizations(count, len(modes)):
            part = dict(zip(modes, parts))
            if is_legal(op, part):
                out.append(Decomposition(tuple(zip(modes, parts))))
    return tuple(out)


def region(dims: Dims, rng: dict[str, Range], size: dict[str, int]) -> Region:
    """The region of a tensor whose dims group `dims`, given each mode's range.

    For a group (m1 ... mk) the outermost split mode carries the range and every inner mode
    is whole (guaranteed by `is_legal`), so the block is one contiguous run of the merged dim.
    """
    out: list[Range] = []
    for group in dims:
        lo, hi = 0, 1
        for m in group:
            a, b = rng[m]
            lo, hi = lo * size[m] + a, (hi - 1) * size[m] + b
        out.append((lo, hi))
    return tuple(out)


def tuples(op: Op, dec: Decomposition) -> tuple[TupleGeometry, ...]:
    """All tuples in canonical (row-major over the op's modes) order."""
    return _tuples(op, dec)


@lru_cache(maxsize=4096)
def _tuples(op: Op, dec: Decomposition) -> tuple[TupleGeometry, ...]:
    part = dec.part
    modes = op.modes
    bounds = [block_bounds(op.size[m], part.get(m, 1)) for m in modes]
    n_out = len(op.out_modes)
    agg_parts = [part.get(m, 1) for m in modes[n_out:]]
    out: list[TupleGeometry] = []
    for index in itertools.product(*(range(len(b)) for b in bounds)):
        rng = dict(zip(modes, (b[i] for b, i in zip(bounds, index))))
        for win in op.windows:  # the window of the output block, not the whole input
            rng[win.mode] = win.read(rng[win.out], op.size[win.mode])
        ranges = tuple(rng[m] for m in modes)
        slice_id = 0
        for i, p in zip(index[n_out:], agg_parts):
            slice_id = slice_id * p + i
        out.append(TupleGeometry(
            index=index, ranges=ranges,
            in_regions=tuple(region(d, rng, op.size) for d in op.in_dims),
            out_region=region(op.out_dims, rng, op.size),
            out_block=index[:n_out], agg_slice=slice_id))
    return tuple(out)


def n_partials(op: Op, dec: Decomposition) -> int:
    """How many partial results each output block has (product of parts of aggregated modes)."""
    part = dec.part
    return math.prod(part.get(m, 1) for m in op.agg_modes)


def output_blocks(op: Op, dec: Decomposition) -> tuple[Region, ...]:
    """The distinct output blocks, in canonical order."""
    seen: dict[tuple[int, ...], Region] = {}
    for t in tuples(op, dec):
        seen.setdefault(t.out_block, t.out_region)
    return tuple(seen.values())


