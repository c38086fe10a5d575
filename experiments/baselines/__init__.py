"""Hand-written baselines, one module per system; each exposes `build(...) -> RankStep`."""
from __future__ import annotations

from types import ModuleType

from . import data_parallel, floor, floor_fused, pytorch_tp, pytorch_tp_sp, single
from .common import RankStep

BASELINES: dict[str, ModuleType] = {
    "pytorch": single,
    "pytorch-tp": pytorch_tp,
    "pytorch-tp-sp": pytorch_tp_sp,
    "data-parallel": data_parallel,
    "floor": floor,
    "floor-fused": floor_fused,
}

__all__ = ["BASELINES", "RankStep"]
