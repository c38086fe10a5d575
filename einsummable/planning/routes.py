"""Routes as the exchange synthesiser sees them: per (topology, mode), the hops and link
resources between two devices, the rails that spread a block over every NIC between two
groups, and the reference distance that orders sources."""
from __future__ import annotations

from ..errors import PlanError

# Source order uses the time of a message of this size: large enough that bandwidth dominates.
RANK_REFERENCE_BYTES: float = float(1 << 20)


class Routes:
    """Per (topology instance, mode): routes, their link resources and the reference distance
    that orders sources. Pure functions of the frozen topology, so one table serves every
    synthesis on it (the optimizer prices thousands of pairs on one topology)."""

    def __init__(self, topology, mode: str) -> None:
        self.topo = topology
        self.naive_direct = mode == "naive"
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], tuple[str, ...]]] = {}
        self._dist: dict[int, list[float]] = {}

    def link(self, a: int, b: int, tensor: str):
        link = self.topo.link(a, b)
        if link is None:
            raise PlanError(f"no link {a}->{b} in topology '{self.topo.name}' for tensor "
                            f"{tensor!r}", fix="check the topology's link rules")
        return link

    def route(self, a: int, b: int, tensor: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
        r = self._routes.get((a, b))
        if r is None:
            if self.naive_direct and self.topo.has_direct(a, b):
                hops = (a, b)
            else:
                hops = tuple(self.topo.hops(a, b))
            res = tuple(self.link(x, y, tensor).resource for x, y in zip(hops, hops[1:]))
            r = (hops, res)
            self._routes[(a, b)] = r
        return r

    def rails(self, a: int, b: int) -> tuple[tuple[int, ...], ...]:
        """Routes that spread a's block to b (in different groups of the top level) over
        every parallel link between the two groups: rail m goes a -> A_m -> B_m -> b, A_m
        and B_m the m-th devices of a's and b's groups, over the link A_m -> B_m. Only
        where those links are direct, each on its own resource (one NIC per GPU), and the
        hops to and from them are direct; else () and the plain route stands."""
        key = ("rails", a, b)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        out: tuple[tuple[int, ...], ...] = ()
        topo = self.topo
        if not self.naive_direct and topo.levels and a != b \
                and topo.group_of(0, a) != topo.group_of(0, b):
            ga = topo.levels[0].groups[topo.group_of(0, a)]
            gb = topo.levels[0].groups[topo.group_of(0, b)]
            pairs = list(zip(sorted(ga), sorted(gb)))
            media = {topo.link(x, y).resource for x, y in pairs if topo.has_direct(x, y)}
            usable = (len(ga) == len(gb) and len(media) == len(pairs) > 1
                      and all((x == a or topo.has_direct(a, x))
                              and (y == b or topo.has_direct(y, b)) for x, y in pairs))
            if usable:
                # a's own rail first: its chunk needs no hop inside the source group
                pairs.sort(key=lambda xy: (xy[0] != a, xy[1] != b, xy))
                out = tuple(tuple(dict.fromkeys((a, x, y, b))) for x, y in pairs)
        self._routes[key] = out  # type: ignore[assignment]
        return out

    def dist_to(self, b: int, tensor: str) -> list[float]:
        """Seconds for a reference message from every device to b (0 for b itself)."""
        row = self._dist.get(b)
        if row is None:
            row = []
            for a in range(self.topo.world_size):
                if a == b:
                    row.append(0.0)
                    continue
                hops, _ = self.route(a, b, tensor)
                row.append(sum(self.link(x, y, tensor).time(RANK_REFERENCE_BYTES)
                               for x, y in zip(hops, hops[1:])))
            self._dist[b] = row
        return row


def routes_for(topology, mode: str) -> Routes:
    """The shared route table of `topology` for `mode` (kept in the topology's memo)."""
    cache = getattr(topology, "_cache", None)
    if not isinstance(cache, dict):
        return Routes(topology, mode)
    key = ("exchange-routes", mode)
    table = cache.get(key)
    if table is None:
        table = Routes(topology, mode)
        cache[key] = table
    return table

