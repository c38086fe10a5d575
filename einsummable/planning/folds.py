"""Partial sums folded where they are read: the *Partial* step of `exchange.py`'s synthesis.

For every output block and every distinct needed box X of it with k readers, X is cut into k
chunks (reduce-scatter; `_scatter`) and chunk i is folded at reader i from one holder per
slice: level by level of the topology, slow to fast (`_fold_tree`, `_gather`), or, where the
synthesis asks for trees, up packed trees (`trees.tree_fold`), or, where it asks to pipeline,
in parts folded one after another (`_pipelined`). The naive mode folds every
need at its reader from the owners directly (`_fold_direct`); the optimized mode builds that
program too, from the nearest holders (`_Synthesis.direct_folds`): one round where the
reduce-scatter and the copies after it take two, which is what counts where a message's
latency outweighs its bytes (2 gloo ranks: each sends its partial and both fold). The folded chunks are the full
sources the copy step then delivers. The synthesis object `b` is `exchange._Synthesis`.
"""
from __future__ import annotations

from typing import Sequence

from ..core.geometry import Region, cut_along, intersect, volume
from ..errors import PlanError
from .placement import Piece
from .routes import RANK_REFERENCE_BYTES
from .rings import FOLD_LAG, ring_fold
from .trees import chunks, tree_fold

# A fold's chunk is cut into up to this many parts (`_Synthesis.pipeline`), each sent and
# folded on its own, so that the reducer folds one part while the next arrives (a reduce of
# the whole chunk waits for all of it): the pipelining NCCL's ring gets from its chunked
# steps. Each part costs a reduce launch and a stitch, so synthesis keeps the faster. Part j
# starts in round j and each value is folded `rings.FOLD_LAG` rounds after it arrives, so a
# device's program (round order, sends before folds) sends one part on while it folds the
# one before (a100x8 all-reduce of 256 MiB: 1.611 -> 1.574 ms, NCCL's ring modelled 1.608).
FOLD_PARTS = 8


def reduce_partials(b, produced: Sequence[Piece], needs: Sequence[tuple[Region, int]],
                    n_slices: int) -> list[tuple[Region, int, int]]:
    """Fold the partial slices of every needed part of every block; returns the full sources."""
    blocks: dict[Region, dict[int, list[int]]] = {}  # block -> slice -> holders
    for p in produced:
        blocks.setdefault(p.region, {}).setdefault(p.slice, []).append(p.device)
    full: list[tuple[Region, int, int]] = []
    jobs: list[tuple[Region, int, dict[int, list[int]], Region]] = []  # b.rings: folded below
    for block, holders in blocks.items():
        if len(holders) != n_slices:
            raise PlanError(f"tensor {b.info.name!r}: block {block} has {len(holders)} of "
                            f"{n_slices} partial results", fix="every slice needs a holder")
        readers: dict[Region, list[int]] = {}
        for q, d in needs:
            x = intersect(q, block)
            if x is not None:
                readers.setdefault(x, [])
                if d not in readers[x]:
                    readers[x].append(d)
        for x, devs in readers.items():
            if b.naive or b.direct_folds:
                for d in devs:
                    full.append((x, d, _fold_direct(b, x, d, holders, block)))
                continue
            for chunk, r in _scatter(x, devs, holders, b.elem, b.flat):
                if b.rings and len(holders) > 2:
                    jobs.append((chunk, r, holders, block))
                elif b.trees and len(holders) > 2:
                    full.extend((part, r, rnd)
                                for part, rnd in tree_fold(b, chunk, r, holders, block))
                else:
                    parts = _pipelined(chunk, b.elem) if b.pipeline else [chunk]
                    full.extend((part, r, _fold_tree(b, part, r, holders, block,
                                                     j if b.pipeline else 0))
                                for j, part in enumerate(parts))
    for chunk, r, holders, block in jobs:
        folded = ring_fold(b, chunk, r, holders, block, len(jobs))
        if folded is None:  # its holders form no mesh: folded level by level
            folded = [(chunk, _fold_tree(b, chunk, r, holders, block))]
        full.extend((part, r, rnd) for part, rnd in folded)
    return full


def _pipelined(x: Region, itemsize: int) -> list[Region]:
    """x cut into row-major parts folded one after another (`FOLD_PARTS`)."""
    k = max(1, min(FOLD_PARTS, int(volume(x) * itemsize // RANK_REFERENCE_BYTES)))
    return chunks(x, k)


def _scatter(x: Region, readers: list[int], holders: dict[int, list[int]],
             itemsize: int, flat: bool = False) -> list[tuple[Region, int]]:
    """Reduce-scatter: with k readers of x, cut x into k chunks and fold chunk i at reader i,
    so the fold's inbound bytes and the later multicast spread over k devices' ports instead
    of one (the all-reduce pattern then costs what a ring costs). Chunks stay at least
    RANK_REFERENCE_BYTES, below which latency, not bandwidth, dominates, except in a `flat`
    program, whose chunks all travel in the same batches, so more of them cost no launch: there
    x is cut among all its readers. The chunks are
    row-major ranges of x where its extents allow (`_row_major_cuts`): each is then sent
    without a pack and lands in place at its readers, where a cut along the longest dim
    would be strided at both ends; else x is cut along its longest dim."""
    by_slices = sorted(readers, key=lambda d: (-sum(d in h for h in holders.values()), d))
    worth = len(by_slices) if flat else int(volume(x) * itemsize // RANK_REFERENCE_BYTES)
    k = min(len(by_slices), max(worth, 1))
    chunks = _row_major_cuts(x, k) if k > 1 else None
    if chunks is None:
        if not x:  # a 0-d tensor (a loss): one element, folded at one reader
            return [(x, by_slices[0])]
        dim = max(range(len(x)), key=lambda i: (x[i][1] - x[i][0], -i))
        lo, hi = x[dim]
        k = min(k, hi - lo)
        if k <= 1:
            return [(x, by_slices[0])]
        chunks = cut_along(x, dim, k)
    return list(zip(chunks, sorted(by_slices[:len(chunks)])))


def _row_major_cuts(x: Region, k: int) -> list[Region] | None:
    """x cut into k near-equal parts, each a range of x's elements in row-major order: the
    outer dims split into single indices (their extents' product p dividing k), the next
    dim into k / p ranges; None where no such split exists."""
    outer = 1
    for dim, (lo, hi) in enumerate(x):
        n = hi - lo
        if n == 1:
            continue
        need = k // outer
        if n >= need:
            parts = [x]
            for d in range(dim):
                parts = [c for p in parts for c in cut_along(p, d, p[d][1] - p[d][0])]
            return [c for p in parts for c in cut_along(p, dim, need)]
        if need % n:
            return None
        outer *= n
    return None


def _fold_direct(b, x: Region, d: int, holders: dict[int, list[int]],
                 block: Region) -> int:
    inputs = []
    for s in sorted(holders):
        h = d if d in holders[s] else holders[s][0] if b.naive else \
            min(holders[s], key=lambda dev: (b.dist(dev, d), dev))
        inputs.append(((s,), -1 if h == d else b.send(h, d, x, -1, (s,), within=block)))
    return b.reduce(d, x, inputs, ())


def _fold_tree(b, x: Region, r: int, holders: dict[int, list[int]],
               block: Region, start: int = 0) -> int:
    """Fold chunk x of `block`'s partial slices at r (module docstring, *Partial*). `start`:
    the round its first sends may go in (a pipelined chunk's part j starts in round j)."""
    chosen: dict[int, list[int]] = {}
    for s in sorted(holders):
        h = min(holders[s], key=lambda dev: (b.dist(dev, r), dev))
        chosen.setdefault(h, []).append(s)
    # A device with several slices folds them locally first.
    items: list[tuple[int, tuple[int, ...], int]] = []
    for dev, ss in chosen.items():
        ready = -1
        if len(ss) > 1 and dev != r:
            ready = b.reduce(dev, x, [((s,), start - 1) for s in ss], tuple(ss))
            items.append((dev, tuple(ss), ready))
        else:
            items.extend((dev, (s,), -1) for s in ss)
    inputs = _gather(b, x, r, items, 0, block, start)
    return b.reduce(r, x, inputs, ())


def _gather(b, x: Region, target: int, items: list[tuple[int, tuple[int, ...], int]],
            level: int, block: Region, start: int = 0) -> list[tuple[tuple[int, ...], int]]:
    """Values (slices, ready round) that arrive at `target`, folding inside groups of
    topology level `level` (and finer) before crossing it. A value not yet folded (ready
    round -1) is still the holder's partial of `block`, which x may cut strided."""
    lag = FOLD_LAG if b.pipeline else 0  # a part folds a round after it arrives
    levels = b.topo.levels
    if level >= len(levels) or len(items) <= 1 and (not items or items[0][0] == target):
        out = []
        for dev, ss, ready in items:
            out.append((ss, ready if dev == target else b.send(
                dev, target, x, max(ready, start - 1), ss, within=block if ready < 0 else None)
                + lag))
        return out
    groups: dict[int, list] = {}
    for it in items:
        groups.setdefault(b.topo.group_of(level, it[0]), []).append(it)
    mine = b.topo.group_of(level, target)
    out = _gather(b, x, target, groups.pop(mine, []), level + 1, block, start)
    for g in sorted(groups):
        members = groups[g]
        # the member nearest the target; among equals, the one at the target's place in its
        # own group (its rail: each GPU's NIC reaches its peer's), so chunks for different
        # targets cross at different members, not all at the group's first
        leader = min((it[0] for it in members),
                     key=lambda dev: (b.dist(dev, target), not _aligned(b.topo, level, dev, target),
                                      dev))
        vals = _gather(b, x, leader, members, level + 1, block, start)
        ss = tuple(sorted(s for v, _ in vals for s in v))
        ready = vals[0][1] if len(vals) == 1 else b.reduce(leader, x, vals, ss)
        out.append((ss, b.send(leader, target, x, max(ready, start - 1), ss,
                               within=block if ready < 0 else None) + lag))
    return out


def _aligned(topo, level: int, a: int, b: int) -> bool:
    """Whether a and b sit at the same place in their groups of topology level `level`."""
    groups = topo.levels[level].groups
    ga, gb = groups[topo.group_of(level, a)], groups[topo.group_of(level, b)]
    return len(ga) == len(gb) and ga.index(a) == gb.index(b)
