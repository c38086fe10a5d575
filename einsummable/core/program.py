"""The instruction set every executor runs: one straight-line Program per rank.

Buffers are integers unique across all ranks of one lowering. Regions inside instructions are
*relative* to the buffer they read (Slice, Assemble) or global (Place, Const, Compute ranges).
Every rank's program is a subsequence of one global order, so sends and receives between any
pair appear in the same order on both sides and an executor that posts receives early and
waits on a buffer only when it is read cannot deadlock.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .geometry import Region


@dataclass(frozen=True)
class Place:
    """The caller's block `region` of graph input `tensor` lives here (weights stay resident)."""
    out: int
    tensor: str
    region: Region


@dataclass(frozen=True)
class Const:
    """Generate block `region` of constant `tensor` locally (constants are never sent)."""
    out: int
    tensor: str
    region: Region


@dataclass(frozen=True)
class Compute:
    """Run op `op` on input buffers for the tuple with global per-mode `ranges`."""
    out: int
    op: str
    ranges: tuple[tuple[int, int], ...]
    inputs: tuple[int, ...]


@dataclass(frozen=True)
class Slice:
    out: int
    src: int
    region: Region  # relative to src


@dataclass(frozen=True)
class Alloc:
    """An uninitialised buffer that receives land in directly (see Recv.into); no kernel."""
    out: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Assemble:
    """Buffer `out` of `shape` filled from parts (src buffer, region in src, region in out):
    a new buffer, or with `alloc` False the Alloc'd one whose other regions receives fill.
    `queue` > 0: a prefetched weight's copies, run on the device's copy stream beside its
    kernels (`Device.prefetch_stream`) as the weight's prefetch queue `queue` arrives; readers of
    `out` wait for them."""
    out: int
    shape: tuple[int, ...]
    dtype: str
    parts: tuple[tuple[int, Region, Region], ...]
    alloc: bool = True
    queue: int = 0


@dataclass(frozen=True)
class Send:
    """Send buffer `src`. `queue` 0 goes at once; queue q > 0 is a prefetch (weights): the
    rank's prefetches go out one queue number after another, like kernels on one NCCL stream,
    so the first-needed weights are not slowed by later ones sharing the link. `side`: a
    message an early exchange sends before its reader's turn (a streamed gradient's, or the
    next op's input sent ahead, `backend/early.py`) on a device with a side stream: its batch
    is launched there, apart from the compute stream's messages."""
    src: int
    peer: int
    tag: int
    queue: int = 0
    side: bool = False


@dataclass(frozen=True)
class Recv:
    """Receive into a new buffer `out`, or with `into` set straight into region `at` (contiguous)
    of that Alloc'd buffer, `out` naming the view: no copy into place afterwards. A reader of
    `into` waits for every receive into it."""
    out: int
    peer: int
    tag: int
    shape: tuple[int, ...]
    dtype: str
    into: int | None = None
    at: Region | None = None
    side: bool = False  # as `Send.side`


@dataclass(frozen=True)
class Pack:
    """Buffers `srcs`, flattened and laid end to end in one 1-D buffer `out` (one copy), so
    that several blocks for one peer travel as one message."""
    out: int
    srcs: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Unpack:
    """The parts of packed buffer `src`, in order: (out, shape, into, at). A part with `into`
    None becomes buffer `out`, a view of `src`; with `into` set it is copied into region `at`
    of that Alloc'd buffer (as a Recv with `into` would land it) and read through it.
    Executors may defer the views and copies until a reader needs them, as for a Recv."""
    src: int
    parts: tuple[tuple[int, tuple[int, ...], int | None, Region | None], ...]
    dtype: str


@dataclass(frozen=True)
class Reduce:
    """Fold input buffers with the aggregation `agg` (sum, max, ...); one input is a rename.
    `queue` > 0: a streamed gradient's fold (`backend/early.py`), run on the device's side
    stream (`Device.prefetch_stream`) once its inputs are there; readers wait for it as for
    a receive."""
    out: int
    agg: str
    inputs: tuple[int, ...]
    queue: int = 0


@dataclass(frozen=True)
class Free:
    buf: int


@dataclass(frozen=True)
class Output:
    """Graph output `tensor` (whole) is buffer `src` on this rank."""
    tensor: str
    src: int


@dataclass(frozen=True)
class Keep:
    """Buffer `src` is kept by this rank after the run as its block `region` of graph input
    `tensor`: the block its `Place(tensor, region)` reads next run, instead of the caller's
    (an output handed on to the next call in its paired input's layout, `backend/carry.py`)."""
    src: int
    tensor: str
    region: Region


Instr = (Place | Const | Compute | Slice | Alloc | Assemble | Send | Recv | Pack | Unpack | Reduce
         | Free | Output | Keep)
KINDS: dict[str, type] = {c.__name__.lower(): c for c in (Place, Const, Compute, Slice, Alloc,
                                                          Assemble, Send, Recv, Pack, Unpack,
                                                          Reduce, Free, Output, Keep)}


def reads(ins: Instr) -> tuple[int, ...]:
    """Buffers an instruction reads."""
    if isinstance(ins, Compute | Reduce):
        return ins.inputs
    if isinstance(ins, Pack):
        return ins.srcs
    if isinstance(ins, Unpack):
        return (ins.src,)
    if isinstance(ins, Slice):
        return (ins.src,)
    if isinstance(ins, Assemble):
        return tuple(p[0] for p in ins.parts)
    if isinstance(ins, Send | Output | Keep):
        return (ins.src,)
    return ()


def batch_keepers(instrs) -> list[bool]:
    """Per instruction, whether it is host bookkeeping that leaves an open point-to-point
    batch open: Slice views, Free, Place, Alloc, Unpack (views), and an Assemble none of whose
    parts was received (a local copy that waits on no message: the own half of a gathered
    weight, written beside the half a receive lands in). Send and Recv are the batch itself;
    anything else ends it."""
    received: set[int] = set()  # buffers a receive filled (or landed in), and their views
    keep: list[bool] = []
    for ins in instrs:
        if isinstance(ins, Recv):
            received.update((ins.out, ins.into))
        elif isinstance(ins, Unpack):
            received.update(b for out, _, into, _ in ins.parts for b in (out, into))
        elif isinstance(ins, Slice) and ins.src in received:
            received.add(ins.out)
        keep.append(isinstance(ins, Slice | Free | Place | Alloc | Unpack)
                    or (isinstance(ins, Assemble) and not any(p[0] in received
                                                              for p in ins.parts)))
    return keep


def p2p_batches(instrs) -> set[int]:
    """Indices of the instructions that open a point-to-point batch: each run of Send/Recv
    goes out as one batch_isend_irecv (one NCCL group: one kernel launch). Host bookkeeping
    between them (`batch_keepers`) does not end the run; a kernel does, and so does
    forwarding a buffer the run itself receives (a relay must wait for it), and a message
    for the other stream (`Send.side`: a side stream's batch holds only its messages)."""
    opens: set[int] = set()
    open_recvs: set[int] | None = None  # buffers received by the open batch; None: no batch
    side = False  # the open batch's stream
    for i, (ins, keep) in enumerate(zip(instrs, batch_keepers(instrs))):
        if keep:
            continue
        if not isinstance(ins, Send | Recv):
            open_recvs = None
            continue
        if (open_recvs is None or ins.side != side
                or (isinstance(ins, Send) and ins.src in open_recvs)):
            opens.add(i)
            open_recvs, side = set(), ins.side
        if isinstance(ins, Recv):
            open_recvs.add(ins.out)
    return opens


def prefetch_batches(instrs, prefetched: set[int]) -> set[int]:
    """Indices (of `p2p_batches`) of the batches whose every Send and Recv carries a tag in
    `prefetched` (a weight prefetch's messages): a device with a prefetch stream launches
    them there, not before its kernels."""
    opens = p2p_batches(instrs)
    out: set[int] = set()
    start, pure = None, False
    for i, (ins, keep) in enumerate(zip(instrs, batch_keepers(instrs))):
        if i in opens or (not keep and not isinstance(ins, Send | Recv)):
            if start is not None and pure:
                out.add(start)
            start, pure = (i, True) if i in opens else (None, False)
        if start is not None and isinstance(ins, Send | Recv):
            pure = pure and ins.tag in prefetched
    if start is not None and pure:
        out.add(start)
    return out


def writes(ins: Instr) -> int | None:
    return getattr(ins, "out", None)


def _fmt_region(r) -> str:
    return "[" + ",".join(f"{a}:{b}" for a, b in r) + "]"


def format_instr(ins: Instr) -> str:
    if isinstance(ins, Place):
        return f"%{ins.out} = place {ins.tensor}{_fmt_region(ins.region)}"
    if isinstance(ins, Const):
        return f"%{ins.out} = const {ins.tensor}{_fmt_region(ins.region)}"
    if isinstance(ins, Compute):
        args = ", ".join(f"%{i}" for i in ins.inputs)
        return f"%{ins.out} = compute {ins.op}{_fmt_region(ins.ranges)}({args})"
    if isinstance(ins, Slice):
        return f"%{ins.out} = slice %{ins.src}{_fmt_region(ins.region)}"
    if isinstance(ins, Alloc):
        return f"%{ins.out} = alloc {list(ins.shape)} {ins.dtype}"
    if isinstance(ins, Assemble):
        parts = ", ".join(f"%{s}{_fmt_region(a)}->{_fmt_region(b)}" for s, a, b in ins.parts)
        into = "" if ins.alloc else " into"
        return f"%{ins.out} = assemble{into} {list(ins.shape)} {{{parts}}}"
    if isinstance(ins, Send):
        queue = f" (prefetch {ins.queue})" if ins.queue else ""
        return f"send %{ins.src} -> rank {ins.peer} #{ins.tag}{queue}"
    if isinstance(ins, Recv):
        into = "" if ins.into is None else f" into %{ins.into}{_fmt_region(ins.at)}"
        return f"%{ins.out} = recv {list(ins.shape)} <- rank {ins.peer} #{ins.tag}{into}"
    if isinstance(ins, Pack):
        return f"%{ins.out} = pack({', '.join(f'%{i}' for i in ins.srcs)})"
    if isinstance(ins, Unpack):
        parts = ", ".join(f"%{o} {list(shape)}" + ("" if into is None else
                                                    f" into %{into}{_fmt_region(at)}")
                          for o, shape, into, at in ins.parts)
        return f"unpack %{ins.src} -> {{{parts}}}"
    if isinstance(ins, Reduce):
        side = " (side stream)" if ins.queue else ""
        return f"%{ins.out} = reduce.{ins.agg}({', '.join(f'%{i}' for i in ins.inputs)}){side}"
    if isinstance(ins, Free):
        return f"free %{ins.buf}"
    if isinstance(ins, Keep):
        return f"keep %{ins.src} as {ins.tensor}{_fmt_region(ins.region)}"
    return f"output {ins.tensor} = %{ins.src}"


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


@dataclass(frozen=True)
class Program:
    rank: int
    world_size: int
    instrs: tuple[Instr, ...]

    def __str__(self) -> str:
        head = f"program rank {self.rank}/{self.world_size} ({len(self.instrs)} instructions)"
        return "\n".join([head] + ["  " + format_instr(i) for i in self.instrs])

    def to_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size,
                "instrs": [[type(i).__name__.lower(), asdict(i)] for i in self.instrs]}

    @staticmethod
    def from_dict(d: dict) -> "Program":
        out = []
        for kind, body in d["instrs"]:
            cls = KINDS[kind]
            out.append(cls(**{f.name: _tuplify(body[f.name]) for f in fields(cls) if f.name in body}))
        return Program(d["rank"], d["world_size"], tuple(out))


