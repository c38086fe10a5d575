"""Hardware topology: devices, directed links, a level hierarchy, and routes between devices.

A topology comes from YAML (``load_topology("a100x8")`` or a path) or from ``synthetic(n)``.
Everything here is immutable; the only state is a per-instance route cache that memoises a
pure function of the (frozen) fields.

YAML schema (see topologies/*.yaml for commented examples)::

    name: str
    source_notes: str                      # where the figures come from
    device_types:                          # named device specs
      NAME: {peak_flops: {float16: 312 TFLOP/s, bfloat16: ..., float32: ...},
             mem_bw: 1555 GB/s, mem_bytes: 40 GB, launch: 5 us}
    nodes: {count: 2, devices_per_node: 8, device_type: NAME, name: "{type}:{local}"}
      # ... or instead an explicit list:
    devices: [{id: 0, node: 0, name: gpu0, type: NAME}, ...]   # or inline spec keys
    links:                                 # rules, applied in order
      - kind: nvswitch | nvlink | pcie | qpi | ib | loopback
        pairs: all | within_node | across_nodes | rails | unlinked | [[a, b], [a, b, lanes]]
        bw: 300 GB/s                       # per direction, per lane (lanes default 1)
        total_bw: ...                      # alternative to bw: the whole link, lanes ignored
        latency: 3 us
        shared: "nic{src_node}.{src_local}"   # optional contended resource (template)
        port: nvlink                       # optional per-device port this link uses ...
        port_bw: 300 GB/s                  # ... and its total rate per direction per device
        oneway: false                      # true: only a->b, not b->a
        replace: false                     # true: override links set by earlier rules
    levels: [{name: node, groups: per_node | per_device | [[0, 1], ...]}, ...]  # optional

Ports. A link may name a per-device port: its bytes then also load the source device's egress
port and the destination device's ingress port of that name, each limited to ``port_bw`` (all
links of one port at one device together). This is how one GPU's NVSwitch/NVLink/NIC bandwidth
is a total, not a per-peer figure: an A100 sends 300 GB/s in all, however many peers it feeds.

Quantities accept unit strings ("300 GB/s", "400 Gb/s", "312 TFLOP/s", "40 GiB", "5 us") or
plain numbers in base units (B/s, FLOP/s, bytes, seconds).
"""
from __future__ import annotations

import heapq
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from einsummable.errors import TopologyError

# --------------------------------------------------------------------------------------------
# Constants

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
DTYPE_ALIASES: Mapping[str, str] = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
}
LINK_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "qpi", "ib", "loopback")
PAIR_SELECTORS: tuple[str, ...] = ("all", "within_node", "across_nodes", "rails", "unlinked")
SHARED_TEMPLATE_VARS: tuple[str, ...] = (
    "src", "dst", "src_node", "dst_node", "src_local", "dst_local")
DEVICE_NAME_VARS: tuple[str, ...] = ("id", "node", "local", "type")

# Routes are chosen for a message of this size unless the caller gives one: large enough that
# bandwidth dominates (tensor blocks are megabytes), small enough that latency still counts.
ROUTE_REFERENCE_BYTES: float = float(1 << 20)
# Route tables kept per instance (one per source and message size); beyond this, recompute.
_ROUTE_CACHE_LIMIT: int = 4096
# Path times are compared in integer picoseconds so that float summation order cannot flip a
# tie between equally fast routes (determinism).
_TIME_QUANTUM_PER_S: float = 1e12

SHIPPED_DIR: Path = Path(__file__).resolve().parent.parent / "topologies"

# Synthetic-topology defaults: A100-like figures (see topologies/a100x8.yaml for sources).
SYNTH_PEAK_FLOPS: Mapping[str, float] = {"float16": 312e12, "bfloat16": 312e12,
                                         "float32": 19.5e12}
SYNTH_MEM_BW: float = 1555e9
SYNTH_MEM_BYTES: float = 40e9
SYNTH_LAUNCH_S: float = 5e-6
SYNTH_INTRA_BW: float = 300e9
SYNTH_INTER_BW: float = 25e9
SYNTH_INTRA_LATENCY_S: float = 3e-6
SYNTH_INTER_LATENCY_S: float = 10e-6


# --------------------------------------------------------------------------------------------
# Units

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50}
_PREFIXES = {**_DECIMAL, **_BINARY}


# Each unit is (multiplier, divisor): dividing for sub-unit prefixes keeps typed decimals
# exact ("5 us" -> 5e-06, not 4.9999999999999996e-06).
_BITS_PER_BYTE = 8.0


def _unit_table() -> dict[str, dict[str, tuple[float, float]]]:
    bw: dict[str, tuple[float, float]] = {}
    flops: dict[str, tuple[float, float]] = {}
    size: dict[str, tuple[float, float]] = {"bytes": (1.0, 1.0), "byte": (1.0, 1.0)}
    for p, f in _PREFIXES.items():
        bw[f"{p}B/s"] = (f, 1.0)
        for bits in ("b/s", "bit/s", "bps"):  # network links are quoted in bits
            bw[f"{p}{bits}"] = (f, _BITS_PER_BYTE)
        size[f"{p}B"] = (f, 1.0)
        for name in ("FLOP/s", "FLOPS", "flop/s", "FLOPs/s"):
            flops[f"{p}{name}"] = (f, 1.0)
    time = {"s": (1.0, 1.0), "ms": (1.0, 1e3), "us": (1.0, 1e6), "µs": (1.0, 1e6),
            "μs": (1.0, 1e6), "ns": (1.0, 1e9)}
    return {"bandwidth": bw, "flops": flops, "bytes": size, "time": time}


_UNITS = _unit_table()
# kind -> (what it is, an example, the base unit of a plain number)
_KINDS: Mapping[str, tuple[str, str, str]] = {
    "bandwidth": ("bandwidth", "'25 GB/s'", "bytes/s"),
    "flops": ("FLOP rate", "'312 TFLOP/s'", "FLOP/s"),
    "bytes": ("size", "'40 GB'", "bytes"),
    "time": ("duration", "'5 us'", "seconds"),
}


def _expected(kind: str) -> str:
    word, example, base = _KINDS[kind]
    return f"a {word} such as {example} or a number in {base}"
_NUMBER_RE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


def parse_quantity(value: Any, kind: str) -> float:
    """Parse a number or a unit string of ``kind`` (bandwidth, flops, bytes, time) into base
    units. Raises ValueError with a readable reason."""
    table = _UNITS[kind]
    if isinstance(value, bool):
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    m = _NUMBER_RE.match(value)
    if not m:
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "":
        return number
    if unit not in table:
        raise ValueError(f"expected {_expected(kind)}, got {value!r} (unknown unit {unit!r})")
    mul, div = table[unit]
    return number * mul / div


# --------------------------------------------------------------------------------------------
# Data model


def canonical_dtype(dtype: Any) -> str:
    """'fp16', 'half', torch.float16 -> 'float16'."""
    text = str(dtype).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise TopologyError(f"no peak rate for dtype {dtype!r}",
                            fix=f"use one of {', '.join(DTYPES)}")
    return text


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

    def __post_init__(self) -> None:
        # Own a private copy so that the caller's dict cannot change a frozen device.
        object.__setattr__(self, "peak_flops", dict(self.peak_flops))

    def __hash__(self) -> int:  # peak_flops is a dict: hash its items
        return hash((self.id, self.name, self.node, tuple(sorted(self.peak_flops.items())),
                     self.mem_bw, self.mem_bytes, self.launch_s, self.message_s))

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
    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    levels: tuple[Level, ...]
    source_notes: str = ""
    # Memo of pure functions of the fields above (per instance, never shared).
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))
        object.__setattr__(self, "levels", tuple(
            Level(lv.name, tuple(tuple(g) for g in lv.groups)) for lv in self.levels))
        _check_structure(self.name, self.devices, self.links, self.levels,
                         where=f"topology '{self.name}'")

    def __getstate__(self) -> dict:  # do not ship the memo to worker processes
        return {k: getattr(self, k) for k in
                ("name", "devices", "links", "levels", "source_notes")}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_cache", {})

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

    def link(self, src: int, dst: int) -> Link | None:
        return self._link_map().get((src, dst))

    def has_direct(self, a: int, b: int) -> bool:
        return (a, b) in self._link_map()

    # ---- hierarchy ----
    def fanouts(self) -> tuple[int, ...]:
        """Parts each unit of the level above splits into, slow to fast; product = world."""
        sizes = [1] + [lv.size for lv in self.levels]
        return tuple(sizes[i + 1] // sizes[i] for i in range(len(self.levels)))

    def group_of(self, level: int | str, dev: int) -> int:
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
            routes = _shortest_routes(self.links, src, size)
            if len(self._cache) < _ROUTE_CACHE_LIMIT:
                self._cache[key] = routes
        if dst not in routes:  # excluded by validation (the link graph is connected)
            raise TopologyError(f"no route from device {src} to {dst} in '{self.name}'",
                                fix="add a link rule that connects them")
        return routes[dst]

    links_on_route = route

    def hops(self, src: int, dst: int, nbytes: float | None = None) -> tuple[int, ...]:
        """Device sequence of the route, src first, dst last."""
        r = self.route(src, dst, nbytes)
        return (src,) + tuple(l.dst for l in r) if r else (src,)

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
        """Explicit form (every device and directed link spelled out); from_dict inverts it."""
        devices = [{"id": d.id, "name": d.name, "node": d.node,
                    "peak_flops": {k: d.peak_flops[k] for k in DTYPES},
                    "mem_bw": d.mem_bw, "mem_bytes": d.mem_bytes, "launch": d.launch_s,
                    **({"message": d.message_s} if d.message_s else {})}
                   for d in self.devices]
        links: list[dict] = []
        lmap = self._link_map()
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

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_FlowDumper, sort_keys=False, width=100)

    @staticmethod
    def from_dict(data: Any, origin: str = "<dict>") -> "Topology":
        return _Builder(origin).build(data)

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

    def _link_map(self) -> dict[tuple[int, int], Link]:
        m = self._cache.get("links")
        if m is None:
            m = {(l.src, l.dst): l for l in self.links}
            self._cache["links"] = m
        return m



def _shortest_routes(links: tuple[Link, ...], src: int,
                     nbytes: float) -> dict[int, tuple[Link, ...]]:
    """Dijkstra from src; a hop costs latency + nbytes / bw, in integer picoseconds, and the
    (cost, hops, device sequence) key makes ties deterministic."""
    adj: dict[int, list[Link]] = {}
    for l in links:
        adj.setdefault(l.src, []).append(l)
    heap: list[tuple[int, int, tuple[int, ...], tuple[Link, ...]]] = [(0, 0, (src,), ())]
    out: dict[int, tuple[Link, ...]] = {}
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


_FLOW_DICT_MAX_KEYS: int = 4  # peak_flops-sized mappings print on one line


class _FlowDumper(yaml.SafeDumper):
    """Block style at the top, flow style for small leaf mappings and lists (readable)."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, dict) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _is_flat(v: Any) -> bool:
    """A scalar, a list of scalars or of lists of scalars, or a small mapping of scalars."""
    if isinstance(v, dict):
        return len(v) <= _FLOW_DICT_MAX_KEYS and all(not isinstance(x, (dict, list))
                                                     for x in v.values())
    if isinstance(v, list):
        return all(not isinstance(x, (dict, list)) or
                   (isinstance(x, list) and all(not isinstance(y, (dict, list)) for y in x))
                   for x in v)
    return True


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    flow = all(_is_flat(v) for v in data.values()) and not any(
        isinstance(v, str) and "\n" in v for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_FlowDumper.add_representer(list, _represent_list)
_FlowDumper.add_representer(dict, _represent_dict)
_FlowDumper.add_representer(str, _represent_str)


# --------------------------------------------------------------------------------------------
# Structural validation (shared by the constructor and the YAML loader)


def _check_structure(name: Any, devices: tuple[Device, ...], links: tuple[Link, ...],
                     levels: tuple[Level, ...], where: str) -> None:
    def fail(path: str, msg: str, fix: str) -> None:
        raise TopologyError(f"{where}: {path}: {msg}", fix=fix)

    if not isinstance(name, str) or not name:
        fail("name", f"expected a non-empty string, got {name!r}", "give the topology a name")
    if not devices:
        fail("devices", "no devices", "declare at least one device (nodes: or devices:)")
    first: dict[int, int] = {}
    for i, d in enumerate(devices):
        if d.id in first:
            fail(f"devices[{i}].id", f"duplicate device id {d.id} (also devices[{first[d.id]}])",
                 "give every device a distinct id")
        first[d.id] = i
    for i, d in enumerate(devices):
        if d.id != i:
            fail(f"devices[{i}].id", f"expected {i}, got {d.id!r}",
                 "device ids are ranks: list them as 0..n-1 in order")
        missing = [k for k in DTYPES if k not in d.peak_flops]
        if missing:
            fail(f"devices[{i}].peak_flops", f"missing rate for {missing[0]!r}",
                 f"give a rate for each of {', '.join(DTYPES)}")
        for k, v in d.peak_flops.items():
            if k not in DTYPES:
                fail(f"devices[{i}].peak_flops.{k}", "unknown dtype",
                     f"use only {', '.join(DTYPES)}")
            _check_pos(v, f"devices[{i}].peak_flops.{k}", "FLOP/s", fail)
        _check_pos(d.mem_bw, f"devices[{i}].mem_bw", "bytes/s", fail)
        _check_pos(d.mem_bytes, f"devices[{i}].mem_bytes", "bytes", fail)
        _check_nonneg(d.launch_s, f"devices[{i}].launch", "seconds", fail)
        _check_nonneg(d.message_s, f"devices[{i}].message", "seconds", fail)
    n = len(devices)
    pairs: dict[tuple[int, int], int] = {}
    for i, l in enumerate(links):
        for end in ("src", "dst"):
            v = getattr(l, end)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                fail(f"links[{i}].{end}", f"device {v!r} does not exist (devices are 0..{n-1})",
                     "link only declared devices")
        if l.src == l.dst:
            fail(f"links[{i}]", f"links device {l.src} to itself",
                 "drop it: a device needs no link to itself")
        if (l.src, l.dst) in pairs:
            fail(f"links[{i}]", f"second link {l.src}->{l.dst} (first is links"
                 f"[{pairs[(l.src, l.dst)]}])", "keep one link per direction and pair")
        pairs[(l.src, l.dst)] = i
        _check_pos(l.bw, f"links[{i}].bw", "bytes/s", fail)
        _check_nonneg(l.latency_s, f"links[{i}].latency", "seconds", fail)
        if l.kind not in LINK_KINDS:
            fail(f"links[{i}].kind", f"unknown link kind {l.kind!r}",
                 f"use one of {', '.join(LINK_KINDS)}")
        if (l.port is None) != (l.port_bw is None):
            fail(f"links[{i}].port_bw", "port and port_bw go together",
                 "give both (a per-device port and its rate) or neither")
        if l.port_bw is not None:
            _check_pos(l.port_bw, f"links[{i}].port_bw", "bytes/s", fail)
        if isinstance(l.lanes, bool) or not isinstance(l.lanes, int) or l.lanes < 1:
            fail(f"links[{i}].lanes", f"expected a positive integer, got {l.lanes!r}",
                 "lanes counts parallel physical links, at least 1")
    _check_levels(levels, n, fail)
    _check_connected(n, pairs, fail)


def _check_pos(v: Any, path: str, unit: str, fail: Callable) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
        fail(path, f"expected a positive number ({unit}), got {v!r}",
             f"write a positive finite value in {unit} (or with a unit, e.g. as in shipped "
             "topologies)")


def _check_nonneg(v: Any, path: str, unit: str, fail: Callable) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isinf(v):
        fail(path, f"expected a non-negative number ({unit}), got {v!r}",
             f"write a value >= 0 in {unit}")


def _check_levels(levels: tuple[Level, ...], n: int, fail: Callable) -> None:
    if not levels:
        fail("levels", "no levels", "give at least one level, e.g. one group per device")
    everyone = set(range(n))
    prev_group: dict[int, int] | None = None
    names: set[str] = set()
    for li, lv in enumerate(levels):
        if not isinstance(lv.name, str) or not lv.name or lv.name in names:
            fail(f"levels[{li}].name", f"expected a unique non-empty name, got {lv.name!r}",
                 "name each level once (e.g. node, gpu)")
        names.add(lv.name)
        owner: dict[int, int] = {}
        for gi, g in enumerate(lv.groups):
            if not g:
                fail(f"levels[{li}].groups[{gi}]", "empty group", "drop empty groups")
            for d in g:
                if d not in everyone:
                    fail(f"levels[{li}].groups[{gi}]", f"device {d!r} does not exist "
                         f"(devices are 0..{n-1})", "list only declared devices")
                if d in owner:
                    fail(f"levels[{li}].groups[{gi}]", f"device {d} is also in group "
                         f"{owner[d]}: groups must partition the devices",
                         "put every device in exactly one group of each level")
                owner[d] = gi
        if set(owner) != everyone:
            lost = sorted(everyone - set(owner))
            fail(f"levels[{li}].groups", f"devices {lost} are in no group: groups must "
                 "partition the devices", "put every device in exactly one group of each level")
        if prev_group is not None:
            for gi, g in enumerate(lv.groups):
                parents = {prev_group[d] for d in g}
                if len(parents) > 1:
                    fail(f"levels[{li}].groups[{gi}]", f"spans groups {sorted(parents)} of "
                         f"levels[{li-1}]: each level must refine the one above",
                         "split finer levels inside the coarser groups")
        prev_group = owner
    if any(len(g) != 1 for g in levels[-1].groups):
        fail(f"levels[{len(levels)-1}].groups", "the last (fastest) level must hold one "
             "device per group", "end the hierarchy with a per-device level (e.g. gpu)")


def _check_connected(n: int, pairs: Mapping[tuple[int, int], int], fail: Callable) -> None:
    adj: dict[int, list[int]] = {}
    for a, b in pairs:
        adj.setdefault(a, []).append(b)
    for s in range(n):
        seen, stack = {s}, [s]
        while stack:
            for b in adj.get(stack.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    stack.append(b)
        if len(seen) < n:
            t = min(set(range(n)) - seen)
            fail("links", f"device {s} cannot reach device {t} over any chain of links",
                 "add a link rule that connects them (e.g. a pcie or qpi fallback)")


# --------------------------------------------------------------------------------------------
# YAML / dict loading

_TOP_KEYS = ("name", "source_notes", "device_types", "nodes", "devices", "links", "levels")
_SPEC_KEYS = ("peak_flops", "mem_bw", "mem_bytes", "launch", "message")
_NODES_KEYS = ("count", "devices_per_node", "device_type", "name")
_DEVICE_KEYS = ("id", "name", "node", "type") + _SPEC_KEYS
_RULE_KEYS = ("kind", "pairs", "src", "dst", "bw", "total_bw", "latency", "shared", "lanes",
              "oneway", "replace", "port", "port_bw")
_LEVEL_KEYS = ("name", "groups")


class _Builder:
    """Turns a parsed YAML document into a Topology; every error names its field path."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, path: str, msg: str, fix: str) -> None:
        raise TopologyError(f"{self.origin}: {path}: {msg}", fix=fix)

    # -- small typed readers --
    def mapping(self, v: Any, path: str, keys: tuple[str, ...]) -> dict:
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {type(v).__name__} {v!r}",
                      f"write a mapping with keys {', '.join(keys)}")
        for k in v:
            if k not in keys:
                self.fail(f"{path}.{k}" if path else str(k), "unknown key",
                          f"allowed keys here: {', '.join(keys)}")
        return v

    def require(self, d: dict, key: str, path: str) -> Any:
        if key not in d:
            self.fail(f"{path}.{key}" if path else key, "missing", f"add '{key}:'")
        return d[key]

    def qty(self, v: Any, path: str, kind: str, *, positive: bool = True) -> float:
        try:
            x = parse_quantity(v, kind)
        except ValueError as e:
            self.fail(path, str(e), f"write e.g. {_KINDS[kind][1]}")
        ok = (x > 0 if positive else x >= 0) and math.isfinite(x)
        if not ok:
            what = "positive" if positive else "non-negative"
            self.fail(path, f"expected a {what} {_KINDS[kind][0]} ({_KINDS[kind][2]}), "
                      f"got {v!r}", f"write a {what} value, e.g. {_KINDS[kind][1]}")
        return x

    def integer(self, v: Any, path: str, *, minimum: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(path, f"expected an integer >= {minimum}, got {v!r}",
                      f"write a whole number >= {minimum}")
        return v

    def text(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not v:
            self.fail(path, f"expected a non-empty string, got {v!r}", "write some text")
        return v

    def boolean(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            self.fail(path, f"expected true or false, got {v!r}", "write true or false")
        return v

    # -- sections --
    def build(self, data: Any) -> Topology:
        top = self.mapping(data, "", _TOP_KEYS)
        name = self.text(self.require(top, "name", ""), "name")
        notes = top.get("source_notes", "")
        if not isinstance(notes, str):
            self.fail("source_notes", f"expected a string, got {notes!r}", "write text")
        types = self.device_types(top.get("device_types", {}))
        devices = self.devices(top, types)
        links = self.links(self.require(top, "links", ""), devices)
        levels = self.levels(top.get("levels"), devices)
        _check_structure(name, devices, links, levels, where=self.origin)
        return Topology(name, devices, links, levels, notes)

    def spec(self, d: dict, path: str) -> dict:
        pf = self.require(d, "peak_flops", path)
        pf = self.mapping(pf, f"{path}.peak_flops", DTYPES)
        for k in DTYPES:
            if k not in pf:
                self.fail(f"{path}.peak_flops", f"missing rate for {k!r}",
                          f"give a rate for each of {', '.join(DTYPES)}, e.g. "
                          f"{k}: 100 TFLOP/s")
        return {"peak_flops": {k: self.qty(pf[k], f"{path}.peak_flops.{k}", "flops")
                               for k in DTYPES},
                "mem_bw": self.qty(self.require(d, "mem_bw", path), f"{path}.mem_bw",
                                   "bandwidth"),
                "mem_bytes": self.qty(self.require(d, "mem_bytes", path), f"{path}.mem_bytes",
                                      "bytes"),
                "launch_s": self.qty(self.require(d, "launch", path), f"{path}.launch", "time",
                                     positive=False),
                "message_s": self.qty(d.get("message", 0), f"{path}.message", "time",
                                      positive=False)}

    def device_types(self, v: Any) -> dict[str, dict]:
        if not isinstance(v, dict):
            self.fail("device_types", f"expected a mapping of name -> spec, got {v!r}",
                      "write device_types: {NAME: {peak_flops: ..., mem_bw: ..., ...}}")
        return {str(k): self.spec(self.mapping(s, f"device_types.{k}", _SPEC_KEYS),
                                  f"device_types.{k}") for k, s in v.items()}

    def type_ref(self, t: Any, path: str, types: dict[str, dict]) -> dict:
        if t not in types:
            self.fail(path, f"unknown device type {t!r}",
                      f"declare it under device_types (known: {sorted(types) or 'none'})")
        return types[t]

    def devices(self, top: dict, types: dict[str, dict]) -> tuple[Device, ...]:
        if ("nodes" in top) == ("devices" in top):
            self.fail("nodes", "give exactly one of 'nodes' (compact) or 'devices' (explicit)",
                      "use nodes: {count, devices_per_node, device_type} for uniform machines")
        if "nodes" in top:
            nd = self.mapping(top["nodes"], "nodes", _NODES_KEYS)
            count = self.integer(nd.get("count", 1), "nodes.count", minimum=1)
            per = self.integer(self.require(nd, "devices_per_node", "nodes"),
                               "nodes.devices_per_node", minimum=1)
            tname = self.require(nd, "device_type", "nodes")
            spec = self.type_ref(tname, "nodes.device_type", types)
            default_tpl = "n{node}.{type}:{local}" if count > 1 else "{type}:{local}"
            tpl = nd.get("name", default_tpl)
            out = []
            for node, local in itertools.product(range(count), range(per)):
                i = node * per + local
                label = self.template(tpl, "nodes.name", DEVICE_NAME_VARS,
                                      id=i, node=node, local=local, type=tname)
                out.append(Device(i, label, node, **spec))
            return tuple(out)
        lst = top["devices"]
        if not isinstance(lst, list) or not lst:
            self.fail("devices", f"expected a non-empty list, got {lst!r}",
                      "list the devices as {id, node, name, type}")
        out = []
        seen: dict[int, int] = {}
        for i, e in enumerate(lst):
            p = f"devices[{i}]"
            e = self.mapping(e, p, _DEVICE_KEYS)
            did = self.integer(self.require(e, "id", p), f"{p}.id", minimum=0)
            if did in seen:
                self.fail(f"{p}.id", f"duplicate device id {did} (also devices[{seen[did]}])",
                          "give every device a distinct id")
            seen[did] = i
            node = self.integer(e.get("node", 0), f"{p}.node", minimum=0)
            if "type" in e:
                extra = [k for k in _SPEC_KEYS if k in e]
                if extra:
                    self.fail(f"{p}.{extra[0]}", "given together with 'type'",
                              "either reference a device type or spell the spec inline")
                spec = self.type_ref(e["type"], f"{p}.type", types)
            else:
                spec = self.spec(e, p)
            label = e.get("name", f"dev{did}")
            out.append(Device(did, self.text(label, f"{p}.name"), node, **spec))
        gaps = sorted(set(range(len(out))) - set(seen))
        if gaps:
            self.fail(f"devices[{seen[max(seen)]}].id", f"device ids must be 0..{len(out)-1} "
                      f"(ranks), but {gaps[0]} is missing", "number the devices 0..n-1")
        return tuple(sorted(out, key=lambda d: d.id))

    def template(self, tpl: Any, path: str, allowed: tuple[str, ...], **values: Any) -> str:
        if not isinstance(tpl, str):
            self.fail(path, f"expected a string, got {tpl!r}", "write a string")
        try:
            return tpl.format(**values)
        except (KeyError, IndexError, ValueError) as e:
            self.fail(path, f"bad template {tpl!r} ({e!s})",
                      f"use only {{{'}, {'.join(allowed)}}} placeholders")
        raise AssertionError("unreachable")

    def links(self, rules: Any, devices: tuple[Device, ...]) -> tuple[Link, ...]:
        if not isinstance(rules, list):
            self.fail("links", f"expected a list of link rules, got {rules!r}",
                      "write links: [{kind, pairs, bw, latency}, ...]")
        per: dict[int, list[int]] = {}
        for d in devices:
            per.setdefault(d.node, []).append(d.id)
        local = {d: idx for ids in per.values() for idx, d in enumerate(ids)}
        made: dict[tuple[int, int], tuple[Link, int]] = {}
        for ri, rule in enumerate(rules):
            p = f"links[{ri}]"
            r = self.mapping(rule, p, _RULE_KEYS)
            kind = self.require(r, "kind", p)
            if kind not in LINK_KINDS:
                self.fail(f"{p}.kind", f"unknown link kind {kind!r}",
                          f"use one of {', '.join(LINK_KINDS)}")
            if ("bw" in r) == ("total_bw" in r):
                self.fail(f"{p}.bw", "give exactly one of bw (per lane) or total_bw",
                          "write bw: 25 GB/s (per direction, per lane)")
            per_lane = "bw" in r
            bw = self.qty(r["bw"] if per_lane else r["total_bw"],
                          f"{p}.{'bw' if per_lane else 'total_bw'}", "bandwidth")
            lat = self.qty(self.require(r, "latency", p), f"{p}.latency", "time",
                           positive=False)
            default_lanes = self.integer(r.get("lanes", 1), f"{p}.lanes", minimum=1)
            oneway = self.boolean(r.get("oneway", False), f"{p}.oneway")
            replace = self.boolean(r.get("replace", False), f"{p}.replace")
            shared_tpl = r.get("shared")
            if ("port" in r) != ("port_bw" in r):
                self.fail(f"{p}.{'port_bw' if 'port' in r else 'port'}",
                          "give port and port_bw together",
                          "write port: nvlink, port_bw: 300 GB/s (per device, per direction)")
            port = self.text(r["port"], f"{p}.port") if "port" in r else None
            port_bw = self.qty(r["port_bw"], f"{p}.port_bw", "bandwidth") if port else None
            pairs = self.pairs(r, p, devices, local, made, default_lanes)
            for (a, b, lanes), pp in pairs:
                for s, t in ((a, b),) if oneway else ((a, b), (b, a)):
                    shared = None if shared_tpl is None else self.template(
                        shared_tpl, f"{p}.shared", SHARED_TEMPLATE_VARS, src=s, dst=t,
                        src_node=devices[s].node, dst_node=devices[t].node,
                        src_local=local[s], dst_local=local[t])
                    if (s, t) in made and not replace:
                        self.fail(pp, f"device pair {s}->{t} already has a link from "
                                  f"links[{made[(s, t)][1]}]",
                                  "set replace: true on this rule to override it, or drop "
                                  "the pair")
                    total = bw * lanes if per_lane else bw
                    made[(s, t)] = (Link(s, t, total, lat, kind, shared, lanes, port, port_bw),
                                    ri)
        return tuple(l for _, (l, _) in sorted(made.items()))

    def pairs(self, r: dict, p: str, devices: tuple[Device, ...], local: dict[int, int],
              made: dict, default_lanes: int) -> list[tuple[tuple[int, int, int], str]]:
        n = len(devices)
        has_pairs, has_sd = "pairs" in r, ("src" in r or "dst" in r)
        if has_pairs == has_sd:
            self.fail(f"{p}.pairs", "give exactly one of 'pairs' or 'src'/'dst'",
                      f"write pairs: [[0, 1], ...] or one of {', '.join(PAIR_SELECTORS)}")
        if has_sd:
            sel: Any = [[self.require(r, "src", p), self.require(r, "dst", p)]]
        else:
            sel = r["pairs"]
        everything = [(a, b) for a in range(n) for b in range(a + 1, n)]
        node, loc = (lambda d: devices[d].node), (lambda d: local[d])
        chosen: dict[str, Callable[[int, int], bool]] = {
            "all": lambda a, b: True,
            "within_node": lambda a, b: node(a) == node(b),
            "across_nodes": lambda a, b: node(a) != node(b),
            "rails": lambda a, b: node(a) != node(b) and loc(a) == loc(b),
            "unlinked": lambda a, b: (a, b) not in made and (b, a) not in made,
        }
        if isinstance(sel, str):
            if sel not in chosen:
                self.fail(f"{p}.pairs", f"unknown pair selector {sel!r}",
                          f"use a list of [a, b] pairs or one of {', '.join(PAIR_SELECTORS)}")
            keep = chosen[sel]
            return [((a, b, default_lanes), f"{p}.pairs") for a, b in everything if keep(a, b)]
        if not isinstance(sel, list) or not sel:
            self.fail(f"{p}.pairs", f"expected a non-empty list of [a, b] or [a, b, lanes], "
                      f"got {sel!r}", f"or use one of {', '.join(PAIR_SELECTORS)}")
        out = []
        for pi, pr in enumerate(sel):
            pp = f"{p}.pairs[{pi}]" if has_pairs else p
            if not isinstance(pr, list) or len(pr) not in (2, 3):
                self.fail(pp, f"expected [a, b] or [a, b, lanes], got {pr!r}",
                          "write a pair of device ids, optionally with a lane count")
            for d in pr[:2]:
                if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < n:
                    self.fail(pp, f"device {d!r} does not exist (devices are 0..{n-1})",
                              "link only declared devices")
            if pr[0] == pr[1]:
                self.fail(pp, f"links device {pr[0]} to itself",
                          "drop it: a device needs no link to itself")
            lanes = self.integer(pr[2], f"{pp}[2]", minimum=1) if len(pr) == 3 else default_lanes
            out.append(((pr[0], pr[1], lanes), pp))
        return out

    def levels(self, v: Any, devices: tuple[Device, ...]) -> tuple[Level, ...]:
        nodes = sorted({d.node for d in devices})
        per_node = tuple(tuple(d.id for d in devices if d.node == k) for k in nodes)
        per_device = tuple((d.id,) for d in devices)
        if v is None:  # default: node level only when there is more than one node
            lv = [Level("gpu", per_device)]
            return tuple(([Level("node", per_node)] if len(nodes) > 1 else []) + lv)
        if not isinstance(v, list) or not v:
            self.fail("levels", f"expected a non-empty list, got {v!r}",
                      "write levels: [{name: node, groups: per_node}, {name: gpu, groups: "
                      "per_device}]")
        out = []
        for li, e in enumerate(v):
            p = f"levels[{li}]"
            e = self.mapping(e, p, _LEVEL_KEYS)
            name = self.text(self.require(e, "name", p), f"{p}.name")
            g = self.require(e, "groups", p)
            if g == "per_node":
                groups = per_node
            elif g == "per_device":
                groups = per_device
            elif isinstance(g, list) and all(isinstance(x, list) for x in g):
                groups = tuple(tuple(x) for x in g)
            else:
                self.fail(f"{p}.groups", f"expected per_node, per_device or a list of device "
                          f"lists, got {g!r}", "write groups: [[0, 1], [2, 3]]")
            out.append(Level(name, groups))
        return tuple(out)


def load_topology(name_or_path: "str | Path | Topology") -> Topology:
    """A shipped name ("a100x8") or a path to a YAML file."""
    if isinstance(name_or_path, Topology):
        return name_or_path
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or text.endswith(
        (".yaml", ".yml"))
    if looks_like_path:
        path = Path(text)
        origin = text
    else:
        path = SHIPPED_DIR / f"{text}.yaml"
        origin = f"topologies/{text}.yaml"
        if not path.is_file():
            raise TopologyError(f"no shipped topology named {text!r}",
                                fix=f"use one of {', '.join(shipped_topologies())} or a path "
                                "to a YAML file")
    if not path.is_file():
        raise TopologyError(f"{origin}: file not found",
                            fix="check the path, or use a shipped name: "
                            + ", ".join(shipped_topologies()))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TopologyError(f"{origin}: not valid YAML: {e}",
                            fix="fix the YAML syntax at the marked line") from None
    return Topology.from_dict(data, origin)


def shipped_topologies() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml")))


def synthetic(n: int, *, nodes: int = 1, intra_bw: float = SYNTH_INTRA_BW,
              inter_bw: float = SYNTH_INTER_BW,
              intra_latency_s: float = SYNTH_INTRA_LATENCY_S,
              inter_latency_s: float = SYNTH_INTER_LATENCY_S,
              peak_flops: Mapping[str, float] | None = None, mem_bw: float = SYNTH_MEM_BW,
              mem_bytes: float = SYNTH_MEM_BYTES, launch_s: float = SYNTH_LAUNCH_S,
              name: str | None = None, message_s: float = 0.0) -> Topology:
    """n devices in ``nodes`` equal nodes, every pair linked: nvswitch inside a node, ib across
    (outbound traffic of a device shares its NIC). Defaults are A100-like; the intra- and
    inter-node rates are per-device totals (ports), as on NVSwitch and rail NICs."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TopologyError(f"synthetic: n: expected an integer >= 1, got {n!r}",
                            fix="pass the world size, e.g. synthetic(4)")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or n % nodes:
        raise TopologyError(f"synthetic: nodes: {nodes!r} does not divide n={n}",
                            fix="choose nodes so that every node holds n // nodes devices")
    per = n // nodes
    rates = dict(SYNTH_PEAK_FLOPS if peak_flops is None else peak_flops)
    devs = tuple(Device(i, f"n{i // per}.dev{i % per}" if nodes > 1 else f"dev{i}", i // per,
                        rates, mem_bw, mem_bytes, launch_s, message_s) for i in range(n))
    links = []
    for a, b in itertools.permutations(range(n), 2):
        if a // per == b // per:
            links.append(Link(a, b, intra_bw, intra_latency_s, "nvswitch",
                              port="nvlink", port_bw=intra_bw))
        else:
            links.append(Link(a, b, inter_bw, inter_latency_s, "ib",
                              f"nic{a // per}.{a % per}", port="nic", port_bw=inter_bw))
    levels = ((Level("node", tuple(tuple(range(k * per, (k + 1) * per))
                                   for k in range(nodes))),) if nodes > 1 else ())
    levels += (Level("gpu", tuple((i,) for i in range(n))),)
    return Topology(name or (f"synthetic{n}" if nodes == 1 else f"synthetic{n}x{nodes}"),
                    devs, tuple(links), levels, "synthetic: A100-like defaults, not a machine")


def bisection_bw(topo: Topology) -> float:
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


__all__ = ["Device", "Link", "Level", "Topology", "load_topology", "synthetic",
           "shipped_topologies", "parse_quantity", "canonical_dtype", "bisection_bw",
           "DTYPES", "LINK_KINDS", "ROUTE_REFERENCE_BYTES"]
