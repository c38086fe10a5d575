r"""Copies over packed trees: a block that several devices read travels in chunks, each chunk
down its own spanning tree of direct links, the trees packed against the links' loads.

Why. The plain copy (`exchange._copy`) sends each need from its nearest holder, a whole block
per transfer, so a block read by k devices leaves its holder k times (a broadcast from one
holder is bound by that holder's one port), and on a mesh without all links (the DGX-1 cube)
the relayed pairs stack onto a few lanes. Collective libraries instead run several rings or
trees at once over every link (NCCL's rings; Blink, MLSys 2020, packs spanning trees over a
DGX-1's NVLinks) and pipeline chunks through the relays.

Math. Let X be a region that readers D need and holders H hold, B its bytes, cut row-major
into C chunks of B / C bytes (C = min(B / CHUNK_BYTES, max(MAX_CHUNKS, CHUNK_BUDGET / the
number of blocks), TRANSFER_BUDGET / the edges of one chunk's trees), at least 1: a lone
block, a broadcast, is cut finer; sixteen devices gathering sixteen blocks, coarser). Every reader
must receive every chunk once, over some link into it, so the bytes into the readers are
|D| B whatever the trees; what the trees decide is how those bytes spread over the links and
ports. Each resource k (a link's medium, a device's egress or ingress port) of bandwidth b_k
carries L_k bytes; its busy time is L_k / b_k. A chunk of c bytes added over u -> v raises
every resource on that link by c / b_k; a chunk reaching depth t of its tree arrives at the
earliest t chunk-times after it left the root (each relay forwards a chunk it has whole), so
a tree edge u -> v is scored

    score(u -> v) = max_k (L_k + c) / b_k  +  depth(u) · c / b_{u,v}  +  latency(u -> v)

(the time the edge's busiest resource would be busy, plus the pipeline it adds), and each
chunk's tree is grown greedily from H (depth 0) by the lowest-scoring edge from a device in
the tree to a reader not yet in it (Prim's rule on that score), the loads updated as edges
are taken. Chunks thus go out over different first hops as the loads grow, which is the
packing; with C chunks a relay forwards chunk j while chunk j + 1 arrives, which is the
pipelining (cut-through at chunk granularity). Where no reader is one direct link from the
tree, the nearest member sends over the topology's route (relayed).

The program is a plain list of transfers, each a whole chunk over one link: lowering,
the replay and the simulator run it as any other exchange, so the time it is judged by is
that of the programs (`timing.exchange_time`). `exchange.synthesize` builds it beside the
plain program where some block has several remote readers, and keeps the faster.
"""
from __future__ import annotations

from typing import Sequence

from ..core.geometry import Region, cut_along, intersect, volume
from ..errors import PlanError
from .routes import RANK_REFERENCE_BYTES
from .timing import link_resources

# Chunks no smaller than this (where the block allows) and at most this many per block: more
# chunks pipeline and spread better but each costs a message and a launch per hop.
CHUNK_BYTES = RANK_REFERENCE_BYTES
MAX_CHUNKS = 8
# ... unless the exchange has few blocks: up to this many chunks in all (a relay forwards
# chunk by chunk, so a tree of depth t adds t chunk-times to the block's own).
CHUNK_BUDGET = 64
# And at most about this many transfers per program: the replay that prices it costs time
# per transfer, and the optimizer prices thousands of exchanges (a 16-device gather of 16
# blocks in 8 chunks was 1920 transfers, a second to replay).
TRANSFER_BUDGET = 512


def worth_trees(sources: Sequence[tuple[Region, int, int]],
                needs: Sequence[tuple[Region, int]]) -> bool:
    """Whether some source region is read by two or more devices that do not hold it (the
    case the plain program sends more than once from one holder)."""
    readers: dict[Region, set[int]] = {}
    held: dict[Region, set[int]] = {}
    for reg, dev, _ in sources:
        held.setdefault(reg, set()).add(dev)
    for q, d in needs:
        for reg in held:
            if d not in held[reg] and intersect(reg, q) is not None:
                readers.setdefault(reg, set()).add(d)
    return any(len(r) >= 2 for r in readers.values())


def chunks(x: Region, k: int) -> list[Region]:
    """x cut into up to k row-major ranges along its outermost dim longer than one (each a
    contiguous range of x), as even as the extent allows."""
    dim = next((i for i, (lo, hi) in enumerate(x) if hi - lo > 1), None)
    if dim is None or k <= 1:
        return [x]
    return cut_along(x, dim, min(k, x[dim][1] - x[dim][0]))


def tree_copy(b, sources: Sequence[tuple[Region, int, int]],
              needs: Sequence[tuple[Region, int]]) -> None:
    """Deliver every need (region, device) from full `sources` (region, device, ready round)
    over packed chunk trees (module docstring), emitting transfers and stitches on the
    synthesis `b` (`exchange._Synthesis`). Sources are a layout's pieces: boxes that are
    disjoint or equal (replicas)."""
    holders, groups, parts = _groups(sources, needs)
    sched = _schedule(b)
    # Chunk j of every block before chunk j + 1 of any: the trees of early chunks take the
    # free links first.
    edges = sum(len({d for _, d in readers}) for _, readers in groups.values())
    most = min(max(MAX_CHUNKS, CHUNK_BUDGET // max(1, len(groups))),
               max(1, TRANSFER_BUDGET // max(1, edges)))
    cut_chunks = [chunks(cut, max(1, min(most, int(volume(cut) * b.elem // CHUNK_BYTES))))
                  for cut in groups]
    for j in range(max((len(c) for c in cut_chunks), default=0)):
        for (reg, readers), cs in zip(groups.values(), cut_chunks):
            if j >= len(cs):
                continue
            reached = sched.grow(cs[j], reg, holders[reg], [d for _, d in readers])
            for q, d in readers:
                if d in reached:
                    parts[(q, d)].append((cs[j], True))
    _stitch_all(b, parts)


def scatter_copy(b, sources: Sequence[tuple[Region, int, int]],
                 needs: Sequence[tuple[Region, int]]) -> bool:
    """Deliver every need as a scatter, then an all-gather among the readers: a block its
    readers D lack is cut into |D| m row-major chunks, chunk i sent from its nearest holder
    to reader D[i mod |D|], which sends it on to every other reader. The holder sends the
    block once and every reader forwards 1 / |D| of it, where a relay in a packed tree may
    forward most of the block (when this was built, a forwarded buffer could not land in
    place and each relay copied what it forwarded; now it sends from where it landed). m
    chunks per reader (CHUNK_BYTES or more each) pipeline
    the two phases. Returns False, emitting nothing, where the program would exceed the
    transfer budget with two chunks per reader, or where the blocks have more than half as
    many holders as readers: there the holders' ports are not the bottleneck, and every
    reader's forwards hold up a prefetch queue (a gathered weight: the llama-3-8b block on
    a100x8 simulated 1.5% slower with it)."""
    holders, groups, parts = _groups(sources, needs)
    devs_of = {cut: list(dict.fromkeys(d for _, d in readers))
               for cut, (_, readers) in groups.items()}
    fan = sum(len(devs) ** 2 for devs in devs_of.values())
    senders = {dev for reg, _ in groups.values() for dev, _ in holders[reg]}
    readers_all = {d for devs in devs_of.values() for d in devs}
    if not fan or 2 * fan > TRANSFER_BUDGET or 2 * len(senders) > len(readers_all):
        return False
    for cut, (reg, readers) in groups.items():
        devs = devs_of[cut]
        m = max(1, min(MAX_CHUNKS, TRANSFER_BUDGET // fan,
                       int(volume(cut) * b.elem // (len(devs) * CHUNK_BYTES))))
        for i, piece in enumerate(chunks(cut, len(devs) * m)):
            relay = devs[i % len(devs)]
            dev, ready = min(holders[reg], key=lambda h: (b.dist(h[0], relay), h[0]))
            if b.flat:  # wave w of chunks starts in round w: a relay forwards as they come
                ready = max(ready, i // len(devs) - 1)
            at = b.send(dev, relay, piece, ready, within=reg)
            for d in devs:
                if d != relay:
                    b.send(relay, d, piece, at)
            for q, d in readers:
                parts[(q, d)].append((piece, True))
    _stitch_all(b, parts)
    return True


def _groups(sources, needs):
    """(holders: region -> [(device, ready round)], groups: cut -> (the source region it is
    cut from, the needs (region, device) that read it, remote), parts: need -> [(part,
    received?)] with the local parts already in)."""
    holders: dict[Region, list[tuple[int, int]]] = {}
    for reg, dev, ready in sources:
        holders.setdefault(reg, []).append((dev, ready))
    groups: dict[Region, tuple[Region, list[tuple[Region, int]]]] = {}
    parts: dict[tuple[Region, int], list[tuple[Region, bool]]] = {}
    for q, d in dict.fromkeys(needs):
        got = parts.setdefault((q, d), [])
        for reg, held in holders.items():
            cut = intersect(reg, q)
            if cut is None:
                continue
            if any(dev == d for dev, _ in held):
                got.append((cut, False))
            else:
                groups.setdefault(cut, (reg, []))[1].append((q, d))
    return holders, groups, parts


def _stitch_all(b, parts) -> None:
    for (q, d), got in parts.items():
        if volume(q) != sum(volume(r) for r, _ in got):
            raise PlanError(f"tensor {b.info.name!r}: region {q} needed on device {d} is not "
                            "covered by the producer's pieces",
                            fix="the producer layout must cover the tensor")
        b.stitch(q, d, got)


def _tree_links(b) -> list[dict[int, tuple[tuple[tuple[str, float], ...], float, float]]]:
    """Per device u, the links a tree may take out of it: v -> (resources, bandwidth,
    latency) where the topology's own route from u to v is that one link (not a slow
    fallback the route avoids, as the DGX-1's QPI path for pairs the NVLinks relay).
    Memoised per topology instance."""
    topo = b.topo
    cache = getattr(topo, "_cache", None)
    memo = cache.setdefault("tree-links", {}) if isinstance(cache, dict) else {}
    key = b.mode
    if key not in memo:
        out = []
        for u in range(topo.world_size):
            row = {}
            for v in range(topo.world_size):
                if v != u and len(b.route(u, v)[0]) == 2:
                    link = topo.link(u, v)
                    row[v] = (link_resources(link), link.bw, link.latency_s)
            out.append(row)
        memo[key] = out
    return memo[key]


class _Schedule:
    """The loads the trees put on the links (module docstring), and the trees themselves,
    emitted edge by edge as they grow."""

    def __init__(self, b) -> None:
        self.b = b
        self.load: dict[str, float] = {}   # every resource: the seconds of bytes on it
        self.links = _tree_links(b)

    def grow(self, chunk: Region, within: Region, roots: list[tuple[int, int]],
             readers: list[int]) -> list[int]:
        """Send `chunk` (cut from the block `within` its roots hold) down one tree from the
        roots to every reader, grown by the edge score of the module docstring (Prim's rule
        over the links' loads and the tree's depth); returns the readers reached. A chunk
        leaves a relay after the round it arrived in, a root after its block's ready round."""
        b = self.b
        nbytes = volume(chunk) * b.elem
        depth = {dev: 0 for dev, _ in roots}
        ready = dict(roots)  # device -> the round after which it holds the chunk
        left = [d for d in dict.fromkeys(readers) if d not in depth]
        while left:
            u, v, direct = self._attach(depth, left, nbytes, inward=False)
            hops = (u, v) if direct else None
            ready[v] = b.send(u, v, chunk, ready[u], hops=hops,
                              within=within if depth[u] == 0 else None)
            depth[v] = depth[u] + 1
            left.remove(v)
        return [d for d in depth if depth[d] > 0]

    def _attach(self, depth: dict[int, int], left: list[int], nbytes: float,
                inward: bool) -> tuple[int, int, bool]:
        """The next edge of a tree: of the direct links between a member u and a device v
        not yet in it (v -> u for a fold, `inward`; u -> v for a copy), the one of least
        score (module docstring), its loads taken; where there is none, v = the first left
        and u its nearest member over the topology's route. Returns (u, v, direct?)."""
        b = self.b
        load = self.load
        best = None
        for u in depth:
            for v in left:
                hit = (self.links[v] if inward else self.links[u]).get(u if inward else v)
                if hit is None:
                    continue
                res, bw, latency = hit
                busy = max(load.get(r, 0.0) + nbytes / rbw for r, rbw in res)
                score = busy + depth[u] * nbytes / bw + latency
                if best is None or score < best[0]:
                    best = (score, u, v, res)
        if best is None:
            v = left[0]
            u = min(depth, key=lambda x: b.dist(v, x) if inward else b.dist(x, v))
            return u, v, False
        _, u, v, res = best
        for r, rbw in res:
            load[r] = load.get(r, 0.0) + nbytes / rbw
        return u, v, True

    def fold(self, chunk: Region, block: Region, r: int, chosen: dict[int, list[int]]) -> int:
        """Fold `chunk` at r from the partials `chosen` (device -> its slices) up one tree
        grown from r (each member's edge into the tree scored on its link toward it);
        returns the round r's folded value is ready after."""
        b = self.b
        nbytes = volume(chunk) * b.elem
        depth = {r: 0}
        parent: dict[int, int] = {}
        left = [d for d in chosen if d != r]
        while left:
            u, v, _ = self._attach(depth, left, nbytes, inward=True)
            parent[v] = u
            depth[v] = depth[u] + 1
            left.remove(v)
        # leaves first: a member folds its own partials and what its children sent
        arrived: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        for v in sorted(parent, key=lambda y: -depth[y]):
            inputs = [((s,), -1) for s in chosen[v]] + arrived.get(v, [])
            if len(inputs) == 1 and inputs[0][1] < 0:  # its one partial, as produced
                ss, ready, within = inputs[0][0], -1, block
            else:
                ss = tuple(sorted(s for slices, _ in inputs for s in slices))
                ready, within = b.reduce(v, chunk, inputs, ss), None
            hops = (v, parent[v]) if parent[v] in self.links[v] else None
            arrived.setdefault(parent[v], []).append(
                (ss, b.send(v, parent[v], chunk, ready, ss, hops=hops, within=within)))
        return b.reduce(r, chunk, [((s,), -1) for s in chosen.get(r, [])] + arrived.get(r, []),
                        ())

def tree_fold(b, x: Region, r: int, holders: dict[int, list[int]], block: Region) -> list[
        tuple[Region, int]]:
    """Fold the partial slices of `x` (cut from `block`, slice -> holders) at r down packed
    trees, the reverse of a copy's: x is cut into chunks; for each, a tree rooted at r spans
    one holder per slice (the nearest to r), grown by the same edge score on the links into
    the tree; each member folds what its subtree sent with its own partial and sends one
    value up, so every link carries one chunk (the fold placed where the bytes are).
    Returns (chunk, round its full value is ready at r) per chunk."""
    chosen: dict[int, list[int]] = {}
    for s in sorted(holders):
        h = min(holders[s], key=lambda dev: (b.dist(dev, r), dev))
        chosen.setdefault(h, []).append(s)
    sched = _schedule(b)
    # about as many folds as holders, each a tree of as many edges: the transfer budget
    most = min(MAX_CHUNKS, max(1, TRANSFER_BUDGET // max(1, len(chosen) ** 2)))
    k = max(1, min(most, int(volume(x) * b.elem // CHUNK_BYTES)))
    return [(chunk, sched.fold(chunk, block, r, chosen)) for chunk in chunks(x, k)]


def _schedule(b) -> "_Schedule":
    """The synthesis' one schedule: every tree it grows sees the loads of the others."""
    if b.tree_schedule is None:
        b.tree_schedule = _Schedule(b)
    return b.tree_schedule
