"""The time of one kernel call on one device: the compute model that the optimizer's cost model
and the simulator share, so that both price every kernel alike.

A call doing F FLOP and moving B bytes through memory (its inputs read, its output written) on
device d takes

    flop_s   = F / (peak_d(dtype) · a_class(F) · flop_efficiency)
    memory_s = B / (mem_bw_d · a_memory · mem_efficiency)
    kernel_s = launch_d + max(flop_s, memory_s)                        (roofline + launch)

a_class is the fraction of peak the device achieves for the op's class (`topology/achieved.py`):
"matmul" for contractions (a join multiplying two operands, summed over a mode longer than
one), "attention" for the fused attention kernel, and peak for the rest, whose elementwise
work is bound by memory and pays a_memory there. A copy (stitching blocks, packing messages,
folding partial sums) only moves bytes: copy_s = launch + bytes / (mem_bw · a_memory ·
mem_efficiency). `flop_efficiency` and `mem_efficiency` are `cost.CostModel`'s global derating
knobs (1: none).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..frontend.ir import Op

# Peak rates are given per float dtype; work on other dtypes (int64 indices, float64) is
# priced at the float32 rate.
FALLBACK_DTYPE = "float32"
MATMUL, ATTENTION, OTHER = "matmul", "attention", "other"


@dataclass(frozen=True)
class KernelTime:
    flop_s: float
    memory_s: float
    launch_s: float

    @property
    def total_s(self) -> float:
        return self.launch_s + max(self.flop_s, self.memory_s)


@lru_cache(maxsize=65536)
def op_class(op: Op) -> str:
    """"matmul", "attention" or "other" (module docstring)."""
    if op.fused is not None:
        return ATTENTION if op.fused == "attention" else OTHER
    join = op.join
    contracts = any(op.size[m] > 1 for m in op.agg_modes)
    if op.agg == "sum" and contracts and join is not None and join.fn == "mul":
        args = {a.value for a in join.args if a.fn == "arg"}
        if len(args) == 2:
            return MATMUL
    return OTHER


def peak_of(device, dtype: str) -> float:
    return device.peak(dtype if dtype in device.peak_flops else FALLBACK_DTYPE)


def kernel_time(op: Op, flops: float, nbytes: float, dtype: str, device,
                flop_efficiency: float = 1.0, mem_efficiency: float = 1.0) -> KernelTime:
    """One call of `op` on `device` doing `flops` and moving `nbytes` (module docstring)."""
    achieved = device.achieved
    kind = op_class(op)
    fraction = (achieved.matmul.at(flops) if kind == MATMUL else
                achieved.attention.at(flops) if kind == ATTENTION else 1.0)
    flop_s = flops / (peak_of(device, dtype) * fraction * flop_efficiency)
    memory_s = nbytes / (device.mem_bw * achieved.memory * mem_efficiency)
    return KernelTime(flop_s, memory_s, device.launch_s)


def memory_s(device, nbytes: float, mem_efficiency: float = 1.0) -> float:
    """Seconds for `nbytes` to pass through the device's memory at its achieved rate."""
    return nbytes / (device.mem_bw * device.achieved.memory * mem_efficiency)


def copy_s(device, nbytes_moved: float, kernels: int = 1, mem_efficiency: float = 1.0) -> float:
    """`kernels` copy kernels moving `nbytes_moved` bytes in all (read plus write counted)."""
    return kernels * device.launch_s + memory_s(device, nbytes_moved, mem_efficiency)
