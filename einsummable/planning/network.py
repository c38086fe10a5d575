"""The fluid network: flows of bytes over shared resources, rates max-min fair. The simulator
runs whole programs on it and the exchange timer (`replay.py`) one exchange program, so that
both price a transfer by the same rules.

A transfer is one flow that loads its link and, where the link names a port, the sender's
egress and the receiver's ingress port. Rates are max-min fair over all of a flow's resources
(progressive filling, recomputed at every start and end): raise every unfrozen flow's rate
together until some resource is full, freeze the flows on it, repeat. Urgent flows are filled
first; prefetches share what they leave (a low-priority stream). A message is usable `latency`
after its last byte leaves.

A message larger than `EAGER_BYTES` is a rendezvous: its bytes leave only once the receiver
has posted its receive (reached the Recv in its program), as NCCL's send waits for credits
in the receiver's buffer and a TCP sender for the reader's socket to drain. Without the rule a
rank that finished its part of one exchange early sent the next exchange's blocks into
receivers still taking the first, and the two shared their ports: on h100x8x2 random plans'
cross-node exchanges ran up to 19% over the sum of their prices, each priced alone exactly.
Smaller messages fit the receiver's buffer and leave at once. `Outbox` keeps one simulated
rank's send lines, where these rules are applied.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from .kernel_time import Span


# Bytes a send may put in flight before its receiver posts the receive: NCCL's buffer per
# connection (NCCL_BUFFSIZE, 4 MiB by default) and Linux's largest TCP send buffer by default
# (net.ipv4.tcp_wmem's maximum, 4 MiB), which gloo's pairs write into. Beyond it the whole
# message waits for the receive (the first 4 MiB would leave early; not modelled).
EAGER_BYTES = 4 * 2**20


def rendezvous(nbytes: float, prefetch: bool = False) -> bool:
    """Whether a send of `nbytes` waits for its receiver to post the receive. A prefetch
    (a weight streamed on its own queue) does not: its receives are posted ahead of the
    kernels, on the prefetch stream."""
    return nbytes > EAGER_BYTES and not prefetch


# A flow with less than this left is finished (float drift on integer byte counts).
_DONE_BYTES = 1e-6


# ... and so is one that would finish within this many seconds: at large clock values and
# gigabyte messages, drift leaves remainders whose time to drain no longer moves the clock,
# which would otherwise be stepped through forever. Far below any latency or launch term.
_DONE_S = 1e-12


@dataclass(slots=True)
class Flow:
    tag: int
    resources: tuple[tuple[str, float], ...]  # (resource, its capacity in B/s) the bytes load
    latency: float
    remaining: float
    urgent: bool = True  # False: a prefetch, served from what urgent flows leave
    rate: float = 0.0
    # sender and receiver, whose memory and compute it loads; a copy on one device names it
    # twice (its bytes are read and written there)
    ends: tuple[int, ...] = ()
    sms: bool = True  # it holds compute units while it runs (NCCL's kernels; not a copy engine)


class Network:
    def __init__(self) -> None:
        self.now = 0.0
        self.flows: list[Flow] = []
        self.arrived: dict[int, float] = {}
        self.on_done = lambda tag: None  # called as each flow's last byte leaves (may start more)

    def _rates(self) -> None:
        """Max-min fair rates (progressive filling): raise every unfrozen flow's rate together
        until some resource is full, freeze the flows on it, repeat. A flow on an NVSwitch
        link thus gets min(link, egress port share at its sender, ingress share at its
        receiver), and bandwidth one flow cannot use goes to the others. Urgent flows are
        filled first; prefetches share what they leave (a low-priority stream)."""
        cap: dict[str, float] = {}
        later = []
        for f in self.flows:
            for res, bw in f.resources:
                cap[res] = bw
            if not f.urgent:
                later.append(f)
        if later:
            self._fill([f for f in self.flows if f.urgent], cap)
            self._fill(later, cap)
        else:
            self._fill(self.flows, cap)

    @staticmethod
    def _fill(flows: list["Flow"], cap: dict[str, float]) -> None:
        # The next resource to fill up is the one of least share cap / unfrozen flows; a heap
        # keeps the shares, an entry going stale when its resource's figures change (shares
        # only grow as flows freeze: what a frozen flow takes is at most the share of each
        # resource it crosses). Ties go to the smaller resource name, as a plain min would.
        users: dict[str, list[Flow]] = {}
        for f in flows:
            for res, _ in f.resources:
                users.setdefault(res, []).append(f)
        free = set(map(id, flows))
        count = {r: len(fl) for r, fl in users.items()}
        version = dict.fromkeys(count, 0)
        heap = [(max(cap[r], 0.0) / n, r, 0) for r, n in count.items()]
        heapq.heapify(heap)
        while free:
            share, res, v = heapq.heappop(heap)
            if res not in count or version[res] != v:
                continue  # stale
            changed = set()
            for f in users.pop(res):
                if id(f) in free:
                    f.rate = share
                    free.discard(id(f))
                    for r, _ in f.resources:
                        cap[r] -= share
                        n = count[r] - 1
                        if n:
                            count[r] = n
                            changed.add(r)
                        else:
                            del count[r]
            count.pop(res, None)
            for r in changed:
                if r in count:
                    version[r] += 1
                    heapq.heappush(heap, (max(cap[r], 0.0) / count[r], r, version[r]))

    def load(self, device: int, at: float, queued: float = 0.0) -> tuple[Span, ...]:
        """The kernel contention rule's spans from `at` (`kernel_time.Span`): one per flow
        touching `device` ending, at today's rates (a flow ends and its rate leaves the
        span after), then `queued` more bytes (prefetches waiting their turn) at the rate of
        them all. A copy on the device's copy stream (`sms` False, the device named at both
        ends) moves its bytes through the memory twice. Empty when nothing moves."""
        mine = []
        for f in self.flows:
            if f.rate > 0 and device in f.ends:
                copy = f.ends.count(device) > 1
                mine.append((self.now + f.remaining / f.rate, 0.0 if copy else f.rate,
                             2 * f.rate if copy else 0.0, f.sms))
        if not mine:
            return ()
        mine.sort()
        moved = sum(m[1] for m in mine)
        copied = sum(m[2] for m in mine)
        spans, since = [], at
        for k, (end, moving, copying, _) in enumerate(mine):
            if end > since:
                spans.append(Span(moved, copied, end - since, any(m[3] for m in mine[k:])))
                since = end
            moved -= moving
            copied -= copying
        total = sum(m[1] + m[2] for m in mine)
        spans.append(Span(sum(m[1] for m in mine), sum(m[2] for m in mine), queued / total,
                          True))
        return tuple(spans)

    def next_done(self) -> float:
        return min((self.now + f.remaining / f.rate for f in self.flows if f.rate > 0),
                   default=math.inf)

    def advance(self, t: float) -> list[int]:
        """Move to time t, finishing flows on the way; returns the tags whose arrival is known."""
        done: list[int] = []
        while self.flows:
            t_next = self.next_done()
            if t_next > t:
                break
            self._progress(t_next)
            going = []
            for f in self.flows:
                if f.remaining <= _DONE_BYTES or (f.rate > 0 and f.remaining / f.rate <= _DONE_S):
                    self.arrived[f.tag] = t_next + f.latency
                    done.append(f.tag)
                else:
                    going.append(f)
            finished = done[len(done) - (len(self.flows) - len(going)):]
            self.flows = going
            for tag in finished:
                self.on_done(tag)
            self._rates()
        self._progress(t)
        return done

    def _progress(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self.flows:
                f.remaining = max(0.0, f.remaining - f.rate * dt)
        self.now = max(self.now, t)

    def start(self, flow: Flow) -> None:
        self.start_all((flow,))

    def start_all(self, flows) -> None:
        """Start flows at once: the rates are filled once for all of them."""
        added = False
        for flow in flows:
            if flow.remaining <= 0:
                self.arrived[flow.tag] = self.now + flow.latency
                self.on_done(flow.tag)
                continue
            self.flows.append(flow)
            added = True
        if added:
            self._rates()


class PrefetchQueue:
    """One rank's prefetch sends: queue numbers go out in order, each once every send the
    rank's program has in the one before has left (one stream: a queue number is one group
    on it, relays' forwards included, which are posted only as their blocks arrive); the
    flows of one queue number run together. `expected`: queue number -> the sends the
    rank's program holds in it."""

    def __init__(self, net: Network, expected: dict[int, int]) -> None:
        self.net = net
        self.order = sorted(q for q, n in expected.items() if n)
        self.expected = expected
        self.turn = 0  # index in `order` of the queue on the stream now
        self.left = expected[self.order[0]] if self.order else 0
        self.inflight: set[int] = set()
        self.pending: list[tuple[int, Flow]] = []  # (queue, flow) in program order

    @property
    def active(self) -> int | None:
        return self.order[self.turn] if self.turn < len(self.order) else None

    def send(self, queue: int, flow: Flow) -> None:
        if queue == self.active:
            self.inflight.add(flow.tag)
            self.net.start(flow)
        else:
            self.pending.append((queue, flow))

    def queued_bytes(self, device: int) -> float:
        """Bytes of this queue's waiting sends to or from `device`."""
        return sum(f.remaining for _, f in self.pending if device in f.ends)

    def done(self, tag: int) -> None:
        if tag not in self.inflight:
            return
        self.inflight.discard(tag)
        self.left -= 1
        while not self.inflight and self.left <= 0 and self.active is not None:
            self.turn += 1
            nxt = self.active
            if nxt is None:
                return
            self.left = self.expected[nxt]
            batch = [f for q, f in self.pending if q == nxt]
            self.pending = [(q, f) for q, f in self.pending if q != nxt]
            self.inflight.update(f.tag for f in batch)
            for f in batch:
                self.net.start(f)


class Outbox:
    """One rank's communication engine in the simulator, one per rank (the executor's is
    `backend/runtime/outbox.py`): each send leaves once its source is there, and for a
    rendezvous its receive posted, while the rank goes on computing, one send per peer and
    stream at a time in program order (a line per peer, and another for the weight
    prefetches: the next leaves when the last byte of the one before has left, as NCCL runs
    a pair's operations on a stream in order and the executor's line sends them); a send
    whose source is still arriving (a relay's forward) holds up the later sends on its line,
    and no others."""

    def __init__(self) -> None:
        # (peer, prefetch?) -> [queue, flow, waiting tags, ready at]: a line per peer and
        # stream (prefetches go on their own, as FSDP's all-gathers run on their own stream)
        self.lines: dict[tuple[int, bool], list[list]] = {}
        self.busy: dict[tuple[int, bool], int] = {}  # line -> tag of the send on it now

    def post(self, peer: int, queue: int, flow: Flow, waiting: set[int],
             ready_at: float) -> None:
        self.lines.setdefault((peer, queue > 0), []).append([queue, flow, waiting, ready_at])

    def arrived(self, tag: int, at: float) -> None:
        for entries in self.lines.values():
            for e in entries:
                if tag in e[2]:
                    e[2].discard(tag)
                    e[3] = max(e[3], at)

    def posted(self, tag: int, at: float) -> None:
        """The receiver of send `tag` posted its receive at `at` (a rendezvous send waits
        for it, `network.rendezvous`)."""
        self.arrived(("posted", tag), at)

    def done(self, tag: int, at: float) -> None:
        """The last byte of send `tag` left: its line takes the next send from `at`."""
        for line, busy in list(self.busy.items()):
            if busy == tag:
                del self.busy[line]
                for e in self.lines.get(line, ())[:1]:
                    e[3] = max(e[3], at)

    def next_ready(self) -> float:
        """When the next send can leave (inf: none can yet)."""
        heads = [es[0] for p, es in self.lines.items()
                 if es and not es[0][2] and p not in self.busy]
        return min((e[3] for e in heads), default=math.inf)

    def take(self, now: float) -> list[tuple[int, Flow]]:
        """The sends that leave by `now`, at most one per free line."""
        out = []
        for line, entries in self.lines.items():
            if entries and line not in self.busy and not entries[0][2] \
                    and entries[0][3] <= now:
                queue, flow, _, _ = entries.pop(0)
                self.busy[line] = flow.tag
                out.append((queue, flow))
        return out

    def queued_bytes(self, device: int) -> float:
        """Bytes of the sends waiting on this rank's lines to or from `device`."""
        return sum(e[1].remaining for es in self.lines.values() for e in es
                   if device in e[1].ends)

    @property
    def pending(self) -> bool:
        return any(self.lines.values())
