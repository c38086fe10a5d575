r"""A cheap lower bound on an edge's exchange seconds, so the optimizer prices lazily.

Synthesising an exchange (`exchange.synthesize` + `exchange_time`) costs milliseconds; a model
on a two-node machine has tens of thousands of (layout, needs) pairs, almost none of which an
optimal plan uses. The optimizer therefore solves with this bound in place of every pair it has
not priced, prices the pairs the solution uses, and re-solves until the solution uses only
priced pairs; then it is optimal for the exact prices too (every other choice costs at least
its bound). See `optimizer.search.solve_lazily`.

The bound is a cut argument on the round model of `timing.exchange_time`. For a device set X
(every group of every topology level, singletons included), let B(X) be the bytes X needs that
X does not hold: the volume of the union of X's needed boxes outside the boxes X holds in full
(for partial results: the blocks of which X holds every slice; any other needed point must
receive a value of its size from outside). Every such byte crosses into X at least once, over
a route with a hop from outside X into X. Take a cover K of those hops' resources (their link
media; or the ingress ports of X's devices; or the egress ports of the senders), each resource
k of bandwidth b_k. In each round the transfers load the resources of K with at least the bytes
crossing in that round, and the round lasts at least latency + load_k / b_k for every k, hence
at least latency + (crossing bytes) / sum_K b_k. Summed over rounds:

    exchange_seconds  >=  min latency  +  B(X) / min_K sum_{k in K} b_k      (when B(X) > 0)

Folds, stitching copies and extra rounds only add to it. The bound is the largest over X.

Where exchanges are timed by replaying their programs (`timing.replays`: GPU fabrics), a
reader's copies of its own parts run while the transfers are in flight, so they need not
add to the wire time: there the bound is the wire bound alone and its local part 0 (the
exact local part, what the copies add to the end, may be 0 too). Elsewhere the copies come
after the last round and the bound adds the stitching bound. Either way the copies are
device work on the reader's stream: the stitching bound is also returned alone as a bound on
that work (`EdgeCost.copy_s`), which a weight stream streamed behind compute adds to it.

`exchange_lower_bound` states it for one cell; `matrix_bounds` gives the same floats for a
whole edge matrix at once, as sums of matrix products over numbered boxes (a two-node model
has tens of thousands of cells: 0.7 s in one process where cell by cell took 9 s).
"""
from __future__ import annotations

import functools
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..core.geometry import Region, intersect, subtract, volume
from ..frontend.ir import DTYPE_BYTES
from .placement import Piece
from .timing import replays

Needs = Sequence[tuple[Region, int]]


@lru_cache(maxsize=1 << 16)
def _disjoint(regions: tuple[Region, ...]) -> bool:
    """No two of the boxes meet (the blocks of one layout, as a rule)."""
    return all(intersect(a, b) is None
               for i, a in enumerate(regions) for b in regions[i + 1:])


@lru_cache(maxsize=1 << 18)
def _outside(q: Region, held: tuple[Region, ...]) -> int:
    """Volume of box q outside disjoint boxes `held` (one box recurs in many needs)."""
    return volume(q) - sum(volume(cut) for h in held if (cut := intersect(q, h)) is not None)


@lru_cache(maxsize=1 << 16)
def uncovered_volume(needed: tuple[Region, ...], held: tuple[Region, ...]) -> int:
    """Volume of the union of `needed` outside the union of `held`. Memoised: the same
    per-device blocks recur across the many layouts of one model. When the needed boxes are
    disjoint and so are the held ones (blocks of layouts), it is the needed volume less every
    pairwise overlap; else the needed boxes are cut into pieces outside the held ones."""
    needed = tuple(dict.fromkeys(needed))
    if _disjoint(needed) and _disjoint(held):
        return sum(_outside(q, held) for q in needed)
    return _cut_away(needed, held)


def _cut_away(needed: tuple[Region, ...], held: tuple[Region, ...]) -> int:
    """`uncovered_volume` for any boxes: each needed box cut into pieces outside the held
    boxes and the pieces kept so far."""
    parts: list[Region] = []
    for q in dict.fromkeys(needed):
        todo = [q]
        for h in list(held) + parts:
            nxt = []
            for u in todo:
                nxt.extend(subtract(u, h))
            todo = nxt
            if not todo:
                break
        parts.extend(todo)
    return sum(volume(p) for p in parts)


def _cut_sets(topology) -> tuple[tuple[frozenset[int], float], ...]:
    """(X, capacity into X in B/s) for every level group and singleton; memoised per topology."""
    cache = getattr(topology, "_cache", None)
    key = "exchange-bound-cuts"
    if isinstance(cache, dict) and key in cache:
        return cache[key]
    n = topology.world_size
    sets = {frozenset([d]) for d in range(n)}
    for lv in topology.levels:
        for g in lv.groups:
            if 0 < len(g) < n:
                sets.add(frozenset(g))
    res = tuple((x, capacity_into(topology, x))
                for x in sorted(sets, key=lambda s: (len(s), sorted(s))))
    if isinstance(cache, dict):
        cache[key] = res
    return res


def capacity_into(topology, x: frozenset[int]) -> float:
    """The smallest total bandwidth of a cover of the links entering x: their media, the
    ingress ports of x's devices, or the egress ports of their senders (links without a port
    count with their medium in the port covers)."""
    crossing = [l for l in topology.links if l.src not in x and l.dst in x]
    if not crossing:
        return 0.0
    media: dict[str, float] = {}
    ingress: dict[str, float] = {}
    egress: dict[str, float] = {}
    for l in crossing:
        media[l.resource] = max(media.get(l.resource, 0.0), l.bw)
        has_port = l.port is not None and l.port_bw is not None
        for ports, name in ((ingress, l.ingress), (egress, l.egress)):
            if not has_port:  # no port to cover this link: its medium stands in
                name, bw = "medium:" + l.resource, l.bw
            else:
                bw = l.port_bw
            ports[name] = max(ports.get(name, 0.0), bw)
    return min(sum(media.values()), sum(ingress.values()), sum(egress.values()))


def _memo(topology, key: str, make):
    """A pure function of the topology, kept in its memo."""
    cache = getattr(topology, "_cache", None)
    if not isinstance(cache, dict):
        return make()
    if key not in cache:
        cache[key] = make()
    return cache[key]


def min_latency(topology) -> float:
    """The least latency of any link."""
    return _memo(topology, "exchange-bound-latency",
                 lambda: min((l.latency_s for l in topology.links), default=0.0))


def min_start(topology) -> float:
    """What `wire_bound` adds to a positive bound: the least link latency (the last byte still
    has to arrive) and, where exchanges are replayed as programs, the least kernel launch (no
    byte leaves before its sender's p2p batch is launched)."""
    launch = min((d.launch_s for d in topology.devices), default=0.0) if replays(topology) \
        else 0.0
    return min_latency(topology) + launch


def held_per_cut(produced: Sequence[Piece], topology) -> tuple[tuple[Region, ...], ...]:
    """Per cut set (order of `_cut_sets`): the boxes the set holds in full (for partial
    results, the blocks of which it holds every slice)."""
    n_slices = produced[0].n_slices if produced else 1
    held_by: dict[int, list[Piece]] = {}
    for p in produced:
        held_by.setdefault(p.device, []).append(p)
    out = []
    for x, _ in _cut_sets(topology):
        pieces = [p for d in sorted(x) for p in held_by.get(d, ())]
        if n_slices == 1:
            out.append(tuple(dict.fromkeys(p.region for p in pieces)))
            continue
        slices: dict[Region, set[int]] = {}
        for p in pieces:
            slices.setdefault(p.region, set()).add(p.slice)
        out.append(tuple(r for r, s in slices.items() if len(s) == n_slices))
    return tuple(out)


def needed_per_cut(needs: Needs, topology) -> tuple[tuple[Region, ...], ...]:
    """Per cut set: the boxes its devices need."""
    need_by: dict[int, list[Region]] = {}
    for q, d in needs:
        need_by.setdefault(d, []).append(q)
    return tuple(tuple(dict.fromkeys(q for d in sorted(x) for q in need_by.get(d, ())))
                 for x, _ in _cut_sets(topology))


def wire_bound(held: Sequence[tuple[Region, ...]], needed: Sequence[tuple[Region, ...]],
               elem_bytes: int, topology) -> float:
    """The rounds' bound from per-cut held and needed boxes (`held_per_cut`,
    `needed_per_cut`)."""
    best = 0.0
    for (_, cap), h, q in zip(_cut_sets(topology), held, needed):
        if q and cap > 0:  # no link into the set: nothing can be sent (synthesis says so)
            missing = uncovered_volume(q, h)
            if missing:
                best = max(best, missing * elem_bytes / cap)
    return best + min_start(topology) if best else 0.0


@lru_cache(maxsize=1 << 16)
def _own_copy_volume(needed: tuple[Region, ...], held: tuple[Region, ...]) -> tuple[int, int]:
    """(volume, needs) of a reader's own parts it must copy when stitching: every need not
    inside one held box but meeting the held ones (the synthesis takes a reader's own blocks
    first, and copies own parts of a need made of several parts)."""
    vol = count = 0
    for q in needed:
        if any(all(a <= c and d <= b for (a, b), (c, d) in zip(h, q)) for h in held):
            continue
        own = volume(q) - uncovered_volume((q,), held)
        if own:
            vol += own
            count += 1
    return vol, count


def stitch_bound(held: Sequence[tuple[Region, ...]], needed: Sequence[tuple[Region, ...]],
                 elem_bytes: int, n_slices: int, topology) -> float:
    """A bound on `timing.stitch_time`: the busiest reader's copies of its own parts (one
    kernel per need, each byte read and written). Full values only (partial results are
    stitched from folded chunks, which this does not follow: 0 there)."""
    if n_slices > 1:
        return 0.0
    best = 0.0
    for d, i in enumerate(_singletons(topology)):
        vol, count = _own_copy_volume(needed[i], held[i])
        if count:
            dev = topology.devices[d]
            best = max(best, count * dev.launch_s + 2 * vol * elem_bytes / dev.mem_bw)
    return best


def _singletons(topology) -> tuple[int, ...]:
    """Index in `_cut_sets` of each device's singleton set."""
    def make():
        index = {next(iter(x)): i for i, (x, _) in enumerate(_cut_sets(topology))
                 if len(x) == 1}
        return tuple(index[d] for d in range(topology.world_size))
    return _memo(topology, "exchange-bound-singletons", make)


def exchange_lower_bound(dtype: str, produced: Sequence[Piece], needs: Needs,
                         topology) -> tuple[float, float, float]:
    """(seconds, local seconds, copy seconds) no exchange from `produced` to `needs` can beat:
    the rounds' bound plus the stitching bound where the copies follow the last round, that
    share of it, and the stitching bound (the copies' device work, overlapped or not)."""
    held, needed = held_per_cut(produced, topology), needed_per_cut(needs, topology)
    elem = DTYPE_BYTES[dtype]
    n_slices = produced[0].n_slices if produced else 1
    copy = stitch_bound(held, needed, elem, n_slices, topology)
    if replays(topology):  # the copies may overlap the transfers (module docstring)
        return wire_bound(held, needed, elem, topology), 0.0, copy
    return wire_bound(held, needed, elem, topology) + copy, copy, copy


# --------------------------------------------------------------------------- one matrix at once

def matrix_bounds(layouts: Sequence[Sequence[Piece]], needs: Sequence[Needs], elem_bytes: int,
                  topology) -> tuple[tuple[tuple[float, float, float], ...], ...]:
    """`exchange_lower_bound` of every (layout, needs) cell, row by row, to the same floats,
    for a whole edge matrix at once (the optimizer bounds tens of thousands of cells before
    its first solve). Per cut set the held and needed boxes are numbered once (`_CutBoxes`);
    with H (rows x held boxes) and Q (needs x needed boxes) their 0/1 incidences and V the
    volumes of the boxes' pairwise intersections, a cell's overlap is (H V Qᵀ)[r, s], so the
    volume it lacks is its needed volume less that where both sides are disjoint boxes (as
    layouts give); other cells take `uncovered_volume` one by one. A device's own copies
    (the stitching bound) read the same numbering of its singleton set."""
    held = [held_per_cut(l, topology) for l in layouts]
    needed = [needed_per_cut(n, topology) for n in needs]
    R, S = len(held), len(needed)
    if not R or not S:
        return tuple(() for _ in range(R))
    device_of = {i: d for d, i in enumerate(_singletons(topology))}
    full = np.array([not l or l[0].n_slices == 1 for l in layouts])
    wire, local = np.zeros((R, S)), np.zeros((R, S))
    for i, (_, cap) in enumerate(_cut_sets(topology)):
        boxes = _CutBoxes(tuple(h[i] for h in held), tuple(q[i] for q in needed))
        if not any(boxes.needed):
            continue
        if cap > 0:
            wire = np.maximum(wire, boxes.missing() * elem_bytes / cap)
        if i in device_of and full.any() and any(boxes.held):
            dev = topology.devices[device_of[i]]
            vol, count = boxes.own_copies()
            cost = np.where(count > 0, count * dev.launch_s + 2 * vol * elem_bytes / dev.mem_bw,
                            0.0)
            local = np.maximum(local, np.where(full[:, None], cost, 0.0))
    wire = np.where(wire > 0, wire + min_start(topology), 0.0)
    copy = local
    if replays(topology):  # the copies may overlap the transfers (module docstring)
        local = np.zeros((R, S))
    total = wire + local
    return tuple(tuple(zip(map(float, t), map(float, l), map(float, c)))
                 for t, l, c in zip(total, local, copy))


def _numbered(groups: Sequence[tuple[Region, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(boxes as an n x rank x 2 array, the groups x n 0/1 incidence) of distinct boxes."""
    index: dict[Region, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    for g, boxes in enumerate(groups):
        for b in boxes:
            rows.append(g)
            cols.append(index.setdefault(b, len(index)))
    inc = np.zeros((len(groups), len(index)))
    inc[rows, cols] = 1.0
    if not index:
        return np.zeros((0, 0, 2), dtype=np.int64), inc
    rank = len(next(iter(index)))  # 0 for a 0-d tensor (a loss): one element, boxes ()
    return np.array(list(index), dtype=np.int64).reshape(len(index), rank, 2), inc


class _CutBoxes:
    """The boxes one cut set holds per layout (`held`, rows) and needs per needs (`needed`,
    columns), numbered once for the two bounds that read them."""

    def __init__(self, held: tuple[tuple[Region, ...], ...],
                 needed: tuple[tuple[Region, ...], ...]) -> None:
        self.held, self.needed = held, needed
        self.hb, self.hi = _numbered(held)
        self.qb, self.qi = _numbered(needed)

    @functools.cached_property
    def meet(self) -> np.ndarray:
        """Volume of each held box ∩ each needed box (as floats: exact below 2**53)."""
        a, b = self.hb, self.qb
        lo = np.maximum(a[:, None, :, 0], b[None, :, :, 0])
        hi = np.minimum(a[:, None, :, 1], b[None, :, :, 1])
        return np.prod(np.clip(hi - lo, 0, None), axis=2).astype(float)

    def missing(self) -> np.ndarray:
        """`uncovered_volume` per (row, column)."""
        qb = self.qb
        out = np.repeat((self.qi @ np.prod(qb[:, :, 1] - qb[:, :, 0], axis=1).astype(float))
                        [None, :], len(self.held), axis=0)
        if len(self.hb):
            out = np.rint(out - self.hi @ self.meet @ self.qi.T)
        odd_h = [r for r, h in enumerate(self.held) if not _disjoint(h)]
        odd_q = [s for s, q in enumerate(self.needed) if not _disjoint(q)]
        for r, s in {(r, s) for r in odd_h for s in range(len(self.needed))} | \
                {(r, s) for s in odd_q for r in range(len(self.held))}:
            out[r, s] = uncovered_volume(self.needed[s], self.held[r]) if self.needed[s] else 0
        return out

    def own_copies(self) -> tuple[np.ndarray, np.ndarray]:
        """`_own_copy_volume` per (row, column) of a singleton set: (volume, needs)."""
        hb, qb = self.hb, self.qb
        inside = np.all((hb[:, None, :, 0] <= qb[None, :, :, 0])
                        & (qb[None, :, :, 1] <= hb[:, None, :, 1]), axis=2).astype(float)
        own = self.hi @ self.meet  # rows x needed boxes: the volume of each the row holds
        own = np.where(self.hi @ inside > 0, 0.0, own)  # a box inside one held box: no copy
        vol, count = np.rint(own @ self.qi.T), (own > 0).astype(float) @ self.qi.T
        for r in (r for r, h in enumerate(self.held) if not _disjoint(h)):
            for s in range(len(self.needed)):
                vol[r, s], count[r, s] = _own_copy_volume(self.needed[s], self.held[r])
        return vol, count
