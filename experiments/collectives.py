"""Collectives costed the way NCCL (and vLLM's custom all-reduce) run them on a topology.

The simulated baselines call collectives; this module says how long one takes on a group of
devices of a `Topology`. It is a bandwidth-latency model; its math, before the code:

**Rings inside a node.** NCCL lays several rings over a node at once (its channels) and splits
the data among them. A ring moves its data one way round a cycle through every device of the
group, so a ring runs at its slowest arc, and the rings' rates add up to the node's *bus
bandwidth*

    b_bus = Σ_r min over arcs (a→b) of r of cap(a→b).

The rings are found greedily: take the directed Hamiltonian cycle over *dedicated* links
(links on no shared medium: NVLink lanes, NVSwitch ports; not the PCIe/QPI fallback, not NICs)
whose bottleneck of remaining capacity is largest; take that bottleneck off each arc it uses
and off the egress and ingress port of each device it passes; repeat until no cycle has
capacity left. An arc's capacity starts at its link's rate (lanes × lane rate); a device's
port at the port's rate. On NVSwitch (every pair linked through one port per device) that is
one ring at the port rate; on the DGX-1 hybrid cube mesh, rings over single and doubled
NVLinks until each GPU's six lanes are spent (`einsummable.planning.rings.greedy_rings`: the
rings the exchange synthesis sends round on a mesh). Where no cycle over dedicated links
exists, the one ring is g_0→g_1→…→g_{L−1}→g_0 over the routes at its slowest hop (NCCL over PCIe).

**Achieved rates.** Each phase runs at a published fraction f of the model's rate (constants
below, with their sources): f_nv on NVLink/NVSwitch, f_net on the network, f_p2p for vLLM's
peer-read kernels. `PEAK` sets every fraction to 1, the rates einsummable's own
point-to-point exchanges are simulated at.

**One node** (N devices, bus bandwidth b = f_nv b_bus, α the largest latency of a ring arc):

    all_reduce(B)     = 2 (N−1)/N  · B / b + 2 (N−1) α
    all_gather(B)     =   (N−1)/N  · B / b +   (N−1) α    (B: the gathered bytes)
    reduce_scatter(B) =   (N−1)/N  · B / b +   (N−1) α    (B: the input bytes)
    ring_pass(B)      =   (N−1)/N  · B / b +   (N−1) α    (B: the whole tensor)
    all_to_all(B)     =   (N−1)/N² · B / b +   (N−1) α    (B: the whole tensor)
    broadcast(B)      =             B / b +   (N−1) α    (pipelined down the ring; on
                                                          several nodes the flat ring only)

  An all-to-all's pairs move B / N² each, point to point, so no fabric runs it faster than
  its narrowest cut: for a set X of the node's devices, |X| (N − |X|) B / N² bytes enter X
  over the links into it (each medium once, c_X), so all_to_all ≥ B / N² / min_X c_X /
  (|X| (N − |X|)) (`Fabric.cut_pair_bw`; the DGX-1 cube's two quads meet over six lanes, a
  bound of 1.6 ms for 1 GiB where the bus rate alone gives 0.8).

**Several nodes** (M nodes of L devices, one NIC per device at rate n, rail-optimised; α_n
the network latency). NCCL takes the faster of its algorithms, so do we:
- flat ring through all N = L·M devices, one channel per NIC: inside a node it runs at the
  bus bandwidth, across at the L NICs together, so b = min(f_nv b_bus, f_net L n), α =
  max(α, α_n), and the one-node formulas with N;
- hierarchical: reduce-scatter inside each node, then each device all-reduces its 1/L share
  with its peers of the other nodes over its own NIC (all L at once), then all-gather inside:

    all_reduce     = 2 (L−1)/L · B / (f_nv b_bus) + 2 (M−1)/M · (B/L) / (f_net n)
                     + 2 (L−1) α + 2 (M−1) α_n
    all_gather, reduce_scatter: half of each term.

  all_to_all sends (L−1)/N² · B over NVLink and (N−L)/N² · B over the NIC at once:
  max of the two times + (L−1) α + (M−1) α_n.

**The kernel** (where the caller gives one, `Kernel`: the collective-pattern bench, whose
einsummable programs pay a launch per p2p batch and per fold). NCCL runs a collective as one
kernel: one launch, ℓ. Its reductions are fused into that kernel: a step reads the received
slice and the device's own and writes the sum, the same (inputs + 1) = 3 bytes per reduced byte
at the memory rate m that einsummable's folds are charged (`replay.py`), pipelined slice by
slice with the sends, so the slower of the two sets the pace. A device reduces R = (N−1)/N · B
bytes in a reduce-scatter or an all-reduce (none in the other collectives):

    with_kernel(t) = ℓ + max(t, 3 R / m)

On the shipped machines the links are the slower (V100: 3 / 900 GB/s per byte against 1 / 150
GB/s), so only ℓ shows. The block baselines (`simulated.py`) pass no kernel: their collectives
stay as costed there.

**vLLM's custom all-reduce** (csrc/custom_all_reduce.cuh and
vllm/distributed/device_communicators/custom_all_reduce.py in vllm-project/vllm): used
inside one node only, for 2, 4, 6 or 8 devices, where there are two of them or every pair is
linked directly (NVLink), for messages under 8 MiB whose size is a multiple of 16 bytes;
otherwise vLLM calls NCCL. Its kernels read the peers' buffers over NVLink (b_in: a device's
ingress rate over its direct links, the smallest over the group):

    one-shot (N = 2, or N ≤ 4 and B < 512 KiB, or N ≤ 8 and B < 256 KiB):
        (N−1) · B / (f_p2p b_in) + α       each rank reads every peer's whole buffer
    two-shot otherwise:
        2 (N−1)/N · B / (f_p2p b_in) + 2α  reduce-scatter, then all-gather, by peer reads
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from einsummable.planning.kernel_time import memory_rate
from einsummable.planning.rings import RING_SEARCH_MAX_DEVICES, Ring, dedicated, greedy_rings
from einsummable.topology import Topology

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ring_pass", "broadcast")

# nccl-tests all-reduce on 8 x A100 SXM over NVSwitch: bus bandwidth about 200-230 GB/s for
# large messages against the 300 GB/s per direction of the datasheet (ANCHORS.md, "Realism";
# NVIDIA/nccl-tests issue #149 reports ~200 GB/s). The midpoint, 215 GB/s, as a fraction.
# No published figure for V100 or H100 NVLink is in ANCHORS.md: the same fraction is assumed.
NVLINK_BUSBW_FRACTION = 215e9 / 300e9
# nccl-tests all-reduce across 3 nodes of 8 x A100 with 4 x HDR (200 Gb/s) NICs each: about
# 85-96 GB/s bus bandwidth against 100 GB/s theoretical (ANCHORS.md; nccl-tests issue #119).
NETWORK_BUSBW_FRACTION = 90.5e9 / 100e9
# CUDA's p2pBandwidthLatencyTest on the same 8 x A100 machine: 430-520 GB/s bidirectional,
# 215-260 GB/s per direction against 300 (ANCHORS.md, the nccl-tests #149 report): the rate
# of peer reads and writes, which vLLM's custom all-reduce kernels are.
NVLINK_P2P_FRACTION = (430e9 + 520e9) / 4 / 300e9

# vLLM's custom all-reduce (vllm-project/vllm, custom_all_reduce.py and .cuh): its buffer
# size (messages at or above it go to NCCL), the world sizes it supports, the alignment it
# needs, and the sizes under which its kernel reads whole buffers in one stage.
VLLM_CUSTOM_AR_MAX_BYTES = 8192 * 1024
VLLM_CUSTOM_AR_WORLDS = (2, 4, 6, 8)
VLLM_CUSTOM_AR_ALIGN = 16
VLLM_ONE_SHOT_BYTES = {4: 512 * 1024, 8: 256 * 1024}  # largest world -> below this, one-shot

# A fused reduction step reads its two inputs and writes the sum (a fold's inputs + 1).
FOLD_TOUCHES = 3


@dataclass(frozen=True)
class Kernel:
    """One NCCL kernel on the group's slowest device: its launch and the memory rate its
    fused reductions read and write at (module docstring, *The kernel*)."""
    launch_s: float
    memory_bw: float


def kernel_of(topology: Topology, group: Sequence[int] | None = None) -> Kernel:
    """The `Kernel` of `group` (default: every device): the largest launch and the lowest
    achieved memory rate among its devices (`kernel_time.memory_rate`)."""
    devices = [topology.devices[d] for d in (range(topology.world_size) if group is None
                                              else group)]
    return Kernel(max(d.launch_s for d in devices), min(memory_rate(d) for d in devices))


@dataclass(frozen=True)
class Rates:
    """Achieved fractions of the modelled rates (see the module docstring)."""
    nvlink: float
    network: float
    p2p: float

    def __post_init__(self) -> None:
        for name in ("nvlink", "network", "p2p"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"Rates.{name}={v!r}: an achieved fraction is in (0, 1]")


ACHIEVED = Rates(NVLINK_BUSBW_FRACTION, NETWORK_BUSBW_FRACTION, NVLINK_P2P_FRACTION)
PEAK = Rates(1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Fabric:
    """What NCCL sees of a group: rings per node, bus bandwidth, NICs.

    nodes: the group's devices per node. rings: the rings of the slowest node (empty where the
    fallback ring is used). bus_bw: b_bus of the slowest node. latency_s: the largest arc
    latency of those rings. nic_bw / net_latency_s: a device's NIC rate and the largest
    cross-node latency (None / 0 on one node). ingress_bw: the smallest per-device ingress
    rate over direct dedicated links (vLLM's peer reads). fully_connected: every pair of the
    group on one node linked directly by a dedicated link."""
    devices: tuple[int, ...]
    nodes: tuple[tuple[int, ...], ...]
    rings: tuple[Ring, ...]
    bus_bw: float
    latency_s: float
    nic_bw: float | None
    net_latency_s: float
    ingress_bw: float
    fully_connected: bool
    cut_pair_bw: float = math.inf  # all-to-all: min over X of cap(into X) / (|X| (L - |X|))

    @property
    def size(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        how = (f"{len(self.rings)} ring(s) over dedicated links" if self.rings
               else "one ring over routes (no dedicated ring)")
        text = f"{how}, bus {self.bus_bw / 1e9:.0f} GB/s per node"
        if self.nic_bw is not None:
            text += (f"; {len(self.nodes)} nodes x {len(self.nodes[0])}, "
                     f"NIC {self.nic_bw / 1e9:.0f} GB/s per device")
        return text


# ------------------------------------------------------------------------------ the fabric

def fabric(topology: Topology, group: Sequence[int] | None = None) -> Fabric:
    """The fabric of `group` (default: every device) on `topology`."""
    devices = tuple(range(topology.world_size)) if group is None else tuple(group)
    if not devices or len(set(devices)) != len(devices):
        raise ValueError(f"collective group {devices!r}: give distinct device ids, at least one")
    for d in devices:
        if not (isinstance(d, int) and 0 <= d < topology.world_size):
            raise ValueError(f"collective group: device {d!r} is not in topology "
                             f"'{topology.name}' (0..{topology.world_size - 1})")
    by_node: dict[int, list[int]] = {}
    for d in devices:
        by_node.setdefault(topology.node_of(d), []).append(d)
    nodes = tuple(tuple(v) for _, v in sorted(by_node.items()))
    if len({len(n) for n in nodes}) != 1:
        raise ValueError(f"collective group {devices!r}: nodes hold different numbers of its "
                         "devices; the hierarchical model needs equal parts")
    per_node = [_node_rings(topology, n) for n in nodes]
    rings, bus_bw, latency = min(per_node, key=lambda r: r[1])
    nic_bw, net_lat = (_nics(topology, devices) if len(nodes) > 1 else (None, 0.0))
    full = all(dedicated(topology, a, b) is not None
               for n in nodes for a in n for b in n if a != b)
    ingress = min((_ingress(topology, d, n) for n in nodes for d in n), default=math.inf)
    cut = min((_cut_pair_bw(topology, n) for n in nodes), default=math.inf)
    return Fabric(devices, nodes, rings, bus_bw, latency, nic_bw, net_lat, ingress, full, cut)


def _cut_pair_bw(topology: Topology, devs: tuple[int, ...]) -> float:
    """The least, over the sets X of a node's devices, of the link capacity from the rest
    into X (each medium once) per pair of devices across the cut: an all-to-all moves
    |X| (L - |X|) B / N^2 bytes into X, so it takes at least B / N^2 over this rate."""
    if not 2 <= len(devs) <= RING_SEARCH_MAX_DEVICES:
        return math.inf
    best = math.inf
    for mask in range(1, 2 ** len(devs) - 1):
        x = {d for i, d in enumerate(devs) if mask >> i & 1}
        media: dict[str, float] = {}
        for a in devs:
            for b in x:
                link = topology.link(a, b) if a not in x else None
                if link is not None:
                    media[link.resource] = max(media.get(link.resource, 0.0), link.bw)
        best = min(best, sum(media.values()) / (len(x) * (len(devs) - len(x))))
    return best


def _node_rings(topology: Topology, devs: tuple[int, ...]) -> tuple[tuple[Ring, ...], float, float]:
    """(rings, b_bus, latency) inside one node's part of the group."""
    if len(devs) == 1:
        return (), math.inf, 0.0
    if len(devs) > RING_SEARCH_MAX_DEVICES:
        switch = _switch_rate(topology, devs)
        if switch is not None:
            lat = max(topology.link(a, b).latency_s for a in devs for b in devs if a != b)
            return (Ring(devs, switch),), switch, lat
        return _fallback_ring(topology, devs)
    rings = greedy_rings(topology, devs)
    if not rings:
        return _fallback_ring(topology, devs)
    lat = max(topology.link(r.devices[i], r.devices[(i + 1) % len(r.devices)]).latency_s
              for r in rings for i in range(len(r.devices)))
    return rings, sum(r.bw for r in rings), lat


def _switch_rate(topology: Topology, devs: tuple[int, ...]) -> float | None:
    """Every pair linked by a dedicated link on a per-device port: the smallest port rate."""
    rates = []
    for a in devs:
        for b in devs:
            if a == b:
                continue
            link = topology.link(a, b)
            if link is None or link.shared is not None or link.port_bw is None:
                return None
            rates.append(min(link.bw, link.port_bw))
    return min(rates)


def _fallback_ring(topology: Topology, devs: tuple[int, ...]) -> tuple[tuple[Ring, ...], float, float]:
    """No ring over dedicated links: one ring in device order over the routes (PCIe)."""
    hops = [(devs[i], devs[(i + 1) % len(devs)]) for i in range(len(devs))]
    bw = min(topology.path_bw(a, b) for a, b in hops)
    lat = max(topology.path_latency(a, b) for a, b in hops)
    return (), bw, lat


def _nics(topology: Topology, devices: tuple[int, ...]) -> tuple[float, float]:
    """(a device's NIC rate, the largest cross-node latency): each device's rate is the
    smallest of its cross-node links' rates and ports, divided among the devices whose
    cross-node links share the same medium (a NIC serving several GPUs); the smallest over
    the group."""
    sharers: dict[str, set[int]] = {}
    cross = []
    for a in devices:
        for b in devices:
            if topology.node_of(a) == topology.node_of(b):
                continue
            link = topology.link(a, b)
            if link is None:
                raise ValueError(f"topology '{topology.name}': devices {a} and {b} on "
                                 "different nodes have no direct link; no NIC to cost")
            cross.append(link)
            if link.shared is not None:
                sharers.setdefault(link.shared, set()).add(a)
    rate: dict[int, float] = {}
    for link in cross:
        r = min(link.bw, link.port_bw or math.inf)
        if link.shared is not None:
            r /= len(sharers[link.shared])
        rate[link.src] = min(rate.get(link.src, math.inf), r)
    return min(rate.values()), max(link.latency_s for link in cross)


def _ingress(topology: Topology, d: int, node: tuple[int, ...]) -> float:
    """What device d can read from its node's peers at once over direct dedicated links."""
    links = [topology.link(p, d) for p in node if p != d]
    links = [l for l in links if l is not None and l.shared is None]
    if not links:
        return 0.0
    total = sum(l.bw for l in links)
    ports = {l.port_bw for l in links if l.port_bw is not None}
    return min([total, *ports])


# ------------------------------------------------------------------------------- the times

def collective_time(kind: str, nbytes: float, fab: Fabric, rates: Rates = ACHIEVED,
                    kernel: Kernel | None = None) -> float:
    """Seconds NCCL takes for one collective of `nbytes` on the fabric (module docstring),
    with `kernel` its launch and fused reductions too (*The kernel*)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}: use one of {', '.join(KINDS)}")
    if nbytes < 0:
        raise ValueError(f"collective of {nbytes} bytes: the size cannot be negative")
    n = fab.size
    if n == 1 or nbytes == 0:
        return 0.0
    t = _flat(kind, nbytes, fab, rates)
    if len(fab.nodes) > 1 and kind != "broadcast":  # NCCL broadcasts down its rings
        t = min(t, _hierarchical(kind, nbytes, fab, rates))
    if kernel is None:
        return t
    reduced = (n - 1) / n * nbytes if kind in ("reduce_scatter", "all_reduce") else 0.0
    return kernel.launch_s + max(t, FOLD_TOUCHES * reduced / kernel.memory_bw)


def _flat(kind: str, nbytes: float, fab: Fabric, rates: Rates) -> float:
    n = fab.size
    bw = rates.nvlink * fab.bus_bw
    lat = fab.latency_s
    if fab.nic_bw is not None:
        per_node = len(fab.nodes[0])
        bw = min(bw, rates.network * per_node * fab.nic_bw)
        lat = max(lat, fab.net_latency_s)
    if kind == "all_to_all" and fab.nic_bw is not None:
        return _all_to_all_nodes(nbytes, fab, rates)
    share = (n - 1) / n
    if kind == "broadcast":  # pipelined down the ring: every device receives it all once
        return nbytes / bw + (n - 1) * lat
    if kind == "all_reduce":
        return 2 * share * nbytes / bw + 2 * (n - 1) * lat
    if kind == "all_to_all":  # no faster than the fabric's narrowest cut allows
        return max(share * nbytes / n / bw, nbytes / n ** 2 / fab.cut_pair_bw) + (n - 1) * lat
    return share * nbytes / bw + (n - 1) * lat


def _hierarchical(kind: str, nbytes: float, fab: Fabric, rates: Rates) -> float:
    per, m = len(fab.nodes[0]), len(fab.nodes)
    if kind == "all_to_all":
        return _all_to_all_nodes(nbytes, fab, rates)
    intra = (per - 1) / per * nbytes / (rates.nvlink * fab.bus_bw) if per > 1 else 0.0
    inter = (m - 1) / m * (nbytes / per) / (rates.network * fab.nic_bw)
    lat = (per - 1) * fab.latency_s + (m - 1) * fab.net_latency_s
    phases = 2 if kind == "all_reduce" else 1
    return phases * (intra + inter + lat)


def _all_to_all_nodes(nbytes: float, fab: Fabric, rates: Rates) -> float:
    n, per, m = fab.size, len(fab.nodes[0]), len(fab.nodes)
    intra = (per - 1) * nbytes / n ** 2 / (rates.nvlink * fab.bus_bw) if per > 1 else 0.0
    inter = (n - per) * nbytes / n ** 2 / (rates.network * fab.nic_bw)
    return max(intra, inter) + (per - 1) * fab.latency_s + (m - 1) * fab.net_latency_s


def vllm_custom_allreduce_eligible(nbytes: float, fab: Fabric) -> bool:
    """Whether vLLM takes its own all-reduce kernel rather than NCCL (module docstring)."""
    n = fab.size
    return (len(fab.nodes) == 1 and n in VLLM_CUSTOM_AR_WORLDS
            and (n == 2 or fab.fully_connected) and fab.ingress_bw > 0
            and nbytes < VLLM_CUSTOM_AR_MAX_BYTES and nbytes % VLLM_CUSTOM_AR_ALIGN == 0)


def vllm_all_reduce(nbytes: float, fab: Fabric, rates: Rates = ACHIEVED) -> tuple[float, str]:
    """(seconds, algorithm) of one all-reduce as vLLM runs it: its custom kernel (one-shot or
    two-shot) where eligible, else NCCL."""
    n = fab.size
    if n == 1 or nbytes == 0:
        return 0.0, "none"
    if not vllm_custom_allreduce_eligible(nbytes, fab):
        return collective_time("all_reduce", nbytes, fab, rates), "nccl"
    bw = rates.p2p * fab.ingress_bw
    one_shot = n == 2 or any(n <= world and nbytes < limit
                             for world, limit in sorted(VLLM_ONE_SHOT_BYTES.items()))
    if one_shot:
        return (n - 1) * nbytes / bw + fab.latency_s, "one-shot"
    return 2 * (n - 1) / n * nbytes / bw + 2 * fab.latency_s, "two-shot"


def bus_bandwidth(kind: str, nbytes: float, fab: Fabric, rates: Rates = ACHIEVED) -> float:
    """nccl-tests' bus bandwidth of the modelled time: algbw = B / t, times 2(N−1)/N for an
    all-reduce and (N−1)/N for the gathers and scatters (so it compares with link rates)."""
    t = collective_time(kind, nbytes, fab, rates)
    n = fab.size
    factor = {"all_reduce": 2 * (n - 1) / n}.get(kind, (n - 1) / n)
    return nbytes / t * factor if t > 0 else math.inf
