"""Exchanges sent before their reader's turn: an exchange's instructions split in two.

Lowering emits an exchange early in two cases: a training step's gradient right after the op
that computes it (nothing in a step waits for an optimizer update,
`handoff.streamed_gradients`), and the inputs of the next op that are made already before an
op's kernels (`lower(ahead=True)`), so that the transfers run behind those kernels instead of
starting when the reader's turn comes. It keeps in place only what does not wait for an
arrival: sends of blocks the rank holds, receive postings, allocations, and the packs and
views of blocks the rank holds. Everything that reads a received block (a fold, a stitch, a
view of it, a relay's forward) or reads what such an instruction wrote is deferred to just
before the reader. A gradient's transfers then run behind the rest of the backward, as
FSDP's reduce-scatter does. (A relay's forward sent now would wait on the rank's line to
that peer for a block whose sender may have deferred it, and every later send to that peer
behind it: sends to one peer leave in program order.)

On a device with a side stream (`Device.prefetch_stream`: a GPU) the folds and stitches go
now too, on that stream (`Reduce.queue`, `Assemble.queue`), each once its inputs are there,
as NCCL's reduce-scatter kernel folds beside the compute and writes its output in place; a
send of a fold's result waits on its line, not on the rank. The messages that go now are
that stream's too (`Send.side`): their batches are launched there, apart from the compute
stream's. Only what the compute stream would read is deferred. Every send and fold that goes
now waits only on sends that went now, so no rank waits on a deferred instruction before it
reaches it.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ..core.program import Alloc, Assemble, Recv, Reduce, Send, Unpack, reads, writes

# The queue number a fold or stitch on the side stream carries (`Reduce.queue`,
# `Assemble.queue`).
SIDE_QUEUE = 1


def defer_reads(instrs: list[list], marks: list[int], side: Sequence[bool]) -> list[list]:
    """Each rank's instructions after its mark, split (module docstring): those that go now
    stay in `instrs`, the deferred ones are returned per rank, in program order. `side`:
    per rank, whether its device folds on a side stream.

    A message whose send is deferred on its rank (a relay's forward) is received where it is
    sent, deferred too, as lowering emitted the pair: so a fold or stitch on the side stream
    that reads it is deferred (the executors wait for a side copy's parts before they queue
    it), and a packed receive still comes after the sends it packs (`coalesce.py`). Which
    messages are deferred depends on which folds are, so the split is repeated with the
    messages found late until it holds (the set only grows)."""
    tails = [prog[mark:] for prog, mark in zip(instrs, marks)]
    late: set[int] = set()  # tags of messages some rank sends late
    while True:
        split = [_split(tail, side[rank], late) for rank, tail in enumerate(tails)]
        found = {i.tag for _, out in split for i in out if isinstance(i, Send)}
        if found <= late:
            break
        late |= found
    for prog, mark, (now, _) in zip(instrs, marks, split):
        del prog[mark:]
        prog.extend(now)
    return [out for _, out in split]


def _split(tail: list, side: bool, late: set[int]) -> tuple[list, list]:
    """One rank's tail as (now, deferred), messages tagged in `late` known to come late."""
    arriving: set[int] = set()  # buffers filled off the compute stream (or views of them)
    folded: set[int] = set()    # of which the side stream's folds
    deferred: set[int] = set()  # buffers a deferred instruction writes
    now_part: list = []
    out: list = []
    for ins in tail:
        read = set(reads(ins))
        if read & deferred or isinstance(ins, Recv) and ins.tag in late:
            now = False  # a late message is posted where it is sent, as lowering emits it
        elif isinstance(ins, Recv | Alloc):
            now = True
        elif isinstance(ins, Unpack):  # views of a packed block: its readers wait
            now = True
            if read & arriving:
                arriving.update(part[0] for part in ins.parts)
        elif isinstance(ins, Reduce | Assemble) and side:
            now = True
            ins = dataclasses.replace(ins, queue=SIDE_QUEUE)
            folded.add(ins.out)
        elif isinstance(ins, Send):  # not a relay's forward of a received block
            now = not (read & arriving) - folded
        else:
            now = not (isinstance(ins, Reduce | Assemble) or read & arriving)
        if now:
            if isinstance(ins, Send | Recv) and side:
                ins = dataclasses.replace(ins, side=True)  # launched on the side stream
            now_part.append(ins)
            if isinstance(ins, Recv) or isinstance(ins, Reduce | Assemble) and ins.queue:
                arriving.add(ins.out)
        else:
            out.append(ins)
            deferred.update(_written(ins))
    return now_part, out


def _written(ins) -> set[int]:
    """The buffers `ins` writes: its output, or an Unpack's parts (and where they land)."""
    if isinstance(ins, Unpack):
        return {b for out, _, into, _ in ins.parts for b in (out, into) if b is not None}
    w = writes(ins)
    return set() if w is None else {w}
