"""The link graph (networkx): routes between devices for a message of a given size, which
devices cannot reach which, and the bisection bandwidth."""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

import networkx as nx

# Path times are compared in integer picoseconds so that float summation order cannot flip a
# tie between equally fast routes (determinism).
_TIME_QUANTUM_PER_S: float = 1e12


# The edge attribute that holds the Link of a graph edge.
LINK_ATTR: str = "link"


def link_graph(num_devices: int, links: Iterable) -> nx.DiGraph:
    """Devices 0..num_devices-1 as nodes and one edge per directed link (the Link under
    LINK_ATTR). Every device is a node, linked or not, so that reachability sees them all."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(num_devices))
    graph.add_edges_from((l.src, l.dst, {LINK_ATTR: l}) for l in links)
    return graph


def first_unreachable(graph: nx.DiGraph) -> tuple[int, int] | None:
    """The first (s, t), in device order, such that no chain of links leads from s to t; None
    when every device reaches every other."""
    if nx.is_strongly_connected(graph):
        return None
    everyone = set(graph)
    for s in sorted(everyone):
        missing = everyone - nx.descendants(graph, s) - {s}
        if missing:
            return s, min(missing)
    return None


def shortest_routes(graph: nx.DiGraph, src: int, nbytes: float) -> dict[int, tuple]:
    """The route (a tuple of Links) from src to every device it reaches, for a message of
    nbytes. A hop costs latency + nbytes / bw, in integer picoseconds; among the fastest
    paths the fewest hops win, and among those the lexicographically smallest device sequence.

    Computed in stages, each a plain graph question: the fastest time to every device
    (Dijkstra); the "tight" links, those that lie on some fastest path (dist[u] + w == dist[v]);
    the fewest hops over tight links (breadth-first: tight links may cost 0, so hop counts
    need their own search); then, layer by layer of hop count, each device's smallest device
    sequence is the smallest of its tight predecessors' one layer up, extended by itself
    (all candidates have the same length, so the plain tuple order is the lexicographic one)."""
    cost = {(u, v): round(link.time(nbytes) * _TIME_QUANTUM_PER_S)
            for u, v, link in graph.edges(data=LINK_ATTR)}
    dist = nx.single_source_dijkstra_path_length(graph, src, weight=lambda u, v, _: cost[u, v])
    tight = nx.DiGraph()
    tight.add_node(src)
    tight.add_edges_from((u, v) for (u, v), w in cost.items()
                         if u in dist and dist[u] + w == dist[v])
    hops = nx.single_source_shortest_path_length(tight, src)
    best: dict[int, tuple[int, ...]] = {src: (src,)}
    for v in sorted(hops, key=hops.__getitem__):  # by hop count: predecessors come first
        if v != src:
            best[v] = min(best[u] for u in tight.predecessors(v)
                          if hops[u] + 1 == hops[v]) + (v,)
    return {v: tuple(graph.edges[a, b][LINK_ATTR] for a, b in itertools.pairwise(seq))
            for v, seq in best.items() if v != src}


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
