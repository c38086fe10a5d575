"""What torch holds while a lowered plan runs: the check of `backend/footprint.py`'s walk on a
real run. Every rank runs in this process as `run_local` runs it (instruction by instruction,
none bound straight), and after each instruction the rank's live bytes are read off its
buffers:

    held(pc) = sum over distinct storages s that the rank's buffers view of bytes(s)

where a placed block is a copy of the caller's (as on a device; on the CPU `RankState` would
view the caller's tensor) and a placed weight block stays counted after the program frees
it (weights stay resident), as the walk counts them. Off the hot path: `run_local` pays
nothing for it.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ...core.program import Place
from ...frontend.inputs import conform_inputs
from ...frontend.reference import check_inputs
from ..lowering import Lowered
from .local import interleave
from .rank_state import RankState


class _Copying(RankState):
    """A rank whose placed blocks are copies, as on a device."""

    def place(self, tensor: str, region) -> torch.Tensor:
        return super().place(tensor, region).clone()


def _held(st: RankState, resident: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages the rank's buffers, outputs and resident weight blocks
    view."""
    storages: dict[int, int] = {}
    for t in [*st.bufs.values(), *st.outputs.values(), *resident]:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def measured_live_bytes(low: Lowered, inputs: Mapping[str, torch.Tensor]
                        ) -> list[list[int]]:
    """Per rank, the bytes torch holds for it after each instruction of its program."""
    check_inputs(low.graph, inputs)
    inputs = conform_inputs(low.graph, inputs)
    ranks = [_Copying(low, p, inputs, "cpu") for p in low.programs]
    out: list[list[int]] = [[] for _ in ranks]
    resident: list[list[torch.Tensor]] = [[] for _ in ranks]  # placed weight blocks

    def record(r: int, pc: int) -> None:
        st, ins = ranks[r], ranks[r].prog.instrs[pc]
        if isinstance(ins, Place) and low.graph.tensor(ins.tensor).kind == "weight":
            resident[r].append(st.bufs[ins.out])
        out[r].append(_held(st, resident[r]))
    interleave(ranks, [0] * len(ranks), record)
    return out
