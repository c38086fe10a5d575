r"""Broadcasts across nodes: scattered inside the holder's node, across once per rail,
gathered inside every node.

Why. A block one device holds and devices of several nodes read is, down packed trees or the
one-node scatter (`trees.scatter_copy`), sent across nodes by whichever readers relay it,
each over its own NIC, so a few NICs carry most of it (h100x8x2, 256 MiB from GPU 0 to the 15
others: 1.65 ms, the bound 0.67). NCCL's hierarchical algorithms cross once per rail.

Math. Let the top level (nodes) have M groups of L devices each, the block X of B bytes held
on h in node N_h = (g_0 .. g_{L-1}), readers in several nodes. X is cut row-major into L m
chunks; chunk i crosses on rail r = g_{i mod L} and is spread inside N_h by the local head
l, the (i mod (L-1))-th of N_h's devices other than h:

    h -> l                                    (the scatter: h's port carries B once)
    l -> every other reader in N_h, and r     (the gather inside N_h)
    r -> p_G  for every other node G          (across: p_G the device at r's place in G, its
                                               rail peer, so every NIC carries B / L)
    p_G -> every other reader in G            (the gather inside G)

Every reader thus receives every chunk once, and each node's NICs carry B / L apiece, the
bound where the NICs are the slowest links (B / L over one NIC, against B / (L n) for the
node's L NICs together), and no device's port inside a node carries more than B. The m
chunks per rail pipeline the four steps: a rail forwards chunk i while chunk i + L arrives.
Where there are as many such blocks as rails (a gather: every device holds one), each
block crosses on its holder's own rail instead, unscattered (l = r = h): the NICs are
shared out by the blocks themselves, and the scatter would only add bytes inside the node. `exchange.synthesize` builds it beside the other programs
where it applies and keeps the fastest under the replay.
"""
from __future__ import annotations

from typing import Sequence

from ..core.geometry import Region, volume
from .trees import CHUNK_BYTES, _groups, _stitch_all, chunks

# Chunks per rail, at most (each CHUNK_BYTES or more): the first chunk crosses only after the
# scatter has reached its rail and the last is gathered after it crossed, so the fill is two
# chunk-times of a port; more chunks shorten it and cost a launch per forward each.
RAIL_CHUNKS = 32
# Transfers per program, at most: a single-holder block read across nodes is rare in a
# plan (a broadcast), so it may take more than a packed tree's `trees.TRANSFER_BUDGET`.
RAIL_TRANSFER_BUDGET = 4096


def rail_scatter_copy(b, sources: Sequence[tuple[Region, int, int]],
                      needs: Sequence[tuple[Region, int]]) -> bool:
    """Deliver every need by the rail broadcast of the module docstring, emitting transfers
    and stitches on the synthesis `b` (`exchange._Synthesis`). Returns False, emitting
    nothing, unless the topology's top level has several groups of one size, every block
    the readers lack has one holder, the readers of some block span several nodes (a block
    read inside one node is sent straight), and two chunks per rail (one per block of a
    gather) fit the transfer budget."""
    topo = b.topo
    if not topo.levels or len(topo.levels[0].groups) < 2:
        return False
    nodes = topo.levels[0].groups
    if len({len(g) for g in nodes}) != 1:
        return False
    holders, groups, parts = _groups(sources, needs)
    plans, direct = [], []
    for cut, (reg, readers) in groups.items():
        devs = list(dict.fromkeys(d for _, d in readers))
        if len(holders[reg]) != 1:
            return False
        spans = len({topo.group_of(0, d) for d in devs}) > 1
        (plans if spans else direct).append((cut, reg, readers, devs))
    fan = sum(len(devs) + len(nodes) for *_, devs in plans)
    # as many blocks as rails (a gather): each crosses on its holder's own rail, unscattered
    own = len(plans) >= len(nodes[0])
    width = 1 if own else len(nodes[0])
    # two chunks per rail at least to pipeline; a gather's blocks pipeline among themselves
    if not plans or (1 if own else 2) * width * fan > RAIL_TRANSFER_BUDGET:
        return False
    for cut, reg, readers, devs in direct:  # read inside one node: sent straight
        holder, ready = holders[reg][0]
        for q, d in readers:
            b.send(holder, d, cut, ready, within=reg)
            parts[(q, d)].append((cut, True))
    for cut, reg, readers, devs in plans:
        holder, ready = holders[reg][0]
        mine = topo.group_of(0, holder)
        heads = (holder,) if own else nodes[mine]
        m = max(1, min(RAIL_CHUNKS, RAIL_TRANSFER_BUDGET // (width * fan),
                       int(volume(cut) * b.elem // (width * CHUNK_BYTES))))
        by_node: dict[int, list[int]] = {}
        for d in devs:
            by_node.setdefault(topo.group_of(0, d), []).append(d)
        others = [g for g in heads if g != holder] or [holder]
        for i, piece in enumerate(chunks(cut, width * m)):
            rail, local = heads[i % width], others[i % len(others)]
            at = {holder: max(ready, i // width - 1)}  # wave w of chunks starts in round w
            at[local] = at[holder] if local == holder else b.send(holder, local, piece,
                                                                  at[holder], within=reg)
            for d in [rail] + by_node.get(mine, []):  # the rail first: it crosses on
                if d not in at:
                    at[d] = b.send(local, d, piece, at[local],
                                   within=reg if local == holder else None)
            place = nodes[mine].index(rail)
            for g, members in sorted(by_node.items()):
                if g == mine:
                    continue
                peer = nodes[g][place]
                got = b.send(rail, peer, piece, at[rail],
                             within=reg if rail == holder else None)
                for d in members:
                    if d != peer:
                        b.send(peer, d, piece, got)
            for q, d in readers:
                parts[(q, d)].append((piece, True))
    _stitch_all(b, parts)
    return True
