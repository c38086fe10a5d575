"""A read-only view of a Topology that memoises the per-pair queries the exchange synthesiser
repeats (link, route hops, level groups): the same answers, fewer recomputations."""
from __future__ import annotations


class FastTopology:
    """A read-only view of a Topology that memoises the per-pair queries the exchange
    synthesiser repeats (link, route hops, level groups). Same answers, fewer recomputations."""

    def __init__(self, topology) -> None:
        self._t = topology
        # the fields the synthesiser reads per transfer, held here rather than forwarded
        # by __getattr__ on every read (the memo dict is the topology's own, shared)
        self._cache = getattr(topology, "_cache", None)
        self.devices = topology.devices
        self._link: dict = {}
        self._hops: dict = {}
        self._direct: dict = {}
        self._group: dict = {}

    def __getattr__(self, name):
        return getattr(self._t, name)

    @property
    def base(self):
        return self._t

    def link(self, a: int, b: int):
        key = (a, b)
        if key not in self._link:
            self._link[key] = self._t.link(a, b)
        return self._link[key]

    def has_direct(self, a: int, b: int) -> bool:
        key = (a, b)
        if key not in self._direct:
            self._direct[key] = self._t.has_direct(a, b)
        return self._direct[key]

    def hops(self, a: int, b: int, nbytes=None):
        if nbytes is not None:
            return self._t.hops(a, b, nbytes)
        key = (a, b)
        if key not in self._hops:
            self._hops[key] = self._t.hops(a, b)
        return self._hops[key]

    def group_of(self, level, dev: int) -> int:
        key = (level, dev)
        if key not in self._group:
            self._group[key] = self._t.group_of(level, dev)
        return self._group[key]

