"""The machine as data: devices, directed links, a level hierarchy; routes between devices.

Everything here is immutable; the only state is per-instance memos of pure functions of the
(frozen) fields: the link graph and route tables (`routing.py`), and the per-pair answers
(link, hops, level group) that the exchange synthesiser asks for every transfer.

Ports. A link may name a per-device port: its bytes then also load the source device's egress
port and the destination device's ingress port of that name, each limited to ``port_bw`` (all
links of one port at one device together). This is how one GPU's NVSwitch/NVLink/NIC bandwidth
is a total, not a per-peer figure: an A100 sends 300 GB/s in all, however many peers it feeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from ..errors import TopologyError
from .achieved import Achieved
from .checks import check_structure
from .routing import link_graph, shortest_routes
from .units import DTYPES, canonical_dtype


# Routes are chosen for a message of this size unless the caller gives one: large enough that
# bandwidth dominates (tensor blocks are megabytes), small enough that latency still counts.
ROUTE_REFERENCE_BYTES: float = float(1 << 20)


# Route tables kept per instance (one per source and message size); beyond this, recompute.
_ROUTE_CACHE_LIMIT: int = 4096


# The key of the link graph in `Topology._cache`.
_GRAPH_KEY: str = "link-graph"


@dataclass(frozen=True)
class Device:
    id: int
    name: str
    node: int
    peak_flops: dict[str, float]  # dtype -> FLOP/s
    mem_bw: float                 # B/s
    mem_bytes: float
    launch_s: float               # kernel launch overhead
    # Host seconds each point-to-point message costs its sender and its receiver one after
    # another (the transport's per-message handshake: large for gloo ranks sharing cores,
    # negligible beside the latency for NCCL). Lowering packs small blocks for one peer into
    # one message where this exceeds the copy (`coalesce.py`).
    message_s: float = 0.0
    # Host seconds a rank loses each time it waits on a message from a peer while its own
    # message to that peer is in flight too (a two-way exchange): gloo ranks whose cores ran
    # compute just before such an exchange took 0.4-0.9 ms where a one-way hop took 0.15-0.2
    # (`commands/calibrate/rounds.py` fits it); 0 for NCCL, whose kernels spin on the GPU.
    exchange_wait_s: float = 0.0
    # Whether the device runs a weight's prefetch on streams beside its kernels: its
    # transfers' launches (NCCL's stream) and the copies that stitch it into place (a side
    # stream, as NCCL copies an all-gather's local shard inside its kernel) (GPUs); False
    # where one thread runs everything (gloo ranks).
    prefetch_stream: bool = False
    # What the device achieves of the figures above, by kind of work (`achieved.py`).
    achieved: Achieved = field(default_factory=Achieved)

    def __post_init__(self) -> None:
        # Own a private copy so that the caller's dict cannot change a frozen device.
        object.__setattr__(self, "peak_flops", dict(self.peak_flops))

    def __hash__(self) -> int:  # peak_flops is a dict: hash its items
        return hash((self.id, self.name, self.node, tuple(sorted(self.peak_flops.items())),
                     self.mem_bw, self.mem_bytes, self.launch_s, self.message_s,
                     self.exchange_wait_s, self.prefetch_stream,
                     self.achieved))

    def peak(self, dtype: Any) -> float:
        return self.peak_flops[canonical_dtype(dtype)]


@dataclass(frozen=True)
class Link:
    """A directed link; ``bw`` is the rate in this direction."""
    src: int
    dst: int
    bw: float            # B/s
    latency_s: float
    kind: str
    shared: str | None = None   # contended physical resource (PCIe uplink, NIC), if any
    lanes: int = 1              # parallel physical lanes (DGX-1 doubled NVLinks have 2)
    port: str | None = None     # per-device port (egress at src, ingress at dst), if any
    port_bw: float | None = None  # that port's total rate per direction per device

    @property
    def resource(self) -> str:
        """Key for contention: links with the same key share one medium."""
        return self.shared if self.shared is not None else f"{self.kind}:{self.src}->{self.dst}"

    @property
    def egress(self) -> str | None:
        return None if self.port is None else f"port:{self.port}:out@{self.src}"

    @property
    def ingress(self) -> str | None:
        return None if self.port is None else f"port:{self.port}:in@{self.dst}"

    @property
    def port_resources(self) -> tuple[tuple[str, float], ...]:
        """(resource, B/s) of the device ports this link's bytes also occupy."""
        if self.port is None or self.port_bw is None:
            return ()
        return ((self.egress, self.port_bw), (self.ingress, self.port_bw))

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bw


@dataclass(frozen=True)
class Level:
    """One level of the hierarchy: ``groups`` partition the devices into units of this level
    (all devices of a node, or one GPU each). Levels go from slow (coarse) to fast (fine)."""
    name: str
    groups: tuple[tuple[int, ...], ...]

    @property
    def size(self) -> int:
        return len(self.groups)


@dataclass(frozen=True)
class Topology:
    """A machine: devices (ids are ranks 0..n-1), directed links that connect every device to
    every other, and levels from slow to fast. Validated on construction (`checks.py`)."""
    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    levels: tuple[Level, ...]
    source_notes: str = ""
    # Memo of pure functions of the fields above (per instance, never shared, never pickled);
    # other stages keep their tables of this topology here too (planning.routes, .bound).
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # The per-pair answers the exchange synthesiser asks for every transfer, each its own
    # dict so that a hit costs one lookup: (src, dst) -> Link (built at once), and, filled
    # on first use, (src, dst) -> hops at the reference size, (level, dev) -> group index.
    _by_pair: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _hops_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _group_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "levels", tuple(
            Level(lv.name, tuple(tuple(g) for g in lv.groups)) for lv in self.levels))
        graph = check_structure(self.name, self.devices, self.links, self.levels,
                                where=f"topology '{self.name}'")
        self._start_memos()
        self._cache[_GRAPH_KEY] = graph

    def __getstate__(self) -> dict:  # do not ship the memos to worker processes
        return {k: getattr(self, k) for k in
                ("name", "devices", "links", "levels", "source_notes")}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self._start_memos()

    def _start_memos(self) -> None:
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_by_pair", {(l.src, l.dst): l for l in self.links})
        object.__setattr__(self, "_hops_memo", {})
        object.__setattr__(self, "_group_memo", {})

    # ---- basic facts ----
    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len({d.node for d in self.devices})

    def node_of(self, dev: int) -> int:
        return self.devices[self._dev(dev)].node

    def devices_in_node(self, node: int) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices if d.node == node)

    def peak(self, dtype: Any) -> float:
        """Peak rate of the slowest device (a balanced plan waits for it)."""
        key = canonical_dtype(dtype)
        return min(d.peak_flops[key] for d in self.devices)

    @property
    def min_mem_bytes(self) -> float:
        return min(d.mem_bytes for d in self.devices)

    @property
    def charges_per_message(self) -> bool:
        """Whether the transport charges every message a fixed host cost (`Device.message_s`).
        Lowering then sends every weight at the start, in one batch, so that each peer's
        blocks go as one message, and the cost model pays those fixed costs once."""
        return any(d.message_s for d in self.devices)

    def link(self, src: int, dst: int) -> Link | None:
        return self._by_pair.get((src, dst))

    def has_direct(self, a: int, b: int) -> bool:
        return (a, b) in self._by_pair

    @property
    def digraph(self) -> nx.DiGraph:
        """The links as a networkx DiGraph (devices are nodes; each edge's Link under
        `routing.LINK_ATTR`), built once per instance. Read it; do not change it."""
        g = self._cache.get(_GRAPH_KEY)
        if g is None:
            g = self._cache[_GRAPH_KEY] = link_graph(self.world_size, self.links)
        return g

    # ---- hierarchy ----
    def fanouts(self) -> tuple[int, ...]:
        """Parts each unit of the level above splits into, slow to fast; product = world."""
        sizes = [1] + [lv.size for lv in self.levels]
        return tuple(sizes[i + 1] // sizes[i] for i in range(len(self.levels)))

    def group_of(self, level: int | str, dev: int) -> int:
        """Index of the group of ``level`` (index or name) that holds ``dev`` (memoised)."""
        key = (level, dev)
        hit = self._group_memo.get(key)
        if hit is None:
            hit = self._group_memo[key] = self._find_group(level, dev)
        return hit

    def _find_group(self, level: int | str, dev: int) -> int:
        lv = self.levels[self._level_index(level)]
        for gi, g in enumerate(lv.groups):
            if dev in g:
                return gi
        raise TopologyError(f"device {dev} does not exist in topology '{self.name}'",
                            fix=f"use a device id in 0..{self.world_size - 1}")

    def pair_level(self, a: int, b: int) -> int:
        """Index of the coarsest level at which a and b sit in different groups."""
        for i in range(len(self.levels)):
            if self.group_of(i, a) != self.group_of(i, b):
                return i
        raise TopologyError(f"pair_level({a}, {b}): a device is not paired with itself",
                            fix="pass two different devices")

    def level_bw(self, level: int | str) -> float:
        """Slowest route bandwidth between two devices that first differ at ``level``."""
        vals = [self.path_bw(a, b) for a, b in self._pairs_at(level)]
        return min(vals) if vals else math.inf

    def level_latency(self, level: int | str) -> float:
        vals = [self.path_latency(a, b) for a, b in self._pairs_at(level)]
        return max(vals) if vals else 0.0

    # ---- routes ----
    def route(self, src: int, dst: int, nbytes: float | None = None) -> tuple[Link, ...]:
        """Links from src to dst for a message of ``nbytes`` (default ROUTE_REFERENCE_BYTES).

        The direct link is used unless a relay path is faster even store-and-forward (every
        hop pays latency + nbytes / bw in full): so direct NVLink pairs stay direct, and a slow
        host-staged fallback (PCIe/QPI) loses to a relay over NVLink. Without a direct link it
        is the fastest relay path. Ties break on fewer hops, then the lexicographically
        smallest device sequence, so routes are deterministic."""
        src, dst = self._dev(src), self._dev(dst)
        if src == dst:
            return ()
        size = ROUTE_REFERENCE_BYTES if nbytes is None else float(nbytes)
        key = ("routes", src, size)
        routes = self._cache.get(key)
        if routes is None:
            routes = shortest_routes(self.digraph, src, size)
            if len(self._cache) < _ROUTE_CACHE_LIMIT:
                self._cache[key] = routes
        if dst not in routes:  # excluded by validation (the link graph is connected)
            raise TopologyError(f"no route from device {src} to {dst} in '{self.name}'",
                                fix="add a link rule that connects them")
        return routes[dst]

    links_on_route = route

    def hops(self, src: int, dst: int, nbytes: float | None = None) -> tuple[int, ...]:
        """Device sequence of the route, src first, dst last (memoised at the reference size,
        the size the exchange synthesiser routes by)."""
        if nbytes is None:
            hit = self._hops_memo.get((src, dst))
            if hit is not None:
                return hit
        r = self.route(src, dst, nbytes)
        seq = (src,) + tuple(l.dst for l in r) if r else (src,)
        if nbytes is None:
            self._hops_memo[(src, dst)] = seq
        return seq

    def relays(self, src: int, dst: int, nbytes: float | None = None) -> tuple[int, ...]:
        return self.hops(src, dst, nbytes)[1:-1]

    def resources_on_route(self, src: int, dst: int,
                           nbytes: float | None = None) -> tuple[str, ...]:
        return tuple(l.resource for l in self.route(src, dst, nbytes))

    def path_bw(self, src: int, dst: int) -> float:
        r = self.route(src, dst)
        return min(l.bw for l in r) if r else math.inf

    def path_latency(self, src: int, dst: int) -> float:
        return sum(l.latency_s for l in self.route(src, dst))

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to move nbytes over route(src, dst, nbytes); 0 for src == dst."""
        r = self.route(src, dst, nbytes)
        if not r or nbytes <= 0:
            return 0.0
        return sum(l.latency_s for l in r) + nbytes / min(l.bw for l in r)

    # ---- serialisation ----
    def to_dict(self) -> dict:
        """Explicit form (every device and directed link spelled out); `reader.read_topology` inverts it."""
        devices = [{"id": d.id, "name": d.name, "node": d.node,
                    "peak_flops": {k: d.peak_flops[k] for k in DTYPES},
                    "mem_bw": d.mem_bw, "mem_bytes": d.mem_bytes, "launch": d.launch_s,
                    **({"message": d.message_s} if d.message_s else {}),
                    **({"exchange_wait": d.exchange_wait_s} if d.exchange_wait_s else {}),
                    **({"prefetch_stream": True} if d.prefetch_stream else {}),
                    **({"achieved": d.achieved.to_dict()} if not d.achieved.is_datasheet
                       else {})}
                   for d in self.devices]
        links: list[dict] = []
        lmap = self._by_pair
        done: set[tuple[int, int]] = set()
        for l in self.links:
            if (l.src, l.dst) in done:
                continue
            back = lmap.get((l.dst, l.src))
            symmetric = back is not None and (back.bw, back.latency_s, back.kind, back.shared,
                                               back.lanes, back.port, back.port_bw) == (
                l.bw, l.latency_s, l.kind, l.shared, l.lanes, l.port, l.port_bw)
            entry: dict[str, Any] = {"kind": l.kind}
            entry["pairs"] = [[l.src, l.dst] + ([l.lanes] if l.lanes != 1 else [])]
            per_lane = l.bw / l.lanes
            if per_lane * l.lanes == l.bw:
                entry["bw"] = per_lane
            else:
                entry["total_bw"] = l.bw
            entry["latency"] = l.latency_s
            if l.shared is not None:
                entry["shared"] = l.shared
            if l.port is not None:
                entry["port"] = l.port
                entry["port_bw"] = l.port_bw
            if symmetric:
                done.add((l.dst, l.src))
            else:
                entry["oneway"] = True
            done.add((l.src, l.dst))
            links.append(entry)
        levels = [{"name": lv.name, "groups": [list(g) for g in lv.groups]}
                  for lv in self.levels]
        return {"name": self.name, "source_notes": self.source_notes, "devices": devices,
                "links": links, "levels": levels}

    # ---- internals ----
    def _dev(self, dev: int) -> int:
        if isinstance(dev, bool) or not isinstance(dev, int) or not 0 <= dev < self.world_size:
            raise TopologyError(f"device {dev!r} does not exist in topology '{self.name}'",
                                fix=f"use a device id in 0..{self.world_size - 1}")
        return dev

    def _level_index(self, level: int | str) -> int:
        if isinstance(level, str):
            for i, lv in enumerate(self.levels):
                if lv.name == level:
                    return i
            raise TopologyError(f"no level named {level!r} in topology '{self.name}'",
                                fix=f"use one of {[lv.name for lv in self.levels]}")
        return level

    def _pairs_at(self, level: int | str) -> list[tuple[int, int]]:
        i = self._level_index(level)
        n = self.world_size
        return [(a, b) for a in range(n) for b in range(n)
                if a != b and self.pair_level(a, b) == i]
