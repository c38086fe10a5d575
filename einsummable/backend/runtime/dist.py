"""torch.distributed executor: point-to-point only (isend/irecv via batch_isend_irecv).

Each rank walks its program. Runs of consecutive Send/Recv instructions (host bookkeeping
between them, Alloc, Free and Place, keeps a run open) go out as one batch_isend_irecv. A
receive may land straight in a region of an Alloc'd buffer; prefetch sends (Send.queue) go out
when reached, like any other (gloo has no stream priorities). A received buffer is waited on
only when an instruction reads it, so transfers overlap with compute wherever the dependencies
allow; a send of a block still being received (a relay) is parked and goes out when the block
has arrived, without stopping the rank (`outbox.py`, as the simulator models it). Every wait
has a timeout.

Two ways to launch:
- `run(lowered, inputs, backend="gloo", world_size=4)` from Python: a pool of worker processes
  (`pool.py`).
- `torchrun --nnodes N --nproc-per-node G -m einsummable.runtime.dist plan.json` (`torchrun.py`):
  every rank reads the plan (a lowered program bundle or a Plan JSON).
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable, Mapping

import torch

from ...core.program import Pack, Place, Recv, Send, Slice, Unpack, batch_keepers, reads
from ...errors import RuntimeFault
from ..lowering import Lowered
from .rank_state import RankState, step_handler
from .outbox import Once, Outbox
from .straight import runs_straight, straight_runner

# Seconds any single wait may take before the rank gives up (well under the 60 s fault bound).
WAIT_TIMEOUT_S: float = 30.0
# Message tags at and above this are the runtime's own (lowering numbers from 0 upwards).
BARRIER_TAG: int = 1 << 30
COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "gather", "gather_object",
    "barrier", "monitored_barrier", "all_reduce_coalesced", "all_gather_coalesced",
)


def forbid_collectives() -> None:
    """Make every torch.distributed collective raise (tests prove none is ever called)."""
    import torch.distributed as dist

    def refuse(name: str) -> Callable:
        def fn(*a: Any, **k: Any) -> None:
            raise RuntimeFault(f"collective torch.distributed.{name} was called",
                               fix="exchange programs use send/recv only")
        return fn
    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, refuse(name))


# --------------------------------------------------------------------------- one rank

def execute(low: Lowered, rank: int, blocks: Mapping[tuple[str, tuple], torch.Tensor],
            device: torch.device | str = "cpu", timeout_s: float = WAIT_TIMEOUT_S,
            fault_after: int | None = None, consts: dict | None = None,
            timeline: list | None = None, kept: dict | None = None) -> dict[str, torch.Tensor]:
    """Run rank `rank`'s program; `blocks[(tensor, region)]` are its Place inputs; `consts`
    caches constant blocks across runs of the same plan. With `timeline` (a list), appends
    (pc, kind, reached_s, start_s, end_s) per instruction, as the simulator's trace: reached
    when the rank got to it, start once its received inputs were there (perf_counter s).
    `kept` (a dict) receives the blocks the program keeps for the next run, by (input,
    region) as `blocks` takes them (`Keep`)."""
    prog = low.programs[rank]
    st = RankState(low, prog, {}, device, consts)
    if kept is not None:
        st.kept = kept
    on = torch.device(device)

    def place(tensor: str, region) -> torch.Tensor:
        block = blocks[(tensor, region if isinstance(region, tuple) else tuple(region))]
        return block.to(on)
    st.place = place  # type: ignore[method-assign]
    if timeline is None and fault_after is None and runs_straight(st.consts, prog):
        # Nothing to post or wait for (a one-device plan, a rank with replicated work): the
        # program runs as its bound steps in order (`straight.py`).
        straight_runner(st)()
        return st.outputs
    import torch.distributed as dist
    wait_for: dict[int, list] = {}     # buf -> works that fill it
    # buf -> parts of packed receives it waits for: (packed buf, part view, copy target or None)
    unpacked: dict[int, list] = {}
    sends: list[tuple[Any, torch.Tensor]] = []
    batch: list[tuple[Any, Any]] = []  # (P2POp, instr)
    tmo = datetime.timedelta(seconds=timeout_s)
    outbox = Outbox(lambda t, peer, tag: dist.isend(t, peer, tag=tag), timeout_s,
                    stream_ordered=torch.device(device).type == "cuda")

    def wait(works: list, what: str) -> None:
        for w in works:
            try:
                ok = w.wait(tmo)
            except Exception as e:  # noqa: BLE001 - a dead peer surfaces as many error types
                raise RuntimeFault(f"rank {rank}: {what} failed: {str(e).splitlines()[0]}",
                                   fix="a peer rank died or stalled; see its error") from None
            if ok is False:
                raise RuntimeFault(f"rank {rank}: {what} timed out after {timeout_s:.0f} s",
                                   fix="a peer rank died or stalled; see its error")

    def ready(b: int) -> None:
        for flat, view, dest in unpacked.pop(b, ()):
            ready(flat)
            if dest is not None:
                dest.copy_(view)
        works = wait_for.pop(b, None)
        if works:
            wait(works, f"receive into buffer %{b}")

    def flush() -> None:
        if not batch:
            return
        ops = [op for op, _ in batch]
        works = dist.batch_isend_irecv(ops)
        each = len(works) == len(ops)
        for k, (op, ins) in enumerate(batch):
            mine = [works[k]] if each else list(works)
            if isinstance(ins, Recv) and ins.into is not None:
                # read through the buffer it landed in, or sent on under its own name
                once = [Once(w) for w in mine]
                wait_for.setdefault(ins.into, []).extend(once)
                wait_for.setdefault(ins.out, []).extend(once)
            elif isinstance(ins, Recv):
                wait_for.setdefault(ins.out, []).extend(mine)
            else:
                sends.append((mine, op.tensor))
        batch.clear()

    table = _dispatch(st.consts, prog)
    clock = time.perf_counter
    for count, (ins, (code, rd, run)) in enumerate(zip(prog.instrs, table)):
        if fault_after is not None and count == fault_after:
            os._exit(17)  # test hook: die mid-run without cleanup, like a crashed rank
        if timeline is not None:
            reached = clock()
        if code == _SEND:
            if any(isinstance(i, Recv) and ins.src in (i.out, i.into) for _, i in batch):
                flush()  # a relay: its receive is in this batch; post it, then park the send
            if ins.src in unpacked:  # a packed receive's part: copied out first (rare)
                flush()
                ready(ins.src)
            if ins.src in wait_for or outbox.busy(ins.peer):
                flush()  # its receive is posted; the send waits for it, the rank does not
                arrival = outbox.send(ins.peer, ins.tag, st.get(ins.src),
                                      wait_for.pop(ins.src, []))
                if arrival is not None:  # the rank's own reads wait on the line, not twice
                    wait_for[ins.src] = [arrival]
                if timeline is not None:
                    timeline.append((count, "Send", reached, reached, clock()))
                continue
            t = st.get(ins.src).contiguous()
            batch.append((dist.P2POp(dist.isend, t, ins.peer, tag=ins.tag), ins))
        elif code == _RECV:
            t = st.recv_buffer(ins)
            batch.append((dist.P2POp(dist.irecv, t, ins.peer, tag=ins.tag), ins))
        elif code == _UNPACK:  # views now; waits and copies when a reader needs them
            for out, into, view, dest in st.unpacked(ins):
                st.bufs[out] = view if into is None else dest
                unpacked.setdefault(out, []).append((ins.src, view, dest))
                if into is not None:  # read through that buffer, or sent on as `out`
                    unpacked.setdefault(into, []).append((ins.src, view, dest))
        else:
            if code == _KERNEL and batch:  # host bookkeeping keeps the batch open
                flush()
            with st.beside(ins):  # a GPU's side stream waits for a queued copy's parts
                for b in rd:
                    if b in wait_for or b in unpacked:
                        ready(b)
            if timeline is not None:
                start = clock()
            run(st, ins)
        if timeline is not None:
            done = clock()
            timeline.append((count, type(ins).__name__, reached,
                             done if code in (_SEND, _RECV, _UNPACK) else start, done))
    flush()
    for b in list(unpacked) + list(wait_for):
        ready(b)
    for works, _ in sends + outbox.close():
        wait(works, "send")
    return st.outputs


# What `execute` does with an instruction: post a send, post a receive, name an unpacked
# message's views, host bookkeeping (keeps a batch of sends and receives open), run a kernel.
_SEND, _RECV, _UNPACK, _HOST, _KERNEL = range(5)
_DISPATCH = "dispatch"  # consts key of a program's dispatch table


def _dispatch(consts: dict, prog) -> list[tuple[int, tuple[int, ...], Callable | None]]:
    """(what execute does, the buffers it reads that a message may still be filling, the
    RankState handler of a host or kernel instruction) per instruction, worked out once per plan and kept in the plan's `consts`: the executor pays
    one integer compare per instruction, not a chain of type tests, and looks up only reads
    that a receive (or a send's line) could have left pending. Host bookkeeping
    (`batch_keepers`) keeps a batch open, except a Slice: it runs as a kernel here, so a view
    of a buffer still being received is taken after its receive (its readers wait on the
    buffer's name, not the view's)."""
    hit = consts.get(_DISPATCH)
    if hit is not None and hit[0] is prog:
        return hit[1]
    # Buffers execute may wait on: what receives fill (and views of it), and what sends read
    # (a send parked on a busy line leaves its source waiting on that line).
    pending: set[int] = set()
    packed_here: set[int] = set()  # a Pack kernel's buffers: their Unpack views wait for none
    table = []
    for ins, keep in zip(prog.instrs, batch_keepers(prog.instrs)):
        local = isinstance(ins, Unpack) and ins.src in packed_here
        code = (_SEND if isinstance(ins, Send) else _RECV if isinstance(ins, Recv)
                else _UNPACK if isinstance(ins, Unpack) and not local
                else _HOST if keep and not isinstance(ins, Slice) else _KERNEL)
        if isinstance(ins, Pack):
            packed_here.add(ins.out)
        table.append((code, tuple(b for b in reads(ins) if b in pending),
                      step_handler(ins) if code in (_HOST, _KERNEL) else None))
        if isinstance(ins, Recv):
            pending.update((ins.out, ins.into))
        elif isinstance(ins, Unpack) and not local:
            pending.update(b for out, _, into, _ in ins.parts for b in (out, into))
        elif isinstance(ins, Send):
            pending.add(ins.src)
        elif isinstance(ins, Slice) and ins.src in pending:
            pending.add(ins.out)
    consts[_DISPATCH] = (prog, table)
    return table


def p2p_barrier(rank: int, world: int, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Every rank leaves after every rank has arrived: a star through rank 0 built from
    send/recv (collectives are forbidden), so timed runs start together."""
    import torch.distributed as dist
    if world == 1:
        return
    tmo = datetime.timedelta(seconds=timeout_s)
    token = torch.zeros(1)
    peers = range(1, world) if rank == 0 else (0,)
    for phase in (0, 1):  # 0: everyone -> rank 0, 1: rank 0 -> everyone
        into_root = phase == 0
        ops = [dist.P2POp(dist.irecv if (rank == 0) == into_root else dist.isend, token, p,
                          tag=BARRIER_TAG + phase) for p in peers]
        for w in dist.batch_isend_irecv(ops):
            if w.wait(tmo) is False:
                raise RuntimeFault(f"rank {rank}: barrier timed out after {timeout_s:.0f} s",
                                   fix="a peer rank died or stalled; see its error")


def rank_blocks(low: Lowered, rank: int, inputs: Mapping[str, torch.Tensor],
                only: set[str] | None = None) -> dict[tuple[str, tuple], torch.Tensor]:
    out = {}
    for ins in low.programs[rank].instrs:
        if isinstance(ins, Place) and (only is None or ins.tensor in only):
            sl = tuple(slice(a, b) for a, b in ins.region)
            out[(ins.tensor, ins.region)] = inputs[ins.tensor][sl].contiguous().clone()
    return out
