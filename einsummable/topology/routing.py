"""Routes: the fastest path between two devices for a message of a given size."""
from __future__ import annotations

import heapq
import itertools
import math

# Path times are compared in integer picoseconds so that float summation order cannot flip a
# tie between equally fast routes (determinism).
_TIME_QUANTUM_PER_S: float = 1e12


def shortest_routes(links: tuple, src: int,
                     nbytes: float) -> dict[int, tuple]:
    """Dijkstra from src; a hop costs latency + nbytes / bw, in integer picoseconds, and the
    (cost, hops, device sequence) key makes ties deterministic."""
    adj: dict[int, list] = {}
    for l in links:
        adj.setdefault(l.src, []).append(l)
    heap: list[tuple[int, int, tuple[int, ...], tuple]] = [(0, 0, (src,), ())]
    out: dict[int, tuple] = {}
    done: set[int] = set()
    while heap:
        cost, nh, path, route = heapq.heappop(heap)
        node = path[-1]
        if node in done:
            continue
        done.add(node)
        if node != src:
            out[node] = route
        for l in adj.get(node, ()):
            if l.dst not in done:
                step = round(l.time(nbytes) * _TIME_QUANTUM_PER_S)
                heapq.heappush(heap, (cost + step, nh + 1, path + (l.dst,), route + (l,)))
    return out


def bisection_bw(topo) -> float:
    """Minimum over balanced cuts of the direct-link bandwidth crossing the cut in one
    direction (links on one shared resource count once, at their fastest). Exponential in
    the world size; meant for small machines (<= 16 devices)."""
    n = topo.world_size
    if n < 2:
        return math.inf
    best = math.inf
    rest = range(1, n)
    for half in itertools.combinations(rest, n // 2 - 1):  # device 0 is always on side A
        side = {0, *half}
        res: dict[str, float] = {}
        for l in topo.links:
            if l.src in side and l.dst not in side:
                res[l.resource] = max(res.get(l.resource, 0.0), l.bw)
        best = min(best, sum(res.values()))
    return best

