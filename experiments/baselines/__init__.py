"""Hand-written baselines, one module per system; each exposes `build(...) -> RankStep`;
training steps (`train_*.py`) `build_*(...) -> TrainRankStep`."""
from __future__ import annotations

from types import ModuleType

from . import data_parallel, floor, floor_fused, pytorch_tp, pytorch_tp_sp, single
from .common import RankStep
from .train_common import TrainRankStep
from .train_data_parallel import build_ddp, build_fsdp
from .train_tensor_parallel import build_tp, build_tp_sp

BASELINES: dict[str, ModuleType] = {
    "pytorch": single,
    "pytorch-tp": pytorch_tp,
    "pytorch-tp-sp": pytorch_tp_sp,
    "data-parallel": data_parallel,
    "floor": floor,
    "floor-fused": floor_fused,
}

# Training-step baselines: build(block, x, y, rank, world, hyper) -> TrainRankStep.
TRAIN_BASELINES = {
    "ddp": build_ddp,
    "fsdp": build_fsdp,
    "pytorch-tp": build_tp,
    "pytorch-tp-sp": build_tp_sp,
}

__all__ = ["BASELINES", "RankStep", "TRAIN_BASELINES", "TrainRankStep"]
