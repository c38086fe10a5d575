"""Gradients sent as soon as they are computed: an exchange's instructions split in two.

Nothing in a training step waits for an optimizer update (`handoff.streamed_gradients`), so
lowering synthesises a gradient's exchange right after the op that computes it and keeps in
place only what does not wait for an arrival: sends of blocks the rank holds, receive
postings, allocations, and the packs and views of blocks the rank holds. Everything that
reads a received block (a fold, a stitch, a view of it, a relay's forward) or reads what
such an instruction wrote is deferred to just before the update that reads the gradient.
The transfers then run behind the rest of the backward, as FSDP's reduce-scatter does.
(A relay's forward sent now would wait on the rank's line to that peer for a block whose
sender may have deferred it, and every later send to that peer behind it: sends to one
peer leave in program order.)

On a device with a side stream (`Device.prefetch_stream`: a GPU) the folds go now too, on
that stream (`Reduce.queue`), each once its inputs are there, as NCCL's reduce-scatter
kernel folds beside the compute; a send of a fold's result waits on its line, not on the
rank. Only what the compute stream would read is deferred. Every send and fold that goes
now waits only on sends that went now, so no rank waits on a deferred instruction before it
reaches it.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from ..core.program import Alloc, Assemble, Recv, Reduce, Send, Unpack, reads, writes

# The queue number a fold on the side stream carries (`Reduce.queue`).
SIDE_QUEUE = 1


def defer_reads(instrs: list[list], marks: list[int], side: Sequence[bool]) -> list[list]:
    """Each rank's instructions after its mark, split (module docstring): those that go now
    stay in `instrs`, the deferred ones are returned per rank, in program order. `side`:
    per rank, whether its device folds on a side stream."""
    later: list[list] = []
    for rank, prog in enumerate(instrs):
        tail = prog[marks[rank]:]
        del prog[marks[rank]:]
        arriving: set[int] = set()  # buffers filled off the compute stream (or views of them)
        folded: set[int] = set()    # of which the side stream's folds
        deferred: set[int] = set()  # buffers a deferred instruction writes
        out: list = []
        for ins in tail:
            read = set(reads(ins))
            if read & deferred:
                now = False
            elif isinstance(ins, Recv | Alloc):
                now = True
            elif isinstance(ins, Unpack):  # views of a packed block: its readers wait
                now = True
                if read & arriving:
                    arriving.update(part[0] for part in ins.parts)
            elif isinstance(ins, Reduce) and side[rank]:
                now = True
                ins = dataclasses.replace(ins, queue=SIDE_QUEUE)
                folded.add(ins.out)
            elif isinstance(ins, Send):  # not a relay's forward of a received block
                now = not (read & arriving) - folded
            else:
                now = not (isinstance(ins, Reduce | Assemble) or read & arriving)
            if now:
                prog.append(ins)
                if isinstance(ins, Recv) or isinstance(ins, Reduce) and ins.queue:
                    arriving.add(ins.out)
            else:
                out.append(ins)
                w = writes(ins)
                if w is not None:
                    deferred.add(w)
        later.append(out)
    return later
