"""What a lowered program allocates: the bytes a rank holds after each instruction, by a walk
of its program (no kernel runs).

A buffer is a view of a storage. Storages are made by Place, Const, Compute, Alloc, an
Assemble that allocates, a Recv of a new buffer, Pack and a Reduce of several inputs; a Slice,
a Recv into an Alloc'd buffer, an Unpack part (a view of the packed buffer, or of the buffer it
is copied into), a one-input Reduce (a rename) and an Assemble into an Alloc'd buffer are views
of one already there. A storage lives while any buffer on it lives; Free ends a buffer. So

    live(pc) = sum over storages s alive after instruction pc of bytes(s)

with bytes(s) = prod(shape) x the dtype's bytes, and a placed block of a weight counted from
the start to the end (weights stay resident: the program's Free of it ends the view only).
Compute outputs are new storages; a view op's kernel may return a view of its input in
torch (`runtime/measure.py` counts what torch holds), which this walk does not assume.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.program import (
    Alloc,
    Assemble,
    Compute,
    Const,
    Free,
    Keep,
    Pack,
    Place,
    Program,
    Recv,
    Reduce,
    Slice,
    Unpack,
)
from ..core.geometry import region_shape
from ..frontend.ir import DTYPE_BYTES, Graph
from .lowering import Lowered

# The largest storages an account of a peak names.
TOP_BUFFERS = 5


@dataclass(frozen=True)
class RankPeak:
    """A rank's most bytes alive at once: after instruction `pc`, with the largest storages
    then alive as (buffer that made it, bytes)."""
    rank: int
    peak_bytes: int
    pc: int
    largest: tuple[tuple[int, int], ...]


def _nbytes(shape, dtype: str) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def _compute_shape(graph: Graph, ins: Compute) -> tuple[int, ...]:
    op = graph.op(ins.op)
    ext = {m: hi - lo for m, (lo, hi) in zip(op.modes, ins.ranges)}
    return tuple(math.prod(ext[m] for m in g) for g in op.out_dims)


class _Walk:
    """Buffers -> storages, storages -> (bytes, how many buffers view them)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.of: dict[int, int] = {}          # buffer -> storage (the buffer that made it)
        self.nbytes: dict[int, int] = {}      # buffer -> its own bytes (a view's: the view's)
        self.dtype: dict[int, str] = {}       # buffer -> dtype
        self.size: dict[int, int] = {}        # storage -> bytes
        self.users: dict[int, int] = {}       # storage -> live buffers on it
        self.pinned: set[int] = set()         # resident storages (placed weights)
        self.live = 0

    def new(self, buf: int, shape, dtype: str) -> None:
        n = _nbytes(shape, dtype)
        self.of[buf], self.nbytes[buf], self.dtype[buf] = buf, n, dtype
        self.size[buf], self.users[buf] = n, 1
        self.live += n

    def view(self, buf: int, base: int, shape, dtype: str) -> None:
        if buf in self.of:  # an Assemble into its own Alloc'd buffer
            return
        s = self.of[base]
        self.of[buf], self.nbytes[buf], self.dtype[buf] = s, _nbytes(shape, dtype), dtype
        self.users[s] += 1

    def free(self, buf: int) -> None:
        s = self.of.pop(buf, None)
        if s is None:
            return
        self.users[s] -= 1
        if self.users[s] == 0 and s not in self.pinned:
            self.live -= self.size.pop(s)
            del self.users[s]

    def step(self, ins) -> None:
        g = self.graph
        if isinstance(ins, Place | Const):
            info = g.tensor(ins.tensor)
            self.new(ins.out, region_shape(ins.region), info.dtype)
            if isinstance(ins, Place) and info.kind == "weight":
                self.pinned.add(ins.out)
        elif isinstance(ins, Compute):
            self.new(ins.out, _compute_shape(g, ins), g.tensor(g.op(ins.op).output).dtype)
        elif isinstance(ins, Alloc) or (isinstance(ins, Assemble) and ins.alloc):
            self.new(ins.out, ins.shape, ins.dtype)
        elif isinstance(ins, Recv):
            if ins.into is None:
                self.new(ins.out, ins.shape, ins.dtype)
            else:
                self.view(ins.out, ins.into, ins.shape, ins.dtype)
        elif isinstance(ins, Pack):
            n = sum(self.nbytes[b] for b in ins.srcs) // DTYPE_BYTES[ins.dtype]
            self.new(ins.out, (n,), ins.dtype)
        elif isinstance(ins, Unpack):
            for out, shape, into, _ in ins.parts:
                self.view(out, ins.src if into is None else into, shape, ins.dtype)
        elif isinstance(ins, Reduce):
            a = ins.inputs[0]
            shape = (self.nbytes[a] // DTYPE_BYTES[self.dtype[a]],)
            if len(ins.inputs) == 1:
                self.view(ins.out, a, shape, self.dtype[a])
            else:
                self.new(ins.out, shape, self.dtype[a])
        elif isinstance(ins, Slice):
            self.view(ins.out, ins.src, region_shape(ins.region), self.dtype[ins.src])
        elif isinstance(ins, Free):
            self.free(ins.buf)
        elif isinstance(ins, Keep):  # the rank holds a kept block past the run, Free or not
            self.pinned.add(self.of[ins.src])
        # Send and Output allocate nothing (an output is a buffer the program keeps)


def live_bytes(graph: Graph, prog: Program) -> list[int]:
    """The bytes the rank holds after each instruction of its program."""
    w = _Walk(graph)
    out = []
    for ins in prog.instrs:
        w.step(ins)
        out.append(w.live)
    return out


def program_peak(graph: Graph, prog: Program) -> RankPeak:
    """The rank's peak: its bytes, where (the first instruction after which it holds them),
    and the largest storages alive there."""
    live = live_bytes(graph, prog)
    if not live:
        return RankPeak(prog.rank, 0, 0, ())
    best = max(live)
    pc = live.index(best)
    w = _Walk(graph)
    for ins in prog.instrs[:pc + 1]:
        w.step(ins)
    largest = tuple(sorted(w.size.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_BUFFERS])
    return RankPeak(prog.rank, best, pc, largest)


def lowered_peaks(low: Lowered) -> tuple[RankPeak, ...]:
    """Every rank's peak (`program_peak`)."""
    return tuple(program_peak(low.graph, p) for p in low.programs)
