"""A rank's program with no messages, bound once into one closure per instruction.

A one-device plan, or a rank whose work is replicated, has nothing to post or wait for: its
instructions run in order. On small blocks the executor's per-instruction work (handler
lookup, wait checks, the kernel cache probe, a RankState's set-up) is then a large share of
the run: 70 instructions of the llama-tiny block at 128 tokens cost about 0.13 ms of dispatch
against about 0.55 ms of kernels. `straight_runner` binds what depends on the plan only (each
kernel with its block ranges and known constant operands, each Place's block key, each Const's
block) when a plan first runs, and keeps it in the plan's `consts` dict; a run is then one
call per instruction on a dict of buffers. Instructions that are not on the small-block hot
path (Alloc, Assemble, Pack, Unpack, Reduce, Slice) run through the RankState handler that the
message-passing executors use, so both paths share one meaning of every instruction.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...core.program import Compute, Const, Free, Output, Place, Program, Recv, Send
from .rank_state import RankState, bind_compute, step_handler

Step = Callable[[RankState], None]
_STRAIGHT = "straight"  # consts key of a program's bound steps
_MESSAGES = "straight?"  # consts key of whether a program runs straight


def has_messages(prog: Program) -> bool:
    return any(isinstance(ins, (Send, Recv)) for ins in prog.instrs)


def runs_straight(consts: dict, prog: Program) -> bool:
    """Whether `prog` has no sends or receives, worked out once per plan (kept in `consts`)."""
    hit = consts.get(_MESSAGES)
    if hit is None or hit[0] is not prog:
        hit = consts[_MESSAGES] = (prog, not has_messages(prog))
    return hit[1]


def straight_runner(st: RankState) -> Callable[[], None]:
    """Run `st`'s program (which must send and receive nothing) to its end; the bound steps
    are built on the first call for this program and kept in `st.consts`."""
    hit = st.consts.get(_STRAIGHT)
    if hit is None or hit[0] is not st.prog:
        hit = st.consts[_STRAIGHT] = (st.prog, _bind(st))
    steps: Sequence[Step] = hit[1]

    def run() -> None:
        for step in steps:
            step(st)
    return run


def _bind(st: RankState) -> list[Step]:
    """One step per instruction. Constant blocks are generated here (as `RankState._const`
    does, into the same cache), so kernels that specialise on a known constant operand see
    it, exactly as the handler path binds them."""
    if has_messages(st.prog):
        raise ValueError("straight_runner runs programs without sends or receives")
    known: dict[int, torch.Tensor] = {}  # buffer -> constant block it holds at this point
    steps: list[Step] = []
    for ins in st.prog.instrs:
        if isinstance(ins, Compute):
            steps.append(_compute(ins, known, st))
        elif isinstance(ins, Const):
            block = _const_block(st, ins)
            known[ins.out] = block
            steps.append(_set(ins.out, block))
        elif isinstance(ins, Place):
            steps.append(_place(ins))
        elif isinstance(ins, Free):
            known.pop(ins.buf, None)
            if steps and isinstance(steps[-1], _Frees):  # a run of frees is one step
                steps[-1] = _Frees(steps[-1].bufs + (ins.buf,))
            else:
                steps.append(_Frees((ins.buf,)))
        elif isinstance(ins, Output):
            steps.append(_output(ins))
        else:
            handler = step_handler(ins)
            steps.append(lambda s, h=handler, i=ins: h(s, i))
    return steps


def _const_block(st: RankState, ins: Const) -> torch.Tensor:
    st._const(ins)  # fills st.consts under the key the handler path uses
    block = st.bufs.pop(ins.out)
    st.const_bufs.pop(ins.out, None)
    return block


def _compute(ins: Compute, known: dict[int, torch.Tensor], st: RankState) -> Step:
    run = bind_compute(st.graph, ins, known)
    return lambda s: run(s.bufs)


def _set(out: int, block: torch.Tensor) -> Step:
    def run(s: RankState) -> None:
        s.bufs[out] = block
    return run


def _place(ins: Place) -> Step:
    tensor, region, out = ins.tensor, tuple(ins.region), ins.out

    def run(s: RankState) -> None:
        s.bufs[out] = s.place(tensor, region)
    return run


@dataclass(frozen=True)
class _Frees:
    """Drop a run of freed buffers (a program frees after nearly every kernel)."""
    bufs: tuple[int, ...]

    def __call__(self, s: RankState) -> None:
        bufs = s.bufs
        for b in self.bufs:
            bufs.pop(b, None)
        if s.pending:
            for b in self.bufs:
                s.pending.pop(b, None)


def _output(ins: Output) -> Step:
    tensor, src = ins.tensor, ins.src

    def run(s: RankState) -> None:
        s.outputs[tensor] = s.get(src)
    return run
