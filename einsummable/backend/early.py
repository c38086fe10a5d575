"""Gradients sent as soon as they are computed: an exchange's instructions split in two.

Nothing in a training step waits for an optimizer update (`ir.streamed_gradients`), so
lowering synthesises a gradient's exchange right after the op that computes it and keeps in
place only what does not wait for an arrival: sends of blocks the rank holds, receive
postings, allocations, and the packs and views of blocks the rank holds. Everything that
reads a received block (a fold, a stitch, a view of it, a relay's forward) or reads what
such an instruction wrote is deferred to just before the update that reads the gradient.
(A relay's forward sent now would wait on the rank's line to that peer for a block whose
sender may have deferred it, and every later send to that peer behind it: sends to one
peer leave in program order.) The transfers then run behind the rest of the
backward, as FSDP's reduce-scatter does, and only the folds wait for the update.
"""
from __future__ import annotations

from ..core.program import Alloc, Assemble, Recv, Reduce, Unpack, reads, writes


def defer_reads(instrs: list[list], marks: list[int]) -> list[list]:
    """Each rank's instructions after its mark, split (module docstring): those that go now
    stay in `instrs`, the deferred ones are returned per rank, in program order."""
    later: list[list] = []
    for rank, prog in enumerate(instrs):
        tail = prog[marks[rank]:]
        del prog[marks[rank]:]
        arriving: set[int] = set()  # buffers a receive fills (or views of them)
        deferred: set[int] = set()  # buffers a deferred instruction writes
        out: list = []
        for ins in tail:
            read = set(reads(ins))
            if isinstance(ins, Recv):
                prog.append(ins)
                arriving.add(ins.out)
                continue
            if isinstance(ins, Unpack) and read & arriving and not read & deferred:
                prog.append(ins)  # views of a packed receive: its readers wait, it does not
                arriving.update(part[0] for part in ins.parts)
                continue
            waits = not isinstance(ins, Alloc) and (
                isinstance(ins, Reduce | Assemble) or bool(read & arriving))
            if waits or read & deferred:
                out.append(ins)
                w = writes(ins)
                if w is not None:
                    deferred.add(w)
            else:
                prog.append(ins)
        later.append(out)
    return later
