"""One rank's buffers and the meaning of every non-communicating instruction on them.

`RankState` holds a rank's buffers while its program runs; its handlers (one per instruction
type, `step_handler`) are shared by every executor: the in-process one (`local.py`), the
torch.distributed one (`dist.py`) and the bound straight-line runner (`straight.py`)."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping

import torch

from ...core.program import (
    Alloc,
    Assemble,
    Compute,
    Const,
    Free,
    Keep,
    Output,
    Pack,
    Place,
    Program,
    Recv,
    Reduce,
    Slice,
    Unpack,
)
from ...errors import RuntimeFault
from ...frontend.reference import TORCH_DTYPES, materialize, op_runner
from ...frontend.scalar import combine
from ..lowering import Lowered


KERNEL = "kernel"  # consts key tag of a Compute's bound kernel (constant blocks: by tensor)


def _sl(reg) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in reg)


def bind_compute(graph, ins: Compute, const_bufs: Mapping[int, torch.Tensor]
                 ) -> Callable[[dict], None]:
    """The instruction as one call on a rank's buffers: its op's kernel bound to its block
    ranges and to the operands `const_bufs` holds (constant blocks, for kernels specialised on
    their values), built once per plan so a run pays for the kernel only."""
    op = graph.op(ins.op)
    known = {i: const_bufs[b] for i, b in enumerate(ins.inputs) if b in const_bufs}
    kernel = op_runner(op, dict(zip(op.modes, ins.ranges)), known)
    dtype = TORCH_DTYPES[graph.tensor(op.output).dtype]
    srcs, out = ins.inputs, ins.out

    def run(bufs: dict) -> None:
        y = kernel([bufs[i] for i in srcs])
        bufs[out] = y if y.dtype == dtype else y.to(dtype)
    return run


class RankState:
    """One rank's buffers while its program runs; shared by the local and dist executors."""

    def __init__(self, low: Lowered, prog: Program, inputs: Mapping[str, torch.Tensor],
                 device: torch.device | str = "cpu", consts: dict | None = None,
                 resident: Mapping[tuple, torch.Tensor] | None = None) -> None:
        self.low, self.prog, self.inputs, self.device = low, prog, inputs, device
        # Blocks a previous run kept, by (input, region): what a Place of an input the caller
        # did not pass reads. `kept`: what this run's Keep instructions hand on.
        self.resident: Mapping[tuple, torch.Tensor] = {} if resident is None else resident
        self.kept: dict[tuple, torch.Tensor] = {}
        # Constant blocks and bound kernels depend on the plan only: a caller that runs a plan
        # again passes the same dict and they are made once (programs never write into a
        # buffer in place).
        self.consts: dict = {} if consts is None else consts
        self.graph = low.graph
        self.bufs: dict[int, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.const_bufs: dict[int, torch.Tensor] = {}  # buffers a Const filled: known values
        # On a GPU, a prefetched weight's copies run on a side stream (`Assemble.queue`);
        # buffer -> the event the compute stream waits on before its first read of it.
        self._cuda = torch.device(device).type == "cuda"
        self._side = None
        self.pending: dict[int, object] = {}

    def get(self, b: int) -> torch.Tensor:
        if self.pending:
            event = self.pending.pop(b, None)
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
        return self.bufs[b]

    def beside(self, ins):
        """Where an instruction's waits for its received parts go: a queued Assemble's or
        Reduce's on the side stream (on a GPU), so that the compute stream does not wait for
        them."""
        if self._cuda and isinstance(ins, Assemble | Reduce) and ins.queue:
            if self._side is None:
                self._side = torch.cuda.Stream(self.device)
            return torch.cuda.stream(self._side)
        return contextlib.nullcontext()

    def _runner(self, ins: Compute):
        return bind_compute(self.graph, ins, self.const_bufs)

    def step(self, ins) -> None:
        """Run one non-communicating instruction (one dict lookup picks its handler: the
        executors pay this per instruction, and most instructions are bookkeeping)."""
        step_handler(ins)(self, ins)

    def _place(self, ins: Place) -> None:
        self.bufs[ins.out] = self.place(ins.tensor, ins.region)

    def _const(self, ins: Const) -> None:
        key = (ins.tensor, ins.region)
        block = self.consts.get(key)
        if block is None:
            info = self.graph.tensor(ins.tensor)
            block = materialize(self.graph.constant[ins.tensor], info, ins.region, self.device)
            self.consts[key] = block
        self.bufs[ins.out] = self.const_bufs[ins.out] = block

    def _compute(self, ins: Compute) -> None:
        hit = self.consts.get((KERNEL, id(ins)))
        if hit is None or hit[0] is not ins:  # the instruction is kept: its id stays its
            hit = self.consts[(KERNEL, id(ins))] = (ins, self._runner(ins))
        hit[1](self.bufs)

    def _slice(self, ins: Slice) -> None:
        self.bufs[ins.out] = self.get(ins.src)[_sl(ins.region)]

    def _alloc(self, ins: Alloc) -> None:
        self.bufs[ins.out] = torch.empty(ins.shape, dtype=TORCH_DTYPES[ins.dtype],
                                         device=self.device)

    def _assemble(self, ins: Assemble) -> None:
        if self._cuda and ins.queue:
            self._assemble_beside(ins)
            return
        out = (torch.empty(ins.shape, dtype=TORCH_DTYPES[ins.dtype], device=self.device)
               if ins.alloc else self.get(ins.out))
        for src, a, b in ins.parts:
            out[_sl(b)] = self.get(src)[_sl(a)]
        self.bufs[ins.out] = out

    def _assemble_beside(self, ins: Assemble) -> None:
        """A prefetched weight's copies on the side stream, after what the compute stream
        has queued so far (its parts); the compute stream waits for them at the buffer's
        first read (`get`), not here."""
        compute = torch.cuda.current_stream(self.device)
        with self.beside(ins):
            self._side.wait_stream(compute)
            out = (torch.empty(ins.shape, dtype=TORCH_DTYPES[ins.dtype], device=self.device)
                   if ins.alloc else self.bufs[ins.out])
            for src, a, b in ins.parts:
                out[_sl(b)] = self.get(src)[_sl(a)]
            done = torch.cuda.Event()
            done.record(self._side)
        # the allocator must not hand the memory out again while the other stream uses it
        out.record_stream(compute if ins.alloc else self._side)
        self.bufs[ins.out] = out
        self.pending[ins.out] = done

    def _pack(self, ins: Pack) -> None:
        self.bufs[ins.out] = torch.cat([self.get(b).reshape(-1) for b in ins.srcs])

    def _unpack(self, ins: Unpack) -> None:
        for out, _, view, dest in self.unpacked(ins):
            if dest is None:
                self.bufs[out] = view
            else:  # read through the buffer it lands in (or sent on as that view), as
                dest.copy_(view)  # after a Recv into it
                self.bufs[out] = dest

    def _reduce(self, ins: Reduce) -> None:
        if self._cuda and ins.queue:
            self._reduce_beside(ins)
            return
        acc = self.get(ins.inputs[0])
        for i in ins.inputs[1:]:
            acc = combine(ins.agg, acc, self.get(i))
        self.bufs[ins.out] = acc

    def _reduce_beside(self, ins: Reduce) -> None:
        """A streamed gradient's fold on the side stream, after what the compute stream has
        queued so far (the local partial sum); the compute stream waits at the first read."""
        compute = torch.cuda.current_stream(self.device)
        with self.beside(ins):
            self._side.wait_stream(compute)
            parts = [self.get(i) for i in ins.inputs]
            acc = parts[0]
            for p in parts[1:]:
                acc = combine(ins.agg, acc, p)
            done = torch.cuda.Event()
            done.record(self._side)
        for p in parts:  # not handed out again while the side stream reads them
            p.record_stream(self._side)
        acc.record_stream(compute)
        self.bufs[ins.out] = acc
        self.pending[ins.out] = done

    def _free(self, ins: Free) -> None:
        self.bufs.pop(ins.buf, None)
        self.pending.pop(ins.buf, None)
        self.const_bufs.pop(ins.buf, None)

    def _output(self, ins: Output) -> None:
        self.outputs[ins.tensor] = self.get(ins.src)

    def _keep(self, ins: Keep) -> None:
        self.kept[(ins.tensor, tuple(ins.region))] = self.get(ins.src)

    def recv_buffer(self, ins: Recv) -> torch.Tensor:
        """Where a receive lands: a new buffer, or its region of an Alloc'd one."""
        if ins.into is None:
            t = torch.empty(ins.shape, dtype=TORCH_DTYPES[ins.dtype], device=self.device)
        else:
            t = self.get(ins.into)[_sl(ins.at)]
        self.bufs[ins.out] = t
        return t

    def unpacked(self, ins: Unpack):
        """(out, into, view of the packed buffer, destination view or None) per part: the
        part is the view itself, or is copied into its region of the Alloc'd buffer `into`."""
        flat = self.get(ins.src)
        offset = 0
        for out, shape, into, at in ins.parts:
            n = math.prod(shape)
            view = flat[offset:offset + n].view(shape)
            offset += n
            yield out, into, view, (None if into is None else self.get(into)[_sl(at)])

    def place(self, tensor: str, region) -> torch.Tensor:
        if tensor not in self.inputs:
            block = self.resident.get((tensor, tuple(region)))
            if block is None:
                raise RuntimeFault(f"input {tensor!r} was neither passed nor kept by an "
                                   f"earlier run (block {list(region)})",
                                   fix="pass it on the first run of the plan")
            return block
        dtype = TORCH_DTYPES[self.graph.tensor(tensor).dtype]
        return self.inputs[tensor][_sl(region)].to(device=self.device, dtype=dtype)


_STEP = {Place: RankState._place, Const: RankState._const, Compute: RankState._compute,
         Slice: RankState._slice, Alloc: RankState._alloc, Assemble: RankState._assemble,
         Pack: RankState._pack, Unpack: RankState._unpack, Reduce: RankState._reduce,
         Free: RankState._free, Output: RankState._output, Keep: RankState._keep}


def step_handler(ins) -> Callable[[RankState, object], None]:
    """The RankState method that runs a non-communicating instruction (executors that run a
    plan again look it up once)."""
    handler = _STEP.get(type(ins))
    if handler is None:
        raise TypeError(ins)
    return handler


