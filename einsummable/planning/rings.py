r"""Rings over a mesh: copies and partial-sum folds pipelined round directed cycles of direct
links, several at once, the way NCCL's channels use a fabric whose links differ.

Why. On a mesh without every link (the DGX-1 hybrid cube) the plain program relays unlinked
pairs over a few lanes, and packed trees grown greedily send early chunks out of a holder
several times. A directed Hamiltonian cycle over dedicated links moves a block from each
device to the next one: every arc carries each byte once, every device receives each byte once.
Several cycles packed against the links' capacities use every lane at once, and the bytes a
device receives over its ports are the bandwidth bound.

Math. *Packing.* Each arc (a -> b) has capacity c_ab (its lanes' rate), each device port p its
rate c_p. Take the directed Hamiltonian cycle whose bottleneck of remaining capacity (over its
arcs and the egress and ingress ports it passes) is largest; it carries that bottleneck w_r;
take w_r off every arc and port it uses; repeat until no cycle has capacity left. The rings
R = {(cycle_r, w_r)} together carry Σ w_r per device (the DGX-1V: two rings of 50 GB/s over
the doubled links, two of 25, the 150 GB/s of a V100's six lanes).

*Copy.* A block X that readers D need, held by H, is cut into m row-major parts (m from the
transfer budget and CHUNK_BYTES), and each part into one consecutive piece per ring r of
|part| w_r / Σ w bytes, so every ring carries its rate's share of every block and the rings
finish together. (Where the budget allows no piece per ring, as when the blocks are the many
pieces a fold left, a block goes whole to the ring r that minimises (L_r + |X|) / w_r, L_r
the bytes r has so far.) Round its cycle, every reader is served by the holder that precedes it most
closely (walking back from the reader); a holder sends the piece to the next reader on the
cycle, which forwards it to the next, until the last reader it serves (devices between two
readers relay it within one transfer). With pieces in flight on every arc this is the ring
all-gather (each arc carries (|D| - 1) / |D| of the bytes) and the pipelined ring broadcast.

*Fold.* A chunk x reduced at r from one holder per slice: x is cut into pieces the same way;
the holders of a piece are visited round its ring in cycle order ending at r; the first sends
its partial to the next, each folds what arrived with its own and sends the sum on, r folds
last (the ring reduce-scatter: each arc carries every piece of every chunk at most once).
A device runs its steps in program order, which is round order, sends before folds: folding
a piece in the round it arrives would put every fold between that round's transfers and the
next round's sends (transfer, fold, transfer: 2.49 ms for 256 MiB on the DGX-1). So a piece
is folded FOLD_LAG rounds after it arrives, and part j's chain starts in round j: in each
round a device sends one part on while it folds the other, which arrived the round before
(1.73 ms; the lanes alone take 1.57).

The programs are plain transfers and reduces: lowering, the replay and the simulator run
them as any other exchange. `exchange.synthesize` builds them beside the other programs where
the exchange's devices form a mesh (`mesh_rings`) and keeps the fastest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..core.geometry import Region, volume
from .trees import CHUNK_BYTES, TRANSFER_BUDGET, _groups, _stitch_all, chunks

# Device sets up to this size are searched for cycles exactly (a depth-first search with
# branch and bound); larger ones get no rings.
RING_SEARCH_MAX_DEVICES = 10
# Rounds between a piece's arrival and its fold (module docstring, *Fold*).
FOLD_LAG = 1
# A cycle whose bottleneck is below this fraction of the largest arc rate carries nothing.
CAPACITY_EPS = 1e-9


@dataclass(frozen=True)
class Ring:
    devices: tuple[int, ...]  # the cycle, first device not repeated
    bw: float                 # B/s this ring carries


def dedicated(topology, a: int, b: int):
    """The direct link a -> b on no shared medium (an NVLink lane, a switch port), or None."""
    link = topology.link(a, b)
    return link if link is not None and link.shared is None else None


def greedy_rings(topology, devs: Sequence[int]) -> tuple[Ring, ...]:
    """The packing of the module docstring over the dedicated links among `devs`."""
    devs = tuple(devs)
    cap: dict[tuple[int, int], float] = {}
    port_out: dict[tuple[int, str], float] = {}
    port_in: dict[tuple[int, str], float] = {}
    port_of: dict[tuple[int, int], str | None] = {}
    for a in devs:
        for b in devs:
            link = dedicated(topology, a, b) if a != b else None
            if link is None:
                continue
            cap[(a, b)] = link.bw
            port_of[(a, b)] = link.port
            if link.port is not None and link.port_bw is not None:
                port_out[(a, link.port)] = link.port_bw
                port_in[(b, link.port)] = link.port_bw
    if not cap or len(devs) < 2:
        return ()
    eps = CAPACITY_EPS * max(cap.values())

    def room(a: int, b: int) -> float:
        c = cap.get((a, b), 0.0)
        p = port_of.get((a, b))
        if p is not None:
            c = min(c, port_out.get((a, p), math.inf), port_in.get((b, p), math.inf))
        return c

    rings: list[Ring] = []
    while True:
        best = _best_cycle(devs, room)
        if best is None or best[1] <= eps:
            return tuple(rings)
        cycle, bw = best
        rings.append(Ring(cycle, bw))
        for i, a in enumerate(cycle):
            b = cycle[(i + 1) % len(cycle)]
            cap[(a, b)] -= bw
            p = port_of[(a, b)]
            if p is not None:
                if (a, p) in port_out:
                    port_out[(a, p)] -= bw
                if (b, p) in port_in:
                    port_in[(b, p)] -= bw


def _best_cycle(devs: tuple[int, ...], room) -> tuple[tuple[int, ...], float] | None:
    """The directed Hamiltonian cycle from devs[0] with the largest bottleneck room (branch
    and bound: a partial path whose bottleneck cannot beat the best is cut). Ties go to the
    lexicographically first cycle, so the rings are deterministic."""
    start = devs[0]
    best: list = [None, 0.0]

    def extend(path: list[int], left: set[int], bottleneck: float) -> None:
        if bottleneck <= best[1]:
            return
        last = path[-1]
        if not left:
            close = min(bottleneck, room(last, start))
            if close > best[1]:
                best[0], best[1] = tuple(path), close
            return
        for nxt in sorted(left):
            r = room(last, nxt)
            if r > best[1]:
                left.remove(nxt)
                path.append(nxt)
                extend(path, left, min(bottleneck, r))
                path.pop()
                left.add(nxt)

    extend([start], set(devs[1:]), math.inf)
    return None if best[0] is None else (best[0], best[1])


def is_mesh(topology, devs: Sequence[int]) -> bool:
    """Whether `devs` form a mesh: every pair joined by dedicated links, directly or through
    one other device, and some pair not by one link of its port's full rate (on a switch
    every pair is, and direct sends already reach the bound; links on shared media, PCIe
    or NICs, are no mesh). Memoised per topology instance."""
    devs = tuple(sorted(set(devs)))
    cache = getattr(topology, "_cache", None)
    memo = cache.setdefault("is-mesh", {}) if isinstance(cache, dict) else {}
    if devs not in memo:
        memo[devs] = _is_mesh(topology, devs)
    return memo[devs]


def _is_mesh(topology, devs: tuple[int, ...]) -> bool:
    n = topology.world_size
    near = [{b for b in range(n) if b != a and dedicated(topology, a, b) is not None}
            for a in range(n)]
    joined = all(b in near[a] or near[a] & {m for m in range(n) if b in near[m]}
                 for a in devs for b in devs if a != b)
    switch = all((link := dedicated(topology, a, b)) is not None
                 and link.port_bw is not None and link.bw >= link.port_bw
                 for a in devs for b in devs if a != b)
    return len(devs) >= 2 and joined and not switch


def mesh_rings(topology, devs: Sequence[int]) -> tuple[Ring, ...]:
    """The rings an exchange among `devs` may use: the packing where the devices are three or
    more and form a mesh (`is_mesh`), else none. Memoised per topology instance."""
    devs = tuple(sorted(set(devs)))
    cache = getattr(topology, "_cache", None)
    memo = cache.setdefault("mesh-rings", {}) if isinstance(cache, dict) else {}
    if devs not in memo:
        small = 3 <= len(devs) <= RING_SEARCH_MAX_DEVICES
        memo[devs] = greedy_rings(topology, devs) if small and is_mesh(topology, devs) else ()
    return memo[devs]


class _Loads:
    """Bytes given to each ring so far; a whole block goes to the ring it would finish first
    on (where the budget allows no piece per ring)."""

    def __init__(self, rings: tuple[Ring, ...]) -> None:
        self.rings = rings
        self.bytes = [0.0] * len(rings)

    def take(self, nbytes: float) -> int:
        i = min(range(len(self.rings)),
                key=lambda k: ((self.bytes[k] + nbytes) / self.rings[k].bw, k))
        self.bytes[i] += nbytes
        return i


def _weighted(x: Region, weights: Sequence[float]) -> list[tuple[Region, int]]:
    """x cut along its outermost dim longer than one into consecutive ranges in proportion to
    `weights` (a range per weight, empty ones dropped): (range, its weight's index)."""
    dim = next((i for i, (lo, hi) in enumerate(x) if hi - lo > 1), None)
    if dim is None:
        return [(x, max(range(len(weights)), key=lambda k: (weights[k], -k)))]
    lo, hi = x[dim]
    total, acc, at = sum(weights), 0.0, lo
    out = []
    for k, w in enumerate(weights):
        acc += w
        end = lo + round((hi - lo) * acc / total)
        if end > at:
            out.append((x[:dim] + ((at, end),) + x[dim + 1:], k))
            at = end
    return out


def _pieces(x: Region, nbytes: float, budget: int, loads: _Loads) -> list[tuple[Region, int]]:
    """x as (piece, ring index): with a budget of at least a piece per ring, m consecutive
    parts (CHUNK_BYTES or more per ring piece), each cut among the rings in proportion to
    their rates, so every ring carries its share of every block; with less, x whole on the
    ring it would finish first on."""
    rings = loads.rings
    if budget < len(rings) or nbytes < CHUNK_BYTES:
        return [(x, loads.take(nbytes))]
    m = max(1, min(budget // len(rings), int(nbytes // (CHUNK_BYTES * len(rings)))))
    weights = [r.bw for r in rings]
    return [piece for part in chunks(x, m) for piece in _weighted(part, weights)]


def _arc_path(cycle: tuple[int, ...], a: int, b: int) -> tuple[int, ...]:
    """The devices from a forward round the cycle to b, both included."""
    n = len(cycle)
    i, j = cycle.index(a), cycle.index(b)
    return tuple(cycle[(i + k) % n] for k in range((j - i) % n + 1))


def ring_copy(b, sources: Sequence[tuple[Region, int, int]],
              needs: Sequence[tuple[Region, int]]) -> bool:
    """Deliver every need from full `sources` (region, device, ready round) round the rings
    (module docstring, *Copy*), emitting transfers and stitches on the synthesis `b`.
    Returns False, emitting nothing, where the exchange's devices have no rings."""
    devs = {d for _, d, _ in sources} | {d for _, d in needs}
    rings = mesh_rings(b.topo, devs)
    if not rings:
        return False
    holders, groups, parts = _groups(sources, needs)
    loads = _Loads(rings)
    budget = TRANSFER_BUDGET // max(1, (len(devs) - 1) * len(groups))
    cut = {c: _pieces(c, volume(c) * b.elem, budget, loads) for c in groups}
    for j in range(max((len(p) for p in cut.values()), default=0)):
        for c, (reg, readers) in groups.items():
            if j >= len(cut[c]):
                continue
            piece, ring = cut[c][j]
            cycle = rings[ring].devices
            ready = dict(holders[reg])
            own = set(ready)
            wanted = {d for _, d in readers}
            for d in _ring_order(cycle, ready, wanted):
                src = _serving(cycle, d, ready)
                ready[d] = b.send(src, d, piece, ready[src], hops=_arc_path(cycle, src, d),
                                  within=reg if src in own else None)
            for q, d in readers:
                parts[(q, d)].append((piece, True))
    _stitch_all(b, parts)
    return True


def _ring_order(cycle: tuple[int, ...], held: dict[int, int], wanted: set[int]) -> list[int]:
    """The readers in the order they are reached: round the cycle from each holder."""
    n = len(cycle)
    start = min(cycle.index(h) for h in held)
    return [cycle[(start + k) % n] for k in range(n) if cycle[(start + k) % n] in wanted
            and cycle[(start + k) % n] not in held]


def _serving(cycle: tuple[int, ...], d: int, held: dict[int, int]) -> int:
    """The device holding the piece that precedes d most closely round the cycle."""
    n = len(cycle)
    i = cycle.index(d)
    return next(cycle[(i - k) % n] for k in range(1, n + 1) if cycle[(i - k) % n] in held)


def ring_fold(b, x: Region, r: int, holders: dict[int, list[int]], block: Region,
              n_chunks: int) -> list[tuple[Region, int]] | None:
    """Fold the partial slices of `x` (cut from `block`, slice -> holders) at r round the
    rings (module docstring, *Fold*); `n_chunks`: how many chunks the exchange folds (the
    transfer budget is theirs to share). Returns (piece, round its full value is ready at r)
    per piece, or None where the holders and r have no rings."""
    chosen: dict[int, list[int]] = {}
    for s in sorted(holders):
        h = min(holders[s], key=lambda dev: (b.dist(dev, r), dev))
        chosen.setdefault(h, []).append(s)
    rings = mesh_rings(b.topo, set(chosen) | {r})
    if not rings:
        return None
    loads = _schedule_loads(b, rings)
    budget = TRANSFER_BUDGET // max(1, len(chosen) * n_chunks)
    out = []
    for i, (piece, ring) in enumerate(_pieces(x, volume(x) * b.elem, budget, loads)):
        j = i // len(rings)  # its part: part j chain starts in round j
        cycle = rings[ring].devices
        at = cycle.index(r)
        order = [cycle[(at + k) % len(cycle)] for k in range(1, len(cycle) + 1)]
        order = [d for d in order if d in chosen or d == r]
        sent = None  # what the last device sends on: (slices, ready round, its own partial?)
        prev = r
        for dev in order:
            inputs = [((s,), j - 1) for s in chosen.get(dev, [])]
            if sent is not None:
                ss, rnd, own = sent
                arrived = b.send(prev, dev, piece, rnd, ss, hops=_arc_path(cycle, prev, dev),
                                 within=block if own else None)
                # folded a round after it arrives: the device folds what came in the round
                # before while this round's sends move (module docstring)
                inputs.append((ss, arrived + FOLD_LAG))
            if dev == r:
                out.append((piece, b.reduce(r, piece, inputs, ())))
                break
            if sent is None and len(inputs) == 1:  # its one partial, sent from the block
                sent = (inputs[0][0], j - 1, True)
            else:
                ss = tuple(sorted(s for slices, _ in inputs for s in slices))
                sent = (ss, b.reduce(dev, piece, inputs, ss), False)
            prev = dev
    return out


def _schedule_loads(b, rings: tuple[Ring, ...]) -> _Loads:
    """The synthesis' one ring loads for its folds: every chunk's pieces see the others'."""
    loads = getattr(b, "ring_loads", None)
    if loads is None or loads.rings != rings:
        loads = b.ring_loads = _Loads(rings)
    return loads









