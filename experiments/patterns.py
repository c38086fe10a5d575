"""Collective patterns as exchanges: einsummable's synthesised programs against NCCL's modelled
algorithms and the fabric's bandwidth bound (`einsummable-bench exchange_patterns`).

Each pattern is one exchange of a row-major [rows, 4096] tensor of the given bytes among every
device of the topology, stated as a producer layout and the needs of its readers:

    all_gather      each device holds 1/N of the rows; every device needs all of them
    reduce_scatter  each device holds a partial sum of all of it; device d needs row block d
    all_reduce      each device holds a partial sum of all of it; every device needs all
    broadcast       device 0 holds all of it; every device needs all
    all_to_all      device i holds row block i; device d needs column block d of every row

Three figures per pattern and size, all simulated at the topology file's link rates:
- einsummable: `exchange.synthesize` then `timing.exchange_time`, the program lowering emits,
  replayed on the simulator's network (what every plan's price is made of);
- NCCL: `collectives.collective_time` at the links' full rates (`PEAK`: the same rates the
  exchange gets; the achieved-fraction model is for the baselines of the block tables), the
  best of its ring and hierarchical forms, with its kernel's launch and its fused reductions
  at the memory rate einsummable's folds run at (`collectives.kernel_of`): the launch and the
  fold bytes einsummable's programs are charged, NCCL's charged too (since 2026-12-07); for
  the all-to-all also the senders' pack (`pack_s`): the column blocks a device sends are
  strided in its rows, and NCCL sends contiguous buffers, so the caller packs them first, as
  the gloo bench packs before `all_to_all_single` and einsummable's senders pack;
- bound: the bytes a device must receive over its ports' ingress capacity, and where the
  topology has several nodes the bytes a node must receive over its NICs (`bandwidth_bound`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from einsummable.frontend.ir import DTYPE_BYTES, TensorInfo
from einsummable.planning.bound import capacity_into
from einsummable.planning.exchange import synthesize
from einsummable.planning.placement import Piece
from einsummable.planning.timing import exchange_time

from .collectives import PEAK, collective_time, fabric, kernel_of

PATTERNS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")
COLUMNS = 4096  # the tensor's inner extent: rows of 8 KiB in fp16


@dataclass(frozen=True)
class Pattern:
    info: TensorInfo
    produced: tuple[Piece, ...]
    needs: tuple[tuple[tuple, int], ...]
    agg: str | None


def _block(extent: int, parts: int, i: int) -> tuple[int, int]:
    return extent * i // parts, extent * (i + 1) // parts


def pattern(kind: str, world: int, nbytes: int, dtype: str = "float16") -> Pattern:
    """The exchange of `kind` (module docstring) on `world` devices, about `nbytes` in all."""
    rows = max(world, nbytes // (COLUMNS * DTYPE_BYTES[dtype]))
    info = TensorInfo("x", (rows, COLUMNS), dtype)
    full = ((0, rows), (0, COLUMNS))
    devices = range(world)
    row_block = lambda d: (_block(rows, world, d), (0, COLUMNS))  # noqa: E731
    if kind == "all_gather":
        return Pattern(info, tuple(Piece(row_block(d), d, 0, 1) for d in devices),
                       tuple((full, d) for d in devices), None)
    if kind in ("reduce_scatter", "all_reduce"):
        partials = tuple(Piece(full, d, d, world) for d in devices)
        needs = tuple((row_block(d) if kind == "reduce_scatter" else full, d) for d in devices)
        return Pattern(info, partials, needs, "sum")
    if kind == "broadcast":
        return Pattern(info, (Piece(full, 0, 0, 1),), tuple((full, d) for d in devices), None)
    if kind == "all_to_all":
        return Pattern(info, tuple(Piece(row_block(d), d, 0, 1) for d in devices),
                       tuple((((0, rows), _block(COLUMNS, world, d)), d) for d in devices), None)
    raise ValueError(f"unknown pattern {kind!r}: use one of {', '.join(PATTERNS)}")


# Bytes a device must receive, as a multiple of the tensor's bytes S, on N devices (the
# standard bounds: an all-reduce receives its reduce-scatter's share and its all-gather's).
def _device_share(kind: str, n: int) -> float:
    return {"all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_reduce": 2 * (n - 1) / n, "broadcast": 1.0,
            "all_to_all": (n - 1) / n ** 2}[kind]


def ingress(topology, device: int) -> float:
    """Bytes/s `device` can receive at once: over its links, each distinct medium or port once."""
    media: dict[str, float] = {}
    for other in range(topology.world_size):
        link = topology.link(other, device) if other != device else None
        if link is None:
            continue
        if link.port is not None and link.port_bw is not None:
            media[link.ingress] = link.port_bw
        else:
            media[link.resource] = link.bw
    return sum(media.values())


# Cuts of every device set are enumerated up to this many devices (2^(n-1) sets).
CUT_SEARCH_MAX_DEVICES = 12


def _cut_share(kind: str, k: int, n: int, holds_root: bool) -> float:
    """Bytes (as a multiple of S) that must enter a set of k of the n devices from the
    others: what it needs and no member holds (partial sums pre-folded outside)."""
    return {"all_gather": (n - k) / n, "reduce_scatter": k / n, "all_reduce": 1.0,
            "broadcast": 0.0 if holds_root else 1.0, "all_to_all": k * (n - k) / n ** 2}[kind]


def cut_bound(kind: str, nbytes: float, topology) -> float:
    """The largest over device sets X (every proper subset, up to CUT_SEARCH_MAX_DEVICES
    devices) of the bytes X must receive over the capacity of the links into it
    (`bound.capacity_into`): on the DGX-1 cube an all-to-all is bound by the six lanes
    between its two quads, not by each GPU's ingress."""
    n = topology.world_size
    if n > CUT_SEARCH_MAX_DEVICES or n < 2:
        return 0.0
    best = 0.0
    for mask in range(1, 2 ** n - 1):
        x = frozenset(d for d in range(n) if mask >> d & 1)
        cap = capacity_into(topology, x)
        need = _cut_share(kind, len(x), n, 0 in x) * nbytes
        if need > 0 and cap > 0:
            best = max(best, need / cap)
    return best


def bandwidth_bound(kind: str, nbytes: float, topology) -> float:
    """Seconds no program can beat: the bytes a device must receive over its ingress, the
    cuts of `cut_bound`, and on several nodes the bytes a node must receive (the same shares
    over M nodes) over the links that enter it from other nodes."""
    n = topology.world_size
    best = max(_device_share(kind, n) * nbytes / ingress(topology, d) for d in range(n))
    best = max(best, cut_bound(kind, nbytes, topology))
    nodes: dict[int, list[int]] = {}
    for d in range(n):
        nodes.setdefault(topology.node_of(d), []).append(d)
    m = len(nodes)
    if m > 1:
        for members in nodes.values():
            into: dict[str, float] = {}
            for d in members:
                for o in range(n):
                    link = topology.link(o, d)
                    if link is not None and topology.node_of(o) != topology.node_of(d):
                        into[link.resource] = link.bw
            best = max(best, _device_share(kind, m) * nbytes / sum(into.values()))
    return best


# A pack copy reads each byte and writes it once.
PACK_TOUCHES = 2


def pack_s(nbytes: float, world: int, kernel) -> float:
    """Seconds a device takes to pack the column blocks of its row block that leave in an
    all-to-all of `nbytes` on `world` devices, contiguous per peer: one copy kernel, reading
    and writing (N - 1)/N of its B / N bytes at the memory rate (`collectives.Kernel`)."""
    return kernel.launch_s + PACK_TOUCHES * (world - 1) / world * nbytes / world \
        / kernel.memory_bw


@dataclass(frozen=True)
class PatternRow:
    kind: str
    nbytes: int
    einsummable_s: float
    nccl_s: float
    bound_s: float
    synth_s: float
    transfers: int


def run_pattern(kind: str, nbytes: int, topology) -> PatternRow:
    p = pattern(kind, topology.world_size, nbytes)
    t0 = time.perf_counter()
    ex = synthesize(p.info, p.produced, p.needs, p.agg, topology)
    seconds = exchange_time(ex, topology)
    synth = time.perf_counter() - t0
    kernel = kernel_of(topology)
    nccl = collective_time(kind, p.info.nbytes, fabric(topology), PEAK, kernel)
    if kind == "all_to_all":
        nccl += pack_s(p.info.nbytes, topology.world_size, kernel)
    return PatternRow(kind, p.info.nbytes, seconds, nccl,
                      bandwidth_bound(kind, p.info.nbytes, topology), synth, len(ex.transfers))


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


# The bar: at and above this size the exchange should be within BOUND_RATIO of the
# bandwidth bound.
LARGE_BYTES = 16 << 20
BOUND_RATIO = 1.15


def runner(cfg: dict, stream=None) -> tuple[list, dict, str]:
    """The `exchange_patterns` config kind: every pattern and size on every topology; (rows,
    extra result fields, the table)."""
    from einsummable.topology import load_topology

    from .harness import Progress, Row
    topologies = cfg.get("topologies", ["a100x8", "dgx1-v100", "h100x8x2"])
    kinds = cfg.get("patterns", list(PATTERNS))
    sizes = [int(s) for s in cfg["sizes"]]
    progress = Progress(len(topologies) * len(kinds) * len(sizes), cfg["name"], stream)
    rows, lines, found = [], [], []
    for tname in topologies:
        topo = load_topology(tname)
        lines.append(f"\n{tname} ({topo.world_size} devices), simulated at the file's link rates")
        lines.append(f"{'pattern':15s} {'size':>9s} {'einsummable':>12s} {'NCCL model':>11s} "
                     f"{'bound':>9s} {'/NCCL':>6s} {'/bound':>7s}")
        for kind in kinds:
            for size in sizes:
                progress.step(f"{tname} {kind} {_size(size)}")
                r = run_pattern(kind, size, topo)
                found.append((tname, r))
                name = f"{tname} {kind} {_size(r.nbytes)}"
                extra = {"topology": tname, "pattern": kind, "bytes": r.nbytes}
                rows.append(Row(cfg["name"], name, "einsummable", topo.world_size,
                                time_s=r.einsummable_s, floor_s=r.bound_s,
                                note=f"{r.transfers} transfers, synthesised and timed in "
                                     f"{r.synth_s:.2f} s", extra=extra))
                rows.append(Row(cfg["name"], name, "nccl-model", topo.world_size,
                                time_s=r.nccl_s, floor_s=r.bound_s,
                                note="NCCL's ring / hierarchical algorithms, modelled at the "
                                     "links' full rates", extra=extra))
                lines.append(f"{kind:15s} {_size(r.nbytes):>9s} {r.einsummable_s * 1e3:10.3f}ms "
                             f"{r.nccl_s * 1e3:9.3f}ms {r.bound_s * 1e3:7.3f}ms "
                             f"{r.einsummable_s / r.nccl_s:6.2f} {r.einsummable_s / r.bound_s:7.2f}")
    summary = {}
    for tname in topologies:
        mine = [r for t, r in found if t == tname]
        large = [r for r in mine if r.nbytes >= LARGE_BYTES]
        summary[tname] = {
            "no_slower_than_nccl": sum(r.einsummable_s <= r.nccl_s for r in mine),
            "rows": len(mine),
            "geomean_over_nccl": geomean(r.einsummable_s / r.nccl_s for r in mine),
            "large_within_bound": sum(r.einsummable_s <= BOUND_RATIO * r.bound_s for r in large),
            "large_rows": len(large),
            "worst_large_over_bound": max((r.einsummable_s / r.bound_s for r in large),
                                          default=float("nan"))}
        s = summary[tname]
        lines.append(f"{tname}: no slower than the NCCL model in {s['no_slower_than_nccl']} of "
                     f"{s['rows']} (geomean {s['geomean_over_nccl']:.3f}); at >= 16 MiB within "
                     f"{BOUND_RATIO}x of the bound in {s['large_within_bound']} of "
                     f"{s['large_rows']} (worst {s['worst_large_over_bound']:.2f}x)")
    return rows, {"patterns": summary}, "\n".join(lines)
