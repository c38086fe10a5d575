"""Message coalescing: the blocks one rank sends another in one batch travel as one message.

Lowering emits a Send per block and region. Every message costs a transport a fixed price
(a gloo round of handshakes, an NCCL kernel launch and latency), so a rank that gathers a weight
from three peers in four blocks each waits on twelve messages where three would do. This pass
rewrites the programs so that, between a pair of ranks, the sends of one p2p batch (a run of
Send/Recv with no kernel between them, see `p2p_batches`) whose receives also fall in one
batch on the other side go as one:

    sender:    Pack(flat, srcs) just before the first of them; Send(flat) in its place
    receiver:  Recv(flat) where the last of them was; Unpack(flat -> the old buffers)

Only blocks small enough to be worth it are packed: a block joins when packing and unpacking
it (read and written twice at the devices' memory bandwidth) costs less than the message it
saves (`Device.message_s` of the sender and the receiver). Topologies whose transport has no
per-message cost (NCCL on GPUs: messages of a batch go out together) pack nothing.

A group has one dtype and goes out on the queue of its first block (prefetch queues are
numbered in program order, so the order of the stream is kept). Left out: a send whose
source is written at or after the group's first send in the same batch (a relay must wait for
its own receive), and a receive whose buffer (or the buffer it lands in) the batch itself reads
or frees. The programs stay a subsequence of one global order: the pack goes out no later than
the first block did, and the receiver takes it no earlier than its last block, so no rank waits
on a message that is sent later than before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..core.program import (
    Free,
    Pack,
    Program,
    Recv,
    Send,
    Unpack,
    batch_keepers,
    p2p_batches,
    reads,
    writes,
)
from ..frontend.ir import DTYPE_BYTES
from ..planning.prefetch import worth_packing

# Fewer blocks than this in a group are not worth a pack copy.
MIN_GROUP = 2


def _batch_ids(instrs) -> list[int | None]:
    """Per instruction, the number of the p2p batch it is in (None for kernels)."""
    opens = p2p_batches(instrs)
    ids: list[int | None] = []
    batch: int | None = None
    for i, (ins, keep) in enumerate(zip(instrs, batch_keepers(instrs))):
        if i in opens:
            batch = i
        elif not (keep or isinstance(ins, Send | Recv)):
            batch = None
        ids.append(batch)
    return ids


@dataclass
class _Group:
    sender: int
    receiver: int
    sends: list[int] = field(default_factory=list)  # indices in the sender's program



def coalesce(programs: tuple[Program, ...], topology: Any) -> tuple[Program, ...]:
    devices = topology.devices
    if not topology.charges_per_message:
        return programs
    instrs = [list(p.instrs) for p in programs]
    batches = [_batch_ids(x) for x in instrs]
    recv_at: dict[int, tuple[int, int]] = {}
    next_buf = next_tag = 0
    for r, x in enumerate(instrs):
        for i, ins in enumerate(x):
            if isinstance(ins, Recv):
                recv_at[ins.tag] = (r, i)
            if isinstance(ins, Send | Recv):
                next_tag = max(next_tag, ins.tag + 1)
            for b in (*reads(ins), writes(ins) or 0, getattr(ins, "into", None) or 0,
                      getattr(ins, "buf", 0)):
                next_buf = max(next_buf, b + 1)

    groups = [g for r in range(len(instrs)) for g in _sender_groups(r, instrs[r], batches[r],
                                                                     recv_at)]
    edits: list[dict[int, list]] = [{} for _ in instrs]  # index -> replacement instructions
    # One pack serves every peer that gets the same blocks in the same batch (a broadcast).
    packs: dict[tuple, tuple[int, int]] = {}  # (sender, batch, srcs) -> (packed buffer, index)
    last_use: dict[tuple[int, int], int] = {}  # (sender, packed buffer) -> index of last send
    for g in groups:
        recvs = [recv_at[instrs[g.sender][i].tag][1] for i in g.sends]
        keep = _receivable(instrs[g.receiver], batches[g.receiver], recvs)
        pairs = [(s, r) for s, r in zip(g.sends, recvs) if r in keep and worth_packing(
            math.prod(instrs[g.receiver][r].shape) * DTYPE_BYTES[instrs[g.receiver][r].dtype],
            devices[g.sender], devices[g.receiver])]
        if len(pairs) < MIN_GROUP:
            continue
        flat, tag = next_buf, next_tag
        next_buf, next_tag = next_buf + 2, next_tag + 1
        first = instrs[g.sender][pairs[0][0]]
        parts, total, dtype = [], 0, instrs[g.receiver][pairs[0][1]].dtype
        for _, ri in pairs:
            rv = instrs[g.receiver][ri]
            parts.append((rv.out, rv.shape, rv.into, rv.at))
            total += math.prod(rv.shape)
        srcs = tuple(instrs[g.sender][si].src for si, _ in pairs)
        key = (g.sender, batches[g.sender][pairs[0][0]], srcs)
        at = pairs[0][0]
        if key in packs and packs[key][1] < at:  # packed already, earlier in the program
            buf = packs[key][0]
            edits[g.sender][at] = [Send(buf, g.receiver, tag, first.queue, first.side)]
        else:
            buf = flat
            packs.setdefault(key, (flat, at))
            edits[g.sender][at] = [Pack(flat, srcs, dtype),
                                   Send(flat, g.receiver, tag, first.queue, first.side)]
        last_use[(g.sender, buf)] = max(last_use.get((g.sender, buf), -1), at)
        for si, _ in pairs[1:]:
            edits[g.sender][si] = []
        last = max(ri for _, ri in pairs)
        for _, ri in pairs:
            edits[g.receiver][ri] = []
        edits[g.receiver][last] = [Recv(flat + 1, g.sender, tag, (total,), dtype, side=first.side),
                                   Unpack(flat + 1, tuple(parts), dtype), Free(flat + 1)]
    for (sender, buf), at in last_use.items():
        edits[sender][at] = edits[sender][at] + [Free(buf)]
    return tuple(Program(p.rank, p.world_size,
                         tuple(y for i, ins in enumerate(instrs[r])
                               for y in edits[r].get(i, [ins])))
                 for r, p in enumerate(programs))


def _sender_groups(rank: int, instrs: list, batch: list, recv_at: dict) -> list[_Group]:
    """Per batch, the sends to each peer, minus relays of this batch."""
    written: dict[int, int] = {}
    for i, ins in enumerate(instrs):
        for b in (writes(ins), getattr(ins, "into", None)):
            if b is not None:
                written[b] = i  # the last write (a buffer is written once, or filled in place)
    open_: dict[tuple, _Group] = {}
    out: list[_Group] = []
    for i, ins in enumerate(instrs):
        if not isinstance(ins, Send) or ins.tag not in recv_at or batch[i] is None:
            continue
        r, j = recv_at[ins.tag]
        key = (batch[i], ins.peer)
        g = open_.get(key)
        start = g.sends[0] if g else i
        if written.get(ins.src, -1) >= start:
            continue  # a relay of this batch: it must wait for its own receive
        if g is None:
            g = open_[key] = _Group(rank, r)
            out.append(g)
        g.sends.append(i)
    return out


def _receivable(instrs: list, batch: list, recvs: list[int]) -> set[int]:
    """The receives (indices) that can be taken as one message at the last of them: the
    largest batch's worth, with one dtype, whose buffers that batch neither reads nor frees."""
    by_batch: dict[tuple, list[int]] = {}
    for j in recvs:
        if batch[j] is not None:
            by_batch.setdefault((batch[j], instrs[j].dtype), []).append(j)
    if not by_batch:
        return set()
    chosen = max(by_batch.values(), key=len)
    b = batch[chosen[0]]
    span = [i for i, bid in enumerate(batch) if bid == b]
    touched, read = set(), set()
    for i in span:
        read.update(reads(instrs[i]))
        if isinstance(instrs[i], Free):
            touched.add(instrs[i].buf)
    touched |= read
    # A receive into a buffer is read through that buffer (its own name is freed at once),
    # or sent on under its own name (a relay forwarding the part where it landed).
    return {j for j in chosen
            if (instrs[j].out not in touched if instrs[j].into is None
                else instrs[j].into not in touched and instrs[j].out not in read)}
