"""Run every rank's program in one process (the fast path for tests).

Ranks take turns: each runs until it reaches an instruction that reads a received buffer
whose message has not been sent yet (a receive is posted where it stands and lands when a
reader needs it, as on the ranks of `dist.py`). Messages are clones, so no rank ever aliases
another rank's memory. Every rank's blocks and kernels live on one torch device (`device=`,
default the CPU; a GPU runs them with torch's asynchronous kernels, so a caller timing a run
synchronises the device around it)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ...core.program import Recv, Send, reads
from ...errors import RuntimeFault
from ...frontend.inputs import conform_inputs
from ..lowering import Lowered
from .rank_state import RankState
from .resident import check_fed, held_locally
from .straight import runs_straight, straight_runner


def run_local(low: Lowered, inputs: Mapping[str, torch.Tensor], *,
              consts: dict | None = None, resident: dict | None = None,
              device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Outputs of every rank's program run in this process, blocks and kernels on `device`
    (inputs are moved there block by block; the outputs stay there). `consts`: a dict kept by
    the caller across runs of the same plan on the same device, so constant blocks are
    generated once. `resident`: the caller's store (rank -> {(input, region): block}) of the
    blocks the programs keep (`Keep`): read by the next run for the inputs it is not passed,
    updated after each run (`resident.py`)."""
    store = {} if resident is None else resident
    check_fed(low, inputs, held_locally(store))
    inputs = conform_inputs(low.graph, inputs)  # before any rank starts
    dev = torch.device(device)
    cache = {} if consts is None else consts
    ranks = [RankState(low, p, inputs, dev, consts=cache.setdefault(p.rank, {}),
                       resident=store.get(p.rank)) for p in low.programs]
    pcs = [0] * len(ranks)
    for r, st in enumerate(ranks):  # a rank with no messages never waits: its bound steps
        if runs_straight(st.consts, st.prog):
            straight_runner(st)()
            pcs[r] = len(st.prog.instrs)
    interleave(ranks, pcs)
    for r, st in enumerate(ranks):
        if st.kept:
            store.setdefault(r, {}).update(st.kept)
    return {name: ranks[0].outputs[name] for name in low.graph.outputs
            if name in ranks[0].outputs}


def interleave(ranks: list[RankState], pcs: list[int],
               after: Callable[[int, int], None] | None = None) -> None:
    """Run the ranks' programs from `pcs` to their ends, each until it waits for a message;
    `after(rank, pc)`, where given, is called after every instruction (a measurement)."""
    mail: dict[int, torch.Tensor] = {}
    # per rank, buffer -> the receives posted into it, each with where it lands
    posted: list[dict[int, list[tuple[Recv, torch.Tensor]]]] = [{} for _ in ranks]

    def land(r: int, bufs) -> bool:
        """Deliver the posted receives into `bufs` on rank r; False if one has not arrived."""
        if any(ins.tag not in mail for b in bufs for ins, _ in posted[r].get(b, ())):
            return False
        for b in bufs:
            for ins, dest in posted[r].pop(b, ()):
                for other in {ins.out, ins.into} - {b, None}:  # posted under its other name
                    left = [p for p in posted[r][other] if p[0] is not ins]
                    if left:
                        posted[r][other] = left
                    else:
                        del posted[r][other]
                msg = mail.pop(ins.tag)
                if ins.into is None and ranks[r].bufs.get(ins.out) is dest:
                    ranks[r].bufs[ins.out] = msg  # the message itself: no copy
                else:
                    dest.copy_(msg)
        return True

    while True:
        progressed = False
        for r, st in enumerate(ranks):
            instrs = st.prog.instrs
            while pcs[r] < len(instrs):
                ins = instrs[pcs[r]]
                if posted[r] and not land(r, reads(ins)):
                    break
                if isinstance(ins, Send):
                    mail[ins.tag] = st.get(ins.src).clone()
                elif isinstance(ins, Recv):
                    dest = st.recv_buffer(ins)  # where it lands, held from here as on a device
                    for b in {ins.out, ins.into} - {None}:
                        posted[r].setdefault(b, []).append((ins, dest))
                else:
                    st.step(ins)
                if after is not None:
                    after(r, pcs[r])
                pcs[r] += 1
                progressed = True
        for r in range(len(ranks)):  # receives nothing read: land them at the end
            if pcs[r] == len(ranks[r].prog.instrs) and posted[r] and land(r, list(posted[r])):
                progressed = True
        if all(pc == len(st.prog.instrs) and not posted[r]
               for r, (pc, st) in enumerate(zip(pcs, ranks))):
            return
        if not progressed:
            stuck = [r for r, st in enumerate(ranks) if pcs[r] < len(st.prog.instrs)]
            raise RuntimeFault(f"ranks {stuck} wait for messages nobody sends",
                               fix="the programs are inconsistent; lower the plan again")
