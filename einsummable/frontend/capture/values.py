"""Symbolic values of the capture walk.

A captured FX node does not always become an op. Its value is one of:

- `View`: a stored graph tensor seen through reshapes, permutes, unsqueezes and expands. The
  stored tensor's dims are factored into *atoms* (sizes > 1); the logical dims group atoms too,
  and an atom absent from the stored dims is a broadcast (an expand). Views cost nothing: the op
  that consumes one reads the stored tensor with grouped modes.
- `Lazy`: an elementwise expression over leaves, not yet emitted; the consumer fuses it (into a
  map, or into a reduction's join) or materialises it once.
- `SliceVal`: a contiguous slice of a view, pending so that `cat` can see rotate-half and
  friends as one einsum with a small constant matrix.
- `Folded`: a value that depends on no graph input (masks, aranges, lifted constants), either
  computed on the CPU or kept symbolic (a fill, a causal mask) when it is too big to compute.

Atom ids are only unique within one view.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence, Union

import torch

from ..scalar import Expr

Group = tuple[int, ...]


@dataclass(frozen=True)
class View:
    base: str
    base_dims: tuple[Group, ...]
    dims: tuple[Group, ...]
    sizes: tuple[tuple[int, int], ...]
    dtype: str

    @cached_property
    def size(self) -> dict[int, int]:
        return dict(self.sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(math.prod(self.size[a] for a in g) for g in self.dims)

    @property
    def trivial(self) -> bool:
        """The logical tensor is the stored tensor."""
        return self.base_dims == self.dims

    def _next(self) -> int:
        return max((a for a, _ in self.sizes), default=-1) + 1

    def with_(self, dims: Sequence[Group], sizes: dict[int, int] | None = None,
              base_dims: Sequence[Group] | None = None, dtype: str | None = None) -> "View":
        sz = self.size if sizes is None else sizes
        return View(self.base, tuple(base_dims) if base_dims is not None else self.base_dims,
                    tuple(tuple(g) for g in dims), tuple(sorted(sz.items())), dtype or self.dtype)


def fresh_view(name: str, shape: Sequence[int], dtype: str) -> View:
    dims, sizes, nxt = [], {}, 0
    for s in shape:
        if s == 1:
            dims.append(())
        else:
            dims.append((nxt,))
            sizes[nxt] = int(s)
            nxt += 1
    return View(name, tuple(dims), tuple(dims), tuple(sorted(sizes.items())), dtype)


def permute(v: View, perm: Sequence[int]) -> View:
    n = len(v.dims)
    return v.with_([v.dims[p % n] for p in perm])


def unsqueeze(v: View, d: int) -> View:
    d = d % (len(v.dims) + 1)
    dims = list(v.dims)
    dims.insert(d, ())
    return v.with_(dims)


def squeeze(v: View, ds: Sequence[int] | None) -> View:
    n = len(v.dims)
    drop = {d % n for d in ds} if ds is not None else set(range(n))
    return v.with_([g for i, g in enumerate(v.dims) if not (i in drop and v.shape[i] == 1)])


def expand(v: View, shape: Sequence[int]) -> View:
    lead = len(shape) - len(v.dims)
    sizes = dict(v.size)
    nxt = v._next()
    dims: list[Group] = []
    old = list(v.shape)
    for i, s in enumerate(shape):
        j = i - lead
        have = old[j] if j >= 0 else 1
        if s == -1 or s == have:
            dims.append(v.dims[j] if j >= 0 else ())
        elif have == 1:
            sizes[nxt] = int(s)
            dims.append((nxt,))
            nxt += 1
        else:
            raise ValueError(f"cannot expand size {have} to {s}")
    return v.with_(dims, sizes)


def reshape(v: View, shape: Sequence[int]) -> View | None:
    """Regroup the atom sequence into `shape`, splitting atoms where a boundary falls inside
    one. None when the new dims cut across atoms in a way no split can express."""
    sizes = dict(v.size)
    nxt = v._next()
    queue = deque(a for g in v.dims for a in g)
    splits: dict[int, tuple[int, int]] = {}
    out: list[Group] = []
    for n in shape:
        group: list[int] = []
        p = 1
        while p < n:
            if not queue:
                return None
            a = queue.popleft()
            s = sizes[a]
            if p * s <= n:
                group.append(a)
                p *= s
                continue
            if n % p or s % (n // p):
                return None
            need = n // p
            outer, inner = nxt, nxt + 1
            nxt += 2
            sizes[outer], sizes[inner] = need, s // need
            del sizes[a]
            splits[a] = (outer, inner)
            group.append(outer)
            queue.appendleft(inner)
            p = n
        if p != n:
            return None
        out.append(tuple(group))
    if queue:
        return None

    def expand_atoms(g: Group) -> Group:
        res: list[int] = []
        for a in g:
            stack = [a]
            while stack:
                x = stack.pop(0)
                if x in splits:
                    stack = list(splits[x]) + stack
                else:
                    res.append(x)
        return tuple(res)

    base = tuple(expand_atoms(g) for g in v.base_dims)
    return v.with_(out, sizes, base)


def resolve_shape(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@dataclass(frozen=True)
class SliceVal:
    """src[..., start:stop, ...] along logical dim `dim`, not yet emitted."""

    src: View
    dim: int
    start: int
    stop: int
    name: str | None = field(default=None, compare=False)
    source: str | None = field(default=None, compare=False)

    @property
    def dtype(self) -> str:
        return self.src.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        s = list(self.src.shape)
        s[self.dim] = self.stop - self.start
        return tuple(s)


Leaf = Union[View, SliceVal]


@dataclass(frozen=True)
class Lazy:
    """expr(leaves...) elementwise; leaves broadcast right-aligned to `shape`."""

    expr: Expr
    leaves: tuple[Leaf, ...]
    shape: tuple[int, ...]
    dtype: str
    name: str | None = field(default=None, compare=False)
    source: str | None = field(default=None, compare=False)


@dataclass(frozen=True, eq=False)
class Folded:
    """An input-independent value. `kind`: "real" (tensor holds it), "fill" (every element is
    `fill`), "causal" (additive mask, 0 on and below the diagonal, -inf above), "keep" (bool,
    True on and below the diagonal), "drop" (bool, the negation of keep)."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    tensor: torch.Tensor | None = None
    fill: Any = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


Value = Union[View, Lazy, SliceVal, Folded]
TENSORISH = (View, Lazy, SliceVal, Folded)

