r"""Several paths at once: a large block sent from one device to another on a mesh goes in
chunks over every short path between them, the chunks spread so that the links' loads even
out (the point-to-point half of an all-to-all, a layout change between two splits).

Why. The plain program sends a block over the topology's one route. On the DGX-1 cube mesh
a GPU reaches four peers directly over one or two 25 GB/s lanes and three others only through
a neighbour, while it has six lanes in all: an all-to-all sent route by route loads the
single lanes and the relayed pairs' fixed middle hops, and leaves the rest idle (3.1 ms for
1 GiB against NCCL's modelled 0.8 ms).

Math. The paths from s to d are the direct dedicated link (if any) and every two-hop path
s -> m -> d over dedicated links. A block of B bytes is cut into k row-major chunks (k from
B / CHUNK_BYTES and the transfer budget). Each link resource r of bandwidth b_r carries L_r
seconds of bytes so far (over the whole program, so one pair's chunks avoid the links another
pair's already fill). A chunk of c bytes goes over the path p minimising

    score(p) = max over r on p of (L_r + c / b_r)  +  (hops(p) - 1) · c / b(p)

(its busiest link once it is added, plus the store-and-forward wait at the relay), and the
loads on p are raised. This is the greedy water-filling of a multi-commodity flow over the
mesh's links: direct lanes first, relayed paths as they become the least loaded.

`exchange.synthesize` builds this program beside the others where the exchange's devices
form a mesh (`rings.mesh_rings`) and keeps the fastest.
"""
from __future__ import annotations

from ..core.geometry import Region, intersect, volume
from .rings import dedicated
from .timing import link_resources
from .trees import CHUNK_BYTES, TRANSFER_BUDGET, chunks

# At most this many chunks per block: each costs a message, and a strided one a pack.
MAX_PATH_CHUNKS = 8


def _paths(b, s: int, d: int) -> list[tuple[tuple[int, ...], tuple, float]]:
    """(hops, link resources, bottleneck bandwidth) of every path of one or two dedicated
    links from s to d. Memoised per topology instance."""
    topo = b.topo
    cache = getattr(topo, "_cache", None)
    memo = cache.setdefault("mesh-paths", {}) if isinstance(cache, dict) else {}
    if (s, d) not in memo:
        direct = [m for m in range(topo.world_size) if m != s and dedicated(topo, s, m)]
        out = []
        if dedicated(topo, s, d):
            link = topo.link(s, d)
            out.append(((s, d), link_resources(link), link.bw))
        for m in direct:
            if m != d and dedicated(topo, m, d):
                first, second = topo.link(s, m), topo.link(m, d)
                out.append(((s, m, d), link_resources(first) + link_resources(second),
                            min(first.bw, second.bw)))
        memo[(s, d)] = out
    return memo[(s, d)]


def worth_paths(sources, needs, itemsize: int) -> bool:
    """Whether some block a device reads from another is large enough to cut in two."""
    return any(dev != d and (cut := intersect(reg, q)) is not None
               and volume(cut) * itemsize >= 2 * CHUNK_BYTES
               for q, d in needs for reg, dev, _ in sources)


def blocks_sent(sources, needs) -> int:
    """How many (source block, remote need) pairs meet: the blocks a copy sends, at most."""
    return max(1, sum(1 for q, d in needs for reg, dev, _ in sources
                      if dev != d and intersect(reg, q) is not None))


def spread_send(b, src: int, dst: int, reg: Region, ready: int, within: Region | None,
                blocks: int) -> list[tuple[Region, int, int]] | None:
    """Send `reg` from src to dst in chunks over the paths between them (module docstring);
    `blocks`: how many blocks the exchange sends this way (the transfer budget is theirs to
    share). Returns (chunk, dst, round) per chunk, or None where there are fewer than two
    paths or the block is too small to cut (the caller sends it as it would)."""
    paths = _paths(b, src, dst)
    nbytes = volume(reg) * b.elem
    k = min(MAX_PATH_CHUNKS, int(nbytes // CHUNK_BYTES), max(1, TRANSFER_BUDGET // blocks))
    if len(paths) < 2 or k < 2:
        return None
    load = b.path_loads
    out = []
    for chunk in chunks(reg, k):
        c = volume(chunk) * b.elem
        best = min(paths, key=lambda p: (max(load.get(r, 0.0) + c / bw for r, bw in p[1])
                                         + (len(p[0]) - 2) * c / p[2], len(p[0])))
        hops, res, _ = best
        for r, bw in res:
            load[r] = load.get(r, 0.0) + c / bw
        out.append((chunk, dst, b.send(src, dst, chunk, ready, hops=hops, within=within)))
    return out
