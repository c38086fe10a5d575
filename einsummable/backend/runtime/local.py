"""Run every rank's program in one process (the fast path for tests).

Ranks take turns: each runs until it reaches a receive whose message has not been sent yet.
Messages are clones, so no rank ever aliases another rank's memory. Every rank's blocks and
kernels live on one torch device (`device=`, default the CPU; a GPU runs them with torch's
asynchronous kernels, so a caller timing a run synchronises the device around it)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ...core.program import Recv, Send
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
    while True:
        progressed = False
        for r, st in enumerate(ranks):
            instrs = st.prog.instrs
            while pcs[r] < len(instrs):
                ins = instrs[pcs[r]]
                if isinstance(ins, Send):
                    mail[ins.tag] = st.get(ins.src).clone()
                elif isinstance(ins, Recv):
                    if ins.tag not in mail:
                        break
                    if ins.into is None:
                        st.bufs[ins.out] = mail.pop(ins.tag)
                    else:
                        st.recv_buffer(ins).copy_(mail.pop(ins.tag))
                else:
                    st.step(ins)
                if after is not None:
                    after(r, pcs[r])
                pcs[r] += 1
                progressed = True
        if all(pc == len(st.prog.instrs) for pc, st in zip(pcs, ranks)):
            return
        if not progressed:
            stuck = [r for r, st in enumerate(ranks) if pcs[r] < len(st.prog.instrs)]
            raise RuntimeFault(f"ranks {stuck} wait for messages nobody sends",
                               fix="the programs are inconsistent; lower the plan again")
