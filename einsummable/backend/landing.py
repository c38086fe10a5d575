"""Receives landed in place: a received block that an Assemble only copies into a region of
its buffer is received straight into that region instead (one pass over a rank's program,
run by lowering after everything is emitted). The copy the Assemble would have made is gone;
a transport writes one contiguous range, so only contiguous regions qualify."""
from __future__ import annotations

from dataclasses import replace

from ..core.geometry import Region, contiguous_slice
from ..core.program import Alloc, Assemble, Recv, Send, reads


def recv_in_place(instrs: list) -> list:
    """Receives that an Assemble only copies into place land there directly instead.

    A part qualifies when it is a whole received buffer that nothing else reads but sends (a
    relay forwarding it sends the view, as a ring's members forward from their output buffer)
    and its region of the assembled buffer is contiguous (a transport writes one contiguous
    range). Its Recv then targets that region of an Alloc placed before the first such Recv;
    the Assemble keeps the other parts (filling the Alloc'd buffer) or disappears when none
    are left."""
    readers: dict[int, int] = {}
    for ins in instrs:
        if isinstance(ins, Send):
            continue
        for b in reads(ins):
            readers[b] = readers.get(b, 0) + 1
    recv_at = {ins.out: i for i, ins in enumerate(instrs) if isinstance(ins, Recv)}
    moved: dict[int, tuple[int, Region]] = {}      # recv index -> (assembled buf, region)
    rewritten: dict[int, Assemble | None] = {}      # assemble index -> what replaces it
    alloc_at: dict[int, Alloc] = {}                 # index to insert an Alloc before
    for i, ins in enumerate(instrs):
        if not isinstance(ins, Assemble):
            continue
        direct, rest = [], []
        for part in ins.parts:
            src, a, b = part
            j = recv_at.get(src)
            ok = (j is not None and readers.get(src) == 1 and instrs[j].dtype == ins.dtype
                  and a == tuple((0, n) for n in instrs[j].shape) and contiguous_slice(ins.shape, b))
            (direct if ok else rest).append(part)
        if not direct:
            continue
        for src, _, b in direct:
            moved[recv_at[src]] = (ins.out, b)
        alloc_at[min(recv_at[src] for src, _, _ in direct)] = Alloc(ins.out, ins.shape, ins.dtype)
        rewritten[i] = (Assemble(ins.out, ins.shape, ins.dtype, tuple(rest), alloc=False,
                                 queue=ins.queue)
                        if rest else None)
    out = []
    for i, ins in enumerate(instrs):
        if i in alloc_at:
            out.append(alloc_at[i])
        if i in moved:
            buf, at = moved[i]
            out.append(replace(ins, into=buf, at=at))
        elif i in rewritten:
            if rewritten[i] is not None:
                out.append(rewritten[i])
        else:
            out.append(ins)
    return out
