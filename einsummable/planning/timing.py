"""Exchange time: the seconds an exchange program takes on a topology.

Where the transport neither charges per message nor loses host time when messages cross
(GPU fabrics), `exchange_time` replays the exchange's programs by the simulator's rules
(`replay.py`). Elsewhere (gloo ranks, whose batches lowering packs into one message per peer)
it is the round model:

*Round model* (`_round_time`): rounds run one after another. In a round a resource carrying L bytes
at bandwidth b is busy L / b; a transfer of B bytes over hops h with bandwidths b_h takes the
latencies of its hops, plus the longest busy time on its route, plus sum_h B / b_h - max_h
B / b_h (store and forward: a relay receives a message whole before sending it on, as the
programs lowering emits do; alone on its route that is sum_h B / b_h, and where other
messages load the bottleneck their time hides the relay's wait on the other hops); the round
lasts as long as its busiest sender's packing (strided parts copied into one message before
they leave, read and written, a kernel per transfer, `Exchange.packs`) plus its slowest
transfer plus its longest per-device reduce time (inputs read and output written at the
device's memory bandwidth), plus the host time of its messages
(`message_time`) and, where two devices send to each other in it, their two-way wait
(`exchange_wait_time`). After the last
round each reader stitches the needs it got in several parts: its own parts, and received parts
that are not one contiguous range of the need, are copied (read and written, one kernel per
need); contiguous received parts land in place (lowering receives them there directly).
"""
from __future__ import annotations

import math

from .kernel_time import copy_s, memory_s
from .replay import replay_parts
from .transfers import Exchange


def link_bytes(ex: Exchange, topology) -> dict[tuple[int, int], int]:
    """Bytes each directed link (src, dst) carries, relays counted on every hop."""
    out: dict[tuple[int, int], int] = {}
    for t in ex.transfers:
        for a, c in zip(t.hops, t.hops[1:]):
            out[(a, c)] = out.get((a, c), 0) + t.nbytes
    return out


def _route_memo(topology) -> dict:
    cache = getattr(topology, "_cache", None)
    return cache.setdefault("exchange-route-terms", {}) if isinstance(cache, dict) else {}


def _route_terms(topology, hops: tuple[int, ...], memo: dict | None = None):
    """(latency of a route, every (resource, bandwidth) its bytes load, and the seconds per
    byte a message waits at its relays, sum_h 1 / b_h - max_h 1 / b_h over its hops' narrowest
    bandwidths b_h): each link's own medium, and the egress/ingress ports of the
    devices at its ends where the topology gives a per-device port limit (NVSwitch, NVLink
    lanes, NICs). Memoised per topology instance (`memo`: that memo, fetched once by a caller
    that asks for many routes)."""
    if memo is None:
        memo = _route_memo(topology)
    hit = memo.get(hops)
    if hit is None:
        links = [topology.link(a, c) for a, c in zip(hops, hops[1:])]
        latency = sum(l.latency_s for l in links)
        terms: list[tuple[str, float]] = []
        per_byte = []  # per hop, the seconds a byte takes on its narrowest resource
        for l in links:
            own = link_resources(l)
            terms.extend(own)
            per_byte.append(1.0 / min(b for _, b in own))
        hit = (latency, tuple(terms), sum(per_byte) - max(per_byte, default=0.0))
        memo[hops] = hit
    return hit


def link_resources(link) -> tuple[tuple[str, float], ...]:
    """(resource, bandwidth) pairs a link's bytes occupy (ports where the link declares one)."""
    own = ((link.resource, link.bw),)
    ports = getattr(link, "port_resources", ())
    return own + tuple(ports)


def level_busy(ex: Exchange, topology) -> tuple[float, ...]:
    """Per level of the topology's hierarchy (slow to fast), the seconds the exchange keeps
    that level's links busy: o_L = max over the resources k of its level-L hops of
    bytes_k / b_k (a stream of exchanges on a level takes at least the sum of these, and about
    that where they pipeline). The objective lets a weight stream that crosses nodes run
    beside activation exchanges inside them (`optimizer/objective.py`)."""
    n = len(topology.levels)
    load: list[dict[str, float]] = [{} for _ in range(n)]
    rate: dict[str, float] = {}
    for t in ex.transfers:
        for a, c in zip(t.hops, t.hops[1:]):
            level = load[topology.pair_level(a, c)]
            for res, b in link_resources(topology.link(a, c)):
                level[res] = level.get(res, 0.0) + t.nbytes
                rate[res] = b
    return tuple(max((x / rate[res] for res, x in level.items()), default=0.0)
                 for level in load)


def exchange_time(ex: Exchange, topology, batched: bool = False) -> float:
    """Seconds `ex` takes on `topology`: its programs replayed (`replay.py`) where the
    topology `replays`, else the round model below."""
    return exchange_parts(ex, topology, batched)[0]


def exchange_parts(ex: Exchange, topology, batched: bool = False) -> tuple[float, float]:
    """(seconds, local seconds): the exchange's time and the share of it the readers' stitching
    copies take (device work, not link time). Replayed, the copies overlap the transfers
    where they can and their share is what they add to the end; in the round model they come
    after the last round (`stitch_time`)."""
    if not ex:
        return 0.0, 0.0
    if ex.one_copy is not None:  # the same exchange on every node at once: one's time
        return exchange_parts(ex.one_copy, topology, batched)
    if replays(topology):
        seconds, wire = _replayed(ex, topology)
        return seconds, seconds - wire
    return _round_time(ex, topology, batched), stitch_time(ex, topology)


# Exchanges whose replay is kept for the next ask: synthesis times the rail-spread and plain
# programs to keep the faster, and pricing then times the one kept again.
_RECENT = 4


def _replayed(ex: Exchange, topology) -> tuple[float, float]:
    cache = getattr(topology, "_cache", None)
    recent = cache.setdefault("replayed", []) if isinstance(cache, dict) else []
    for seen, parts in recent:
        if seen is ex:
            return parts
    parts = replay_parts(ex, topology)
    recent.append((ex, parts))
    del recent[:-_RECENT]
    return parts


def _round_time(ex: Exchange, topology, batched: bool = False) -> float:
    """Seconds under the round model of the module docstring: per round, every resource (link
    medium or device port) carrying L bytes at bandwidth b is busy L / b; a route takes its
    latency plus its busiest resource's time plus its message's store-and-forward wait at
    the relays (module docstring); the round lasts as long as its slowest route plus
    its longest per-device fold and its busiest device's per-message host work
    (`message_time`); then the readers' stitching copies (`Exchange.copies`).

    `batched`: the seconds this exchange adds to a batch that others share, whose route
    latencies and per-message host work are paid once for all (the weights lowering sends in
    one batch, `Topology.charges_per_message`): the same sum without those two terms."""
    memo = _route_memo(topology)
    by_round: dict[int, dict[tuple[int, ...], int]] = {}
    load: dict[int, dict[str, float]] = {}
    bw: dict[int, dict[str, float]] = {}
    for t in ex.transfers:
        hops = t.hops
        if len(hops) < 2:
            continue
        rnd = t.round
        routes = by_round.setdefault(rnd, {})
        routes[hops] = routes.get(hops, 0) + t.nbytes  # pieces on one route: one message
        ld = load.setdefault(rnd, {})
        bb = bw.setdefault(rnd, {})
        terms = memo.get(hops) or _route_terms(topology, hops, memo)
        nbytes = t.nbytes
        for res, b in terms[1]:
            ld[res] = ld.get(res, 0.0) + nbytes
            if b < bb.get(res, math.inf):
                bb[res] = b
    pack_s: dict[int, float] = {}
    for rnd, d, nbytes, kernels in ex.packs:
        pack_s[rnd] = max(pack_s.get(rnd, 0.0), copy_s(topology.devices[d], 2 * nbytes, kernels))
    reduce_s: dict[int, dict[int, float]] = {}
    for r in ex.reduces:
        if r.n_inputs < 2:  # a lone input is only relabelled as the folded value
            continue
        dev = topology.devices[r.device]
        bytes_touched = (r.n_inputs + 1) * r.nbytes  # read every input, write the result
        per_dev = reduce_s.setdefault(r.round, {})
        per_dev[r.device] = per_dev.get(r.device, 0.0) + memory_s(dev, bytes_touched)
    total = 0.0
    for rnd in sorted(set(by_round) | set(reduce_s) | set(pack_s)):
        ld, bb = load.get(rnd, {}), bw.get(rnd, {})
        busy = {res: x / bb[res] for res, x in ld.items()}  # seconds each resource is loaded
        wire = 0.0
        for hops, nbytes in by_round.get(rnd, {}).items():
            latency, terms, relay_s_per_byte = memo[hops]
            # store and forward: its own message waits, whole, at every relay (the hops but
            # the slowest, which the busiest resource's time already covers)
            wire = max(wire, (0.0 if batched else latency)
                       + max(busy[res] for res, _ in terms) + nbytes * relay_s_per_byte)
        fold = max(reduce_s.get(rnd, {}).values(), default=0.0)
        routes = by_round.get(rnd, ())
        host = 0.0 if batched else (message_time(routes, topology)
                                    + exchange_wait_time(routes, topology))
        total += pack_s.get(rnd, 0.0) + wire + fold + host
    return total + stitch_time(ex, topology)


def replays(topology) -> bool:
    """Whether exchanges on `topology` are timed by replaying their programs (`replay.py`):
    where the transport neither charges per message (gloo packs a batch's blocks into one,
    which the replay does not model) nor loses host time when messages cross."""
    return not topology.charges_per_message and not any(d.exchange_wait_s
                                                         for d in topology.devices)


def message_time(routes, topology) -> float:
    """Host seconds of the round's messages on its busiest device: each hop a device sends
    or receives on is one message (lowering packs a round's blocks for one peer into one,
    `coalesce.py`), each costing the device's `message_s`; zero where the transport has no
    per-message price."""
    count: dict[int, int] = {}
    for a, b in {pair for hops in routes for pair in zip(hops, hops[1:])}:
        count[a] = count.get(a, 0) + 1
        count[b] = count.get(b, 0) + 1
    return max((n * topology.devices[d].message_s for d, n in count.items()), default=0.0)


def exchange_wait_time(routes, topology) -> float:
    """Host seconds the round adds where two devices send to each other in it (their messages
    cross, `Device.exchange_wait_s`): the largest such device's figure; zero where the
    transport loses nothing (GPUs), as the simulator's two-way rule charges it."""
    pairs = {pair for hops in routes for pair in zip(hops, hops[1:])}
    return max((topology.devices[a].exchange_wait_s for a, b in pairs if (b, a) in pairs),
               default=0.0)


def stitch_time(ex: Exchange, topology) -> float:
    """Seconds the busiest reader spends stitching after the last round (a kernel per need,
    every copied byte read and written): device work, not link time."""
    return max((copy_s(topology.devices[d], 2 * nbytes, k)
                for d, nbytes, k in ex.copies), default=0.0)

