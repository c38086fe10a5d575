"""Exchange synthesis: the exact point-to-point transfers that turn a producer's layout into the
blocks a consumer reads.

Math first. A tensor T is held as *pieces* p = (R_p, d_p, s_p): box R_p ⊂ T on device d_p, and
when the producer split an aggregated mode, slice s_p of S partial results, so that
T[R] = AGG_s T_s[R]. A consumer *need* is (Q, d): box Q on device d. Boxes are products of
half-open intervals, so for boxes A, B:

    A ∩ B = Π_k [max(a_k, b_k), min(a'_k, b'_k))          (empty if any factor is)
    A \\ B = at most 2·rank disjoint boxes (peel B off A one dimension at a time)

*Copy* (S = 1). Deliver Q to d by covering it: keep the uncovered boxes U = {Q}; walk sources
in order of cost to d; for each source box P emit one send of U_i ∩ P per uncovered box it
meets and replace U_i by U_i \\ P. A need already inside a local piece costs nothing. In the
optimized mode a delivered region becomes a source itself (ready after its round), so a block
read by several devices behind a slow link crosses it once and is relayed on the fast side; the
tie-break "earlier ready first" stops relays from forming long chains where links are equal.

*Rails* (optimized mode, machines whose groups of the top level are joined by one link per
device, each its own NIC: `routes.Routes.rails`). A block that crosses the top level straight would
leave by its sender's NIC and enter by its reader's, one NIC each at a fraction of the group's
bandwidth. Instead a large block is cut into one chunk per rail, chunk m relayed
sender -> A_m -> B_m -> reader (A_m, B_m the m-th devices of the two groups) in one round,
and a smaller one takes the sender's own rail hop by hop (sender -> B -> reader, a transfer
per hop, so that the sends of one rail share rounds); the stops in the reader's group keep
what passed them as sources, so the group's other readers gather from the rails' ends. That
program is built beside the plain one and the faster under `exchange_time` is kept: spreading
wins when few devices send across, and costs rounds when every device already does.

*Partial* (S > 1). For every output block B and every distinct needed box X = Q ∩ B with k
readers, X is cut into k chunks, row-major ranges of X where its extents allow (outer dims
into single indices, the next into ranges: no chunk needs packing to be sent, and each lands
in place at the readers; simulated, this took the megatron-tp llama-7b block on a100x8 from
4.48 to 3.94 ms), else along its longest dim, and chunk i is reduced at reader i
(reduce-scatter; with one reader, that reader). For each chunk X and its reducer r, one
holder per slice is chosen (r itself, else the nearest), and the holders are folded level by level of the
topology's hierarchy, slow to fast: holders in other groups of the coarsest level first fold
inside their group to the member nearest r, and only that one value crosses the slow level
(partial sums inside a node first). At the finest level the values travel straight to r and r
folds them in one reduce; a program that cuts each chunk into parts of at least
RANK_REFERENCE_BYTES, folded one after another, is built beside it and the faster kept (r folds
a part while the next arrives: a100x8 64 MiB reduce-scatter 0.257 -> 0.231 ms, all-reduce
0.461 -> 0.419, NCCL's ring modelled at 0.433). The folded X at r is then a full source for
the copy step above, so other readers of X receive it instead of re-reducing.

*Routes and rounds.* A transfer follows topology.route (which relays around missing or slow
links, e.g. the DGX-1 cube mesh); its hops list every device on the way. Transfers are placed
greedily, in dependency order, into the earliest round after their source is ready in which no
link resource on their route is taken by a different route, so no link is oversubscribed;
several pieces on the same route in one round share it as one message batch.

*Flat* (optimized mode, where the plain program relays or the devices form a mesh): every
transfer in the round after its source is ready, a relayed one as a transfer per hop, each a
round after the one it forwards, so a relay receives a round's blocks in one p2p batch and
forwards them in the next (forwarding on arrival opens a batch, a launch, per forward: DGX-1
64 KiB reduce-scatter 0.057 -> 0.018 ms). Its rounds may share links (`Exchange.flat`).

*Naive mode* (the baseline): the first holder ("owner") of each needed region sends it straight
to every reader over the direct link where one exists, and every reader folds all partial
slices itself; no relays, no trees. On machines whose unlinked GPU pairs have a slow host-staged
fallback (DGX-1: QPI/PCIe) that is what point-to-point NCCL does, and it is the default.

*naive-routed*: the same owner-to-every-reader sends and reader-side folds, but each message
takes the topology's fastest route (relayed over NVLink where that beats the fallback), as a
framework that picks routes per pair would. It isolates what the synthesis itself adds (nearest
sources, delivered blocks reused as sources so a block crosses a slow link once, partial-sum
trees, link-safe rounds) from route choice.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ..core.geometry import (
    Region,
    contains,
    contiguous_slice,
    cut_along,
    intersect,
    subtract,
    volume,
)
from ..errors import PlanError
from ..frontend.ir import DTYPE_BYTES, TensorInfo
from .placement import Piece
from .routes import RANK_REFERENCE_BYTES, routes_for
from .timing import exchange_time, level_busy, replays
from .transfers import EMPTY, MODES, NAIVE_MODES, Exchange, Reduce, Transfer, pack_groups
from .folds import reduce_partials
from .paths import blocks_sent, spread_send, worth_paths
from .rings import is_mesh, mesh_rings, ring_copy
from .trees import scatter_copy, tree_copy, worth_trees
from .broadcasts import rail_scatter_copy
from .node_copies import replicate, split_by_node

# --------------------------------------------------------------------------- synthesis


class _Synthesis:
    """Accumulates transfers and reduces and places each into its round as it is emitted."""

    def __init__(self, info: TensorInfo, topology, mode: str, spread: bool = False) -> None:
        self.info = info
        self.topo = topology
        self.mode = mode
        self.naive = mode in NAIVE_MODES
        self.elem = DTYPE_BYTES[info.dtype]
        self.transfers: list[Transfer] = []
        self.reduces: list[Reduce] = []
        self.copies: dict[int, list[int]] = {}  # device -> [bytes, kernels]
        self.early: dict[int, list[int]] = {}  # the copies of those that read no received part
        self.stitches: list[tuple[Region, int, list[tuple[Region, bool]]]] = []
        self.copied: list[tuple[int, Region]] = []  # received parts the stitching copies
        self.packs: dict[tuple[int, int], list[int]] = {}  # (round, sender) -> [bytes, kernels]
        self.sent: dict[int, int] = {}  # device -> bytes it sent as a transfer's source
        self._busy: dict[tuple[str, int], tuple[int, ...]] = {}
        self.routes = routes_for(topology, mode)
        self.spread = spread and not self.naive
        self.sources: tuple = ()  # the producer's pieces, as lowering holds them
        self.trees = False  # fold partial sums down packed trees (`trees.tree_fold`)
        self.pipeline = False  # fold each chunk in parts, one while the next arrives (`folds`)
        self.direct_folds = False  # every reader folds its needs from the holders (`folds`)
        self.tree_schedule = None  # the links' loads every packed tree of this program sees
        self.rings = False  # fold partial sums round the mesh's rings (`rings.ring_fold`)
        self.ring_loads = None  # the bytes every ring of this program's folds carries
        self.multipath = False  # large blocks in chunks over every short path (`paths.py`)
        self.path_loads: dict[str, float] = {}  # seconds of bytes on each link resource
        self.path_blocks = 1  # blocks the program sends, sharing the transfer budget
        self.flat = False  # every transfer in the round after its source is ready (`send`)
        self.owners = False  # copies from the producer's pieces only, none relayed on

    def dist(self, a: int, b: int) -> float:
        """Seconds for a reference message from a to b: the order in which sources are tried."""
        return self.routes.dist_to(b, self.info.name)[a]

    def route(self, a: int, b: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return self.routes.route(a, b, self.info.name)

    def send(self, src: int, dst: int, reg: Region, ready: int,
             slices: tuple[int, ...] = (), hops: tuple[int, ...] | None = None,
             within: Region | None = None) -> int:
        """Emit a transfer whose source is ready after round `ready` (along `hops`, else the
        topology's route); returns its round. `within`: the region of the buffer `reg` is
        cut from on src, where `reg` may be a strided part of it, which the sender packs
        into one contiguous message first (`Exchange.packs`). In a flat program a relayed
        transfer is one transfer per hop, each in the round after the one before (`flat`)."""
        if hops is None:
            hops, res = self.route(src, dst)
        else:
            res = tuple(self.routes.link(x, y, self.info.name).resource
                        for x, y in zip(hops, hops[1:]))
        if self.flat and len(hops) > 2:
            rnd = ready
            for i, (a, c) in enumerate(zip(hops, hops[1:])):
                rnd = self._place(a, c, reg, rnd, slices, (a, c), res[i:i + 1],
                                  within if i == 0 else None)
            return rnd
        return self._place(src, dst, reg, ready, slices, hops, res, within)

    def _place(self, src: int, dst: int, reg: Region, ready: int, slices: tuple[int, ...],
               hops: tuple[int, ...], res: tuple[str, ...], within: Region | None) -> int:
        """Put one transfer into the earliest round after `ready` in which no resource on its
        route is taken by another route (a flat program: the round after `ready`)."""
        rnd = ready + 1
        while not self.flat and any(self._busy.get((r, rnd), hops) != hops for r in res):
            rnd += 1
        for r in res:
            self._busy[(r, rnd)] = hops
        nbytes = volume(reg) * self.elem
        if within is not None and reg != within and not contiguous_slice(
                tuple(b - a for a, b in within),
                tuple((a - o, b - o) for (a, b), (o, _) in zip(reg, within))):
            acc = self.packs.setdefault((rnd, src), [0, 0])
            acc[0] += nbytes
            acc[1] += 1
        self.sent[src] = self.sent.get(src, 0) + nbytes
        self.transfers.append(Transfer(src, dst, self.info.name, reg, nbytes,
                                       "partial" if slices else "copy", rnd, hops, slices))
        return rnd

    def reduce(self, dev: int, reg: Region, inputs: Sequence[tuple[tuple[int, ...], int]],
               out: tuple[int, ...]) -> int:
        rnd = max(r for _, r in inputs)
        self.reduces.append(Reduce(dev, self.info.name, reg, len(inputs), rnd,
                                   tuple(s for s, _ in inputs), out, volume(reg) * self.elem))
        return rnd

    def stitch(self, q: Region, d: int, parts: list[tuple[Region, bool]]) -> None:
        """Note the parts (region, received?) that need q on d is assembled from; counted
        in `build`, once every transfer is known."""
        if len(parts) == 1 and parts[0][0] == q:
            return  # the one part is the need itself
        self.stitches.append((q, d, parts))

    def _count_stitches(self) -> None:
        """The copies that assemble the needs: own parts, and received parts that cannot
        land in place: not a contiguous range of the need, or a part of them sent on (the
        device slices it, so lowering keeps the received buffer and copies it; a part sent
        on whole is sent from where it landed)."""
        sent_from: dict[int, list[Region]] = {}
        for t in self.transfers:
            if not t.slices:  # a full value sent on (a partial is another buffer)
                sent_from.setdefault(t.src, []).append(t.region)
        for q, d, parts in self.stitches:
            shape = tuple(b - a for a, b in q)
            copied = [(cut, received) for cut, received in parts
                      if not received
                      or not contiguous_slice(shape, tuple((a - o, b - o)
                                                           for (a, b), (o, _) in zip(cut, q)))
                      or any(contains(cut, r) and r != cut for r in sent_from.get(d, ()))]
            if not copied:
                continue
            nbytes = sum(volume(cut) for cut, _ in copied) * self.elem
            acc = self.copies.setdefault(d, [0, 0])
            acc[0] += nbytes
            acc[1] += 1
            waits = [cut for cut, received in copied if received]
            if not waits:  # own parts only: no waiting
                early = self.early.setdefault(d, [0, 0])
                early[0] += nbytes
                early[1] += 1
            self.copied.extend((d, cut) for cut in waits)

    def copy_to(self, src: int, dst: int, reg: Region, ready: int,
                within: Region | None = None) -> list[tuple[Region, int, int]]:
        """Send full block `reg` from src to dst; returns every (part, device, round) that
        holds a part after, dst's parts last. With `spread`, a block crossing the top level
        goes over the rails (`routes.Routes.rails`) so that the blocks a group receives arrive over
        all its NICs, not over each reader's own:

        - a large block is cut along its first dim into one chunk per rail (chunks of at
          least RANK_REFERENCE_BYTES, each a contiguous range of the block), each chunk one
          transfer relayed along its rail in one round;
        - a smaller one goes over the sender's own rail hop by hop, one transfer per hop,
          so that the sends of one rail share their rounds.

        The stops in dst's group keep what passed them as sources (lowering holds relayed
        blocks), so other readers there gather from the rails' ends."""
        rails = self.routes.rails(src, dst) if self.spread else ()
        if not rails:
            spread = (spread_send(self, src, dst, reg, ready, within, self.path_blocks)
                      if self.multipath else None)
            if spread is not None:
                return spread
            return [(reg, dst, self.send(src, dst, reg, ready, within=within))]
        dim = next((i for i, (lo, hi) in enumerate(reg) if hi - lo > 1), None)
        worth = int(volume(reg) * self.elem // RANK_REFERENCE_BYTES)
        k = 1 if dim is None else max(1, min(len(rails), reg[dim][1] - reg[dim][0], worth))
        relayed, arrived = [], []
        if k == 1:
            at, rnd = src, ready
            for nxt in rails[0][1:]:
                rnd = self.send(at, nxt, reg, rnd, within=within if at == src else None)
                at = nxt
                (arrived if at == dst else relayed).append((reg, at, rnd))
            return relayed + arrived
        group = self.topo.group_of(0, dst)
        for part, hops in zip(cut_along(reg, dim, k), rails):
            rnd = self.send(src, dst, part, ready, hops=hops, within=within)
            relayed.extend((part, h, rnd) for h in hops[1:-1]
                           if self.topo.group_of(0, h) == group)
            arrived.append((part, dst, rnd))
        return relayed + arrived

    def build(self) -> Exchange:
        self._count_stitches()
        return Exchange(tuple(self.transfers), tuple(self.reduces),
                        tuple((d, b, k) for d, (b, k) in sorted(self.copies.items())),
                        tuple((r, d, b, k) for (r, d), (b, k) in sorted(self.packs.items())),
                        self.sources,
                        tuple((d, b, k) for d, (b, k) in sorted(self.early.items())),
                        tuple(self.copied), flat=self.flat)


def synthesize(info: TensorInfo, produced: Sequence[Piece], needs: Sequence[tuple[Region, int]],
               agg: str | None, topology, mode: str = "optimized") -> Exchange:
    """Transfers (and partial-sum folds) that deliver every needed (region, device) of `info`
    from the `produced` pieces. See the module docstring for the algorithm."""
    if mode not in MODES:
        raise PlanError(f"unknown exchange mode {mode!r} for tensor {info.name!r}",
                        fix=f"use one of {', '.join(MODES)}")
    n_slices = produced[0].n_slices if produced else 1
    if n_slices > 1 and agg is None:
        raise PlanError(f"tensor {info.name!r} is produced as {n_slices} partial results but "
                        "has no aggregation to fold them", fix="give the producer's aggregation")
    split = split_by_node(produced, needs, n_slices, topology) if mode == "optimized" else None
    if split is not None:  # one node's exchange on every node: synthesised once
        return replicate(synthesize(info, split.produced, split.needs, agg, topology, mode), split)
    plain = _synthesize(info, produced, needs, n_slices, topology, mode, spread=False)
    if mode != "optimized" or not _crosses_rails(plain, topology):
        return plain
    # Spreading a block over every rail wins when few devices send across, and loses rounds
    # when many do (their chunks queue behind each other's); keep the faster program.
    spread = _synthesize(info, produced, needs, n_slices, topology, mode, spread=True)
    return spread if exchange_time(spread, topology) < exchange_time(plain, topology) else plain


def _synthesis(info: TensorInfo, produced: Sequence[Piece], topology, mode: str,
               spread: bool) -> "_Synthesis":
    b = _Synthesis(info, topology, mode, spread)
    b.sources = tuple((p.region, p.device, (p.slice,) if p.n_slices > 1 else ())
                      for p in produced)
    return b


def _crosses_rails(ex: Exchange, topology) -> bool:
    routes = routes_for(topology, "optimized")
    return any(t.kind == "copy" and routes.rails(t.src, t.dst) for t in ex.transfers)


def _synthesize(info: TensorInfo, produced: Sequence[Piece], needs: Sequence[tuple[Region, int]],
                n_slices: int, topology, mode: str, spread: bool) -> Exchange:
    if n_slices == 1:
        # Fast path: every need already inside a local piece (identical layouts included).
        local: dict[int, list[Region]] = {}
        for p in produced:
            local.setdefault(p.device, []).append(p.region)
        remote = [(q, d) for q, d in needs
                  if not any(contains(r, q) for r in local.get(d, ()))]
        if not remote:
            return EMPTY
        return _copy_program(info, produced, topology, mode, spread,
                             lambda b: ([(p.region, p.device, -1) for p in produced], remote))

    def folded(b: _Synthesis):
        full = reduce_partials(b, produced, needs, n_slices)
        return full, [(q, d) for q, d in needs
                      if not any(dev == d and contains(r, q) for r, dev, _ in full)]
    return _copy_program(info, produced, topology, mode, spread, folded)


def _copy_program(info: TensorInfo, produced: Sequence[Piece], topology, mode: str,
                  spread: bool, prepare) -> Exchange:
    """The copy step from the full sources `prepare(b)` gives (the producer's pieces, or the
    folded partial sums) to the needs it gives: the plain program, and in the optimized
    mode where partial sums fold, the pipelined and the direct folds (`folds.py`); where a
    block has several remote readers or more than two partial slices fold, the packed-tree
    program (`trees.py`), the scatter-then-gather program where it applies
    (`trees.scatter_copy`) and on a mesh the ring program (`rings.py`); on a mesh where a
    block is large enough to cut, the multipath program (`paths.py`). The fastest under
    `exchange_time` is kept (`_fastest`)."""
    def program(copy, **flags) -> Exchange | None:
        """A synthesis with `flags` set, its sources prepared, then `copy` run on them; None
        where `copy` declines (returns False)."""
        b = _synthesis(info, produced, topology, mode, spread)
        for flag, value in flags.items():
            setattr(b, flag, value)
        sources, remote = prepare(b)
        return None if copy(b, sources, remote) is False else b.build()

    def plain_copy(b, sources, remote) -> None:
        _copy(b, list(sources), remote)

    def tree_or_plain(b, sources, remote) -> None:
        (tree_copy if worth_trees(sources, remote) else plain_copy)(b, sources, remote)

    def scatter(b, sources, remote) -> bool:
        return worth_trees(sources, remote) and scatter_copy(b, sources, remote)

    def rail_scatter(b, sources, remote) -> bool:
        return worth_trees(sources, remote) and rail_scatter_copy(b, sources, remote)

    def multipath(b, sources, remote) -> None:
        b.path_blocks = blocks_sent(sources, remote)
        plain_copy(b, sources, remote)

    def ringed(b, sources, remote) -> None:
        if not ring_copy(b, sources, remote):
            plain_copy(b, sources, remote)

    def pipelined(b, sources, remote) -> bool | None:
        if len(b.reduces) <= len(plain.reduces):  # no chunk was cut: the plain program
            return False
        return plain_copy(b, sources, remote)

    b = _synthesis(info, produced, topology, mode, spread)
    sources, remote = prepare(b)
    optimized = mode == "optimized"
    slices = len({p.slice for p in produced})
    trees = optimized and not spread and (slices > 2 or worth_trees(sources, remote))
    plain_copy(b, sources, remote)
    plain = b.build()
    found = [plain]
    if optimized and slices > 1:
        found += [program(pipelined, pipeline=True), program(plain_copy, direct_folds=True)]
    devices = _devices(produced, remote)
    # where the plain program relays, or the devices form a mesh (relayed pairs): flat too
    if optimized and (any(len(t.hops) > 2 for t in plain.transfers)
                      or is_mesh(topology, devices)):
        found += [program(plain_copy, flat=True), program(plain_copy, flat=True, owners=True)]
        if trees:
            found.append(program(scatter, flat=True))
        if slices > 1:
            found.append(program(plain_copy, direct_folds=True, flat=True))
    if trees:
        found += [program(tree_or_plain, trees=True), program(scatter)]
        if len(topology.levels) > 1 and len(topology.levels[0].groups) > 1:  # several nodes
            found.append(program(rail_scatter, flat=True))
            if slices > 1:
                found.append(program(rail_scatter, flat=True, pipeline=True))
    if trees and mesh_rings(topology, devices):  # where trees are worth building, rings too
        found.append(program(ringed, rings=True))
    if optimized and not spread and worth_paths(sources, remote, b.elem) \
            and is_mesh(topology, devices):
        found.append(program(multipath, multipath=True))
    return _fastest([ex for ex in found if ex is not None], topology)


def _fastest(programs: list[Exchange], topology) -> Exchange:
    """The first of the fastest programs under `exchange_time`. Timing (a replay) is most of
    synthesis' cost, and a program's wire floor (its busiest link's bytes over that link's
    rate, `timing.level_busy`) bounds its time from below: programs are timed lowest floor
    first, and one whose floor exceeds the best time so far is never timed. The one kept is
    also timed with a round's strided sends packed by one kernel (`Exchange.one_pack`)."""
    floors = [max(level_busy(ex, topology), default=0.0) for ex in programs]
    best: tuple[float, int] | None = None
    for i in sorted(range(len(programs)), key=lambda k: (floors[k], k)):
        if best is not None and floors[i] > best[0]:
            break
        t = exchange_time(programs[i], topology)
        if best is None or (t, i) < best:
            best = (t, i)
    kept = programs[best[1]]
    # the same program with a device's strided sends of a round packed by one kernel
    one = replace(kept, one_pack=True)
    if replays(topology) and pack_groups(one) and exchange_time(one, topology) < best[0]:
        return one
    return kept


def _devices(produced: Sequence[Piece], needs: Sequence[tuple[Region, int]]) -> set[int]:
    return {p.device for p in produced} | {d for _, d in needs}


def _meets(a: Region, b: Region) -> bool:
    for (a0, a1), (b0, b1) in zip(a, b):
        if a0 >= b1 or b0 >= a1:
            return False
    return True


def _by_region(pool: list[tuple[Region, int, int]]) -> dict[Region, list[int]]:
    out: dict[Region, list[int]] = {}
    for i, src in enumerate(pool):
        out.setdefault(src[0], []).append(i)
    return out


def _copy(b: _Synthesis, sources: list[tuple[Region, int, int]],
          needs: Iterable[tuple[Region, int]]) -> None:
    """Cover each need from full sources (region, device, ready round), nearest first.

    Only sources that meet the need can cover any part of it, so the others are dropped
    before ordering (the order of the survivors, and hence every transfer, is unchanged).
    Sources are indexed by region: relayed copies of one block share one overlap test."""
    naive = b.naive
    owned = list(sources)
    index = _by_region(owned)
    for q, d in dict.fromkeys(needs):
        pool = owned if naive else sources
        hit = [i for reg, ids in index.items() if _meets(reg, q) for i in ids]
        if naive:  # the reader's own blocks, then owners in layout order
            hit.sort(key=lambda i: (pool[i][1] != d, i))
        else:
            row = b.routes.dist_to(d, b.info.name)
            # ties: the lower device; when spreading, the device that has sent least so far
            # (the chunks a rail delivered are gathered from all the rails' ends)
            tie = b.sent if b.spread else None
            hit.sort(key=lambda i: (row[pool[i][1]], pool[i][2],
                                    pool[i][1] if tie is None else tie.get(pool[i][1], 0), i))
        todo = [q]
        got: list[tuple[Region, int, int]] = []  # (part, device holding it, round)
        parts: list[tuple[Region, bool]] = []
        for i in hit:
            reg, dev, ready = pool[i]
            nxt: list[Region] = []
            for u in todo:
                cut = intersect(u, reg)
                if cut is None:
                    nxt.append(u)
                    continue
                if dev != d:
                    arrived = b.copy_to(dev, d, cut, ready, within=reg)
                    got.extend(arrived)
                    parts.extend((part, True) for part, at, _ in arrived if at == d)
                else:
                    parts.append((cut, False))
                if cut != u:
                    nxt.extend(subtract(u, cut))
            todo = nxt
            if not todo:
                break
        if todo:
            raise PlanError(f"tensor {b.info.name!r}: region {todo[0]} needed on device {d} is "
                            "held by no device", fix="the producer layout must cover the tensor")
        b.stitch(q, d, parts)
        if not naive and not b.owners:
            for cut, at, rnd in got:
                index.setdefault(cut, []).append(len(sources))
                sources.append((cut, at, rnd))
