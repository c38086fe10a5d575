"""An exchange that is one node's exchange on every node: synthesised and timed once.

In a node-parallel plan (`node_parallel.py`) node k holds batch blocks [k B/M, (k+1) B/M) of
every activation and reads only those, so an activation's exchange splits into M exchanges,
one inside each node, that are translations of each other: node k's pieces and needs are
node 0's with every device d moved to the device at d's place in node k and every region
shifted by node k's offset. They share no device and no link (a transfer inside a node uses
that node's links and ports only), so the whole runs in the time of one:

    T(exchange) = T(node 0's exchange),   bytes(exchange) = M bytes(node 0's exchange).

`split_by_node` recognises the case, exactly: for every node, the pieces on its devices
cover every region its devices need (each partial slice of it, where the tensor arrives as
partial sums), and every node's pieces and needs are node 0's translated. `replicate` builds
the whole exchange from node 0's program by translation; it keeps node 0's exchange as
`Exchange.one_copy`, which the timing functions time instead (`timing.exchange_parts`).
Synthesising and replaying one node instead of M is what keeps pricing a node-parallel plan
on 64 or 256 GPUs near the cost of one node's.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..core.geometry import Region
from .placement import Piece
from .transfers import Exchange, Reduce, Transfer

Need = tuple[Region, int]


@dataclass(frozen=True)
class NodeSplit:
    """Node 0's pieces and needs, and per node its device map from node 0 and its shift."""
    produced: tuple[Piece, ...]
    needs: tuple[Need, ...]
    moves: tuple[tuple[dict[int, int], tuple[int, ...]], ...]  # per node k >= 1


def _vol(r: Region) -> int:
    return math.prod(max(0, b - a) for a, b in r)


def _meet(r: Region, q: Region) -> Region:
    return tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(r, q))


def _covered(pieces: Sequence[Piece], needs: Sequence[Need], n_slices: int) -> bool:
    """Every need inside the union of the pieces of each slice (blocks of one layout are
    equal or disjoint, so distinct regions' overlaps add up)."""
    by_slice: dict[int, set[Region]] = {}
    for p in pieces:
        by_slice.setdefault(p.slice, set()).add(p.region)
    for q, _ in needs:
        for s in range(n_slices):
            if sum(_vol(_meet(r, q)) for r in by_slice.get(s, ())) != _vol(q):
                return False
    return True


def _shift(r: Region, by: Sequence[int]) -> Region:
    return tuple((a + s, b + s) for (a, b), s in zip(r, by))


def split_by_node(produced: Sequence[Piece], needs: Sequence[Need], n_slices: int,
                  topology) -> NodeSplit | None:
    """The split of the module docstring, or None where the exchange is not one node's
    repeated (one level, a node needing nothing, a need served from another node, an
    asymmetric layout)."""
    if len(topology.levels) < 2 or not needs:
        return None
    groups = topology.levels[0].groups
    if len(groups) < 2 or len({len(g) for g in groups}) != 1:
        return None
    node_of = {d: k for k, g in enumerate(groups) for d in g}
    pieces: list[list[Piece]] = [[] for _ in groups]
    wants: list[list[Need]] = [[] for _ in groups]
    for p in produced:
        pieces[node_of[p.device]].append(p)
    for q, d in needs:
        wants[node_of[d]].append((q, d))
    if not wants[0] or not _covered(pieces[0], wants[0], n_slices):
        return None
    base_lo = [min(q[i][0] for q, _ in wants[0]) for i in range(len(wants[0][0][0]))]
    home = sorted((p.region, groups[0].index(p.device), p.slice) for p in pieces[0])
    home_needs = sorted((q, groups[0].index(d)) for q, d in wants[0])
    moves = []
    for k in range(1, len(groups)):
        if not wants[k]:
            return None
        by = tuple(min(q[i][0] for q, _ in wants[k]) - base_lo[i] for i in range(len(base_lo)))
        back = tuple(-s for s in by)
        mine = sorted((_shift(p.region, back), groups[k].index(p.device), p.slice)
                      for p in pieces[k])
        mine_needs = sorted((_shift(q, back), groups[k].index(d)) for q, d in wants[k])
        if mine != home or mine_needs != home_needs:
            return None
        moves.append(({d: e for d, e in zip(groups[0], groups[k])}, by))
    return NodeSplit(tuple(pieces[0]), tuple(wants[0]), tuple(moves))


def _move(ex: Exchange, dev: dict[int, int], by: Sequence[int]) -> Exchange:
    """Node 0's exchange carried to another node: devices mapped, regions shifted."""
    return Exchange(
        tuple(replace(t, src=dev[t.src], dst=dev[t.dst], region=_shift(t.region, by),
                      hops=tuple(dev[h] for h in t.hops)) for t in ex.transfers),
        tuple(replace(r, device=dev[r.device], region=_shift(r.region, by))
              for r in ex.reduces),
        tuple((dev[d], b, k) for d, b, k in ex.copies),
        tuple((rd, dev[d], b, k) for rd, d, b, k in ex.packs),
        tuple((_shift(reg, by), dev[d], s) for reg, d, s in ex.sources),
        tuple((dev[d], b, k) for d, b, k in ex.early),
        tuple((dev[d], _shift(reg, by)) for d, reg in ex.copied),
        ex.one_pack, ex.flat)


def replicate(sub: Exchange, split: NodeSplit) -> Exchange:
    """Node 0's exchange `sub` and its translations to every other node, as one exchange
    timed as `sub` (`Exchange.one_copy`)."""
    if not sub:
        return sub
    parts = [sub] + [_move(sub, dev, by) for dev, by in split.moves]
    transfers: tuple[Transfer, ...] = tuple(t for p in parts for t in p.transfers)
    reduces: tuple[Reduce, ...] = tuple(r for p in parts for r in p.reduces)
    return Exchange(transfers, reduces,
                    tuple(c for p in parts for c in p.copies),
                    tuple(c for p in parts for c in p.packs),
                    tuple(s for p in parts for s in p.sources),
                    tuple(c for p in parts for c in p.early),
                    tuple(c for p in parts for c in p.copied),
                    sub.one_pack, sub.flat, one_copy=sub)
