"""Exchange time by replay: an exchange run as the programs lowering emits for it, on the
simulator's network, by the simulator's rules.

The round model (`timing.py`) puts a barrier after every round. Programs have none: a send
leaves as soon as its block is there and the line to its peer is free, so later rounds start
while a relay is still forwarding. On fabrics that relay (the DGX-1 cube mesh, rails across
nodes) the barrier made exchanges of several rounds up to twice their simulated time. Here the
exchange's program is replayed instead, rule for rule as `backend/runtime/simulator.py` runs
it (checked against it in `tests/test_replay.py`):

    order     each device runs its part in lowering's order: events by (round, transfers
              before reduces, emission order); a transfer is a Send at its source, a Recv and
              Send at every relay, a Recv at its reader (`lowering._apply`)
    buffers   a send reads the first held block that equals its region, else the first that
              contains it (a Slice: a view, but the device waits until that block is there;
              a strided one is packed, one copy kernel read and written, before it leaves;
              a device's strided sends of one round from its producer pieces share one
              pack kernel, run before the first of them, `transfers.pack_groups`);
              held blocks are the producer's pieces (`Exchange.sources`), then what arrives,
              relays keeping full blocks they pass on, and reduce outputs
    sends     leave once their block is there, one per peer at a time in program order (the
              next when the last byte of the one before has left; a forward still waiting
              for its block holds back later sends to that peer, no others), each hop one
              flow on `network.Network` over its link and ports, usable `latency` after its
              last byte leaves; a message over `network.EAGER_BYTES` leaves once its
              receiver has reached the receive (rendezvous)
    kernels   a reduce waits for its inputs, then takes launch + (inputs + 1) bytes / memory
              rate; the first Send/Recv after a kernel (or at the start) opens a p2p batch:
              one launch
    end       per device, when its part and the blocks it holds are done; its stitching
              copies (`Exchange.copies`) of own parts start when its part is done, the others
              when the received parts they read are there; the exchange ends with the last
              device. The copies' share is what they add to that end (`replay_parts`)

Contention is left to the callers (the objective's κ, the simulator per kernel), as before.
Transports that charge per message (gloo ranks) pack a batch's blocks into one message
(`coalesce.py`), which this replay does not model: `timing.exchange_time` keeps the round
model there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.geometry import Region, contains, contiguous_slice, intersect, region_shape, relative
from .kernel_time import copy_s
from .network import Flow, Network, rendezvous
from .transfers import Exchange, pack_groups

ORIGIN = ("origin",)  # the producer's own pieces: there from the start


@dataclass
class _Step:
    kind: str                       # "slice", "send", "recv", "reduce", "pack"
    waits: tuple = ()               # buffer keys the device waits for before the step
    key: tuple = ()                 # send: the block it reads; reduce: the block it writes
    peer: int = -1
    tag: int = -1
    nbytes: int = 0
    pack: bool = False              # send: a strided block, packed first
    direct: bool = True             # send: reads the held block itself, not a slice of it
    opens: bool = False             # opens a p2p batch (one launch)


@dataclass
class _Replay:
    ex: Exchange
    topology: object
    steps: list[list[_Step]] = field(default_factory=list)
    held: list[list[tuple[Region, tuple[int, ...], tuple]]] = field(default_factory=list)
    batch: list[set | None] = field(default_factory=list)  # per device, the open batch's receives
    # per device, (key, region) of the blocks it holds at the end
    finals: list[list[tuple]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.topology.world_size
        self.steps = [[] for _ in range(n)]
        self.held = [[] for _ in range(n)]
        self.batch = [None] * n
        self.finals = [[] for _ in range(n)]
        for reg, dev, slices in self.ex.sources:
            self.held[dev].append((reg, slices, ORIGIN))

    def emit(self, dev: int, step: _Step) -> None:
        """Append a step; a Send or Recv opens a p2p batch after a kernel, at the start, and
        where a send forwards a block its own batch receives (`program.p2p_batches`)."""
        if step.kind in ("send", "recv"):
            got = self.batch[dev]
            if got is None or (step.kind == "send" and step.direct and step.key in got):
                step.opens = True
                got = self.batch[dev] = set()
            if step.kind == "recv":
                got.add(("tag", step.tag))
        elif step.kind in ("reduce", "pack"):  # kernels: the next send or receive opens a batch
            self.batch[dev] = None
        self.steps[dev].append(step)

    def find(self, dev: int, reg: Region, slices: tuple[int, ...]) -> tuple[tuple, bool, bool]:
        """The key of the block a step on `dev` reads for `reg`, whether it is strided, and
        whether it is the held block itself; a contained block is sliced (the device waits
        for it). Not held: a producer piece."""
        held = self.held[dev]
        for r, s, k in held:
            if s == slices and r == reg:
                return k, False, True
        for r, s, k in held:
            if s == slices and contains(r, reg):
                self.emit(dev, _Step("slice", waits=(k,)))
                return k, not contiguous_slice(region_shape(r), relative(reg, r)), False
        return ORIGIN, False, True

    def build(self) -> None:
        ex = self.ex
        events = sorted([(t.round, 0, i) for i, t in enumerate(ex.transfers)]
                        + [(r.round, 1, i) for i, r in enumerate(ex.reduces)])
        # a device's strided sends of a round share one pack kernel, run before the first
        groups = pack_groups(ex)
        grouped = {j for group in groups.values() for j in group}
        tag = 0
        for _, kind, i in events:
            if kind == 0:
                t = ex.transfers[i]
                if i in groups:
                    self.emit(t.src, _Step("pack", nbytes=sum(ex.transfers[j].nbytes
                                                              for j in groups[i])))
                key, strided, direct = self.find(t.src, t.region, t.slices)
                strided = strided and i not in grouped
                for a, c in zip(t.hops, t.hops[1:]):
                    self.emit(a, _Step("send", key=key, peer=c, tag=tag, nbytes=t.nbytes,
                                       pack=strided, direct=direct))
                    self.emit(c, _Step("recv", tag=tag))
                    key, strided, direct = ("tag", tag), False, True
                    tag += 1
                    if c != t.dst and not t.slices:
                        self.held[c].append((t.region, (), key))
                if len(t.hops) >= 2:
                    self.held[t.dst].append((t.region, t.slices, key))
                    self.finals[t.dst].append((key, t.region))
            else:
                r = ex.reduces[i]
                ins = tuple(self.find(r.device, r.region, s)[0] for s in r.inputs)
                out = ("reduce", i)
                self.emit(r.device, _Step("reduce", waits=ins, key=out, nbytes=r.nbytes))
                self.held[r.device].append((r.region, r.out, out))
                self.finals[r.device].append((out, r.region))

    def flow(self, sender: int, send: _Step) -> Flow:
        """A send's hop as one flow over its link and the ports it names."""
        link = self.topology.link(sender, send.peer)
        return Flow(send.tag, ((link.resource, link.bw),) + tuple(link.port_resources),
                    link.latency_s, float(send.nbytes), ends=(sender, send.peer))

    def one_shot(self) -> tuple[float, float] | None:
        """The common case without the event loop: every send reads a producer piece, no
        device reduces and no device sends one peer twice, so nothing a device does waits
        on the network or on its line; each device posts its sends in order (a launch for
        its batch, a pack before each strided one) and the replay is the network draining
        them. None otherwise."""
        topo = self.topology
        devices = topo.devices
        t = [0.0] * len(self.steps)
        sends: list[tuple[int, _Step, float]] = []  # (sender, send, when it is posted)
        received: dict[int, float] = {}  # tag -> when its receive is posted
        for a, steps in enumerate(self.steps):
            dev = devices[a]
            peers: set[int] = set()
            for s in steps:
                if s.kind == "reduce" or any(k != ORIGIN for k in s.waits) or \
                        (s.kind == "send" and (s.key != ORIGIN or s.peer in peers)):
                    return None
                t[a] += dev.launch_s if s.opens else 0.0
                if s.kind == "pack" or (s.kind == "send" and s.pack):
                    t[a] += copy_s(dev, 2 * s.nbytes)
                if s.kind == "send":
                    peers.add(s.peer)
                    sends.append((a, s, t[a]))
                elif s.kind == "recv":
                    received[s.tag] = t[a]
        posted: dict[float, list[Flow]] = {}
        for a, s, at in sends:  # a rendezvous leaves once its receive is posted too
            at = max(at, received[s.tag]) if rendezvous(s.nbytes) else at
            posted.setdefault(at, []).append(self.flow(a, s))
        net = Network()
        for at in sorted(posted):
            net.advance(at)
            net.start_all(posted[at])
        net.advance(math.inf)
        return self._end(t, {("tag", tg): at for tg, at in net.arrived.items()})

    def _end(self, t: list[float], ready: dict) -> tuple[float, float]:
        """(When the last device is done, when it would be without the stitching copies): per
        device, the blocks it holds are there, its copies of own parts ran as soon as its
        part of the program did (they wait for nothing), and the other copies once the
        received parts they read arrived. Copies touch no link, so both ends come from one
        run."""
        devices = self.topology.devices
        total = {d: (b, k) for d, b, k in self.ex.copies}
        early = {d: (b, k) for d, b, k in self.ex.early}
        copied: dict[int, list[Region]] = {}
        for d, reg in self.ex.copied:
            copied.setdefault(d, []).append(reg)
        end = wire = 0.0
        for d in range(len(self.steps)):
            if not self.steps[d] and d not in total:
                continue
            dev = devices[d]
            eb, ek = early.get(d, (0, 0))
            tb, tk = total.get(d, (0, 0))
            held = [ready[k] for k, _ in self.finals[d]]
            wire = max([wire, t[d]] + held)
            first = t[d] + (copy_s(dev, 2 * eb, ek) if ek else 0.0)
            if tk > ek:
                read = [ready[k] for k, reg in self.finals[d]
                        if any(intersect(reg, c) is not None for c in copied.get(d, ()))]
                first = max([first] + read) + copy_s(dev, 2 * (tb - eb), tk - ek)
            end = max([end, first] + held)
        return end, wire

    def run(self) -> tuple[float, float]:
        quick = self.one_shot()
        if quick is not None:
            return quick
        topo = self.topology
        devices = topo.devices
        n = len(self.steps)
        net = Network()
        ready: dict[tuple, float] = {ORIGIN: 0.0}
        t = [0.0] * n
        pc = [0] * n
        lines: dict[tuple[int, int], list[list]] = {}  # (sender, peer) -> [[step, posted at]]
        received: dict[int, float] = {}  # tag -> when its receive was posted
        busy: dict[int, tuple[int, int]] = {}  # tag on a line now -> that line

        def arrive(tags: list[int]) -> None:
            for tg in tags:
                ready[("tag", tg)] = net.arrived[tg]

        def done(tag: int) -> None:  # its last byte left: the line takes its next send
            line = busy.pop(tag, None)
            if line is not None and lines[line]:
                lines[line][0][1] = max(lines[line][0][1], net.now)

        net.on_done = done
        free = lambda line: line not in busy.values()  # noqa: E731

        def leaves(s: _Step, p: float) -> float:
            """When a send posted at p can leave: its block there, and for a rendezvous its
            receive posted (inf: not yet known)."""
            if s.key not in ready:
                return math.inf
            if rendezvous(s.nbytes):
                return max(p, ready[s.key], received.get(s.tag, math.inf))
            return max(p, ready[s.key])

        def next_send() -> float:
            heads = [ln[0] for line, ln in lines.items() if ln and free(line)]
            return min((leaves(s, p) for s, p in heads), default=math.inf)

        def issue(now: float) -> None:
            flows = []
            for line, ln in lines.items():
                if ln and leaves(*ln[0]) <= now and free(line):
                    flows.append(self.flow(line[0], ln.pop(0)[0]))
                    busy[flows[-1].tag] = line
            net.start_all(flows)

        def step(r: int) -> bool:
            s = self.steps[r][pc[r]]
            if any(k not in ready for k in s.waits):
                return False
            dev = devices[r]
            start = max([t[r]] + [ready[k] for k in s.waits])
            dt = dev.launch_s if s.opens else 0.0
            if s.kind == "send":
                if s.pack:
                    dt += copy_s(dev, 2 * s.nbytes)
                t[r] = start + dt
                lines.setdefault((r, s.peer), []).append([s, t[r]])
            elif s.kind == "reduce":
                dt += copy_s(dev, (len(s.waits) + 1) * s.nbytes)
                t[r] = start + dt
                ready[s.key] = t[r]
            elif s.kind == "pack":  # one kernel packing the strided sends of its group
                t[r] = start + dt + copy_s(dev, 2 * s.nbytes)
            else:
                t[r] = start + dt
                if s.kind == "recv":
                    received[s.tag] = t[r]
            pc[r] += 1
            return True

        while True:
            runnable = [r for r in range(n) if pc[r] < len(self.steps[r])]
            movable = [r for r in runnable if all(k in ready for k in self.steps[r][pc[r]].waits)]
            t_rank = min((t[r] for r in movable), default=math.inf)
            t_send, t_net = next_send(), net.next_done()
            if t_rank == t_send == t_net == math.inf:
                if runnable:  # a step waits for a block no send will bring: a broken program
                    raise RuntimeError("exchange replay stalled: a device waits for a block "
                                       "that is never sent")
                break
            # at one instant: the devices' steps first, then arrivals, then every send that
            # can leave, started together (the rates are filled once)
            if t_rank <= min(t_net, t_send):
                r = min(movable, key=lambda k: (t[k], k))
                if t[r] > net.now:
                    arrive(net.advance(t[r]))
                # run r on while nothing can happen before its next step: its steps read
                # only blocks already there, and a send or receive it posts bounds it from
                # then on
                bound = min(t_net, t_send)
                while step(r):
                    s = self.steps[r][pc[r] - 1]
                    if s.kind in ("send", "recv"):  # a receive may free a rendezvous send
                        bound = min(bound, t[r])
                    if pc[r] == len(self.steps[r]) or t[r] > bound:
                        break
            elif t_net <= t_send:
                arrive(net.advance(t_net))
            else:
                arrive(net.advance(t_send))
                issue(t_send)
        return self._end(t, ready)


def replay_time(ex: Exchange, topology) -> float:
    """Seconds `ex` takes run as its programs (module docstring)."""
    return replay_parts(ex, topology)[0]


def replay_parts(ex: Exchange, topology) -> tuple[float, float]:
    """(seconds, the seconds without the readers' stitching copies): the copies' own share
    of the time is the difference (they overlap the transfers where they can)."""
    if not ex:
        return 0.0, 0.0
    rp = _Replay(ex, topology)
    rp.build()
    return rp.run()
