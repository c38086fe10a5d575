"""What a device achieves of its datasheet figures, by kind of work.

Datasheet peaks bound what kernels reach; the fraction they reach depends on the kind of work
and its size (ANCHORS.md, "Realism": large fp16 GEMMs reach roughly 70-90 % of peak, small and
skinny ones far less; FlashAttention-2 forward 50-73 %). A device type may say, under
`achieved:` in its YAML:

    matmul      fraction of peak FLOP/s of a contraction kernel, as a function of the FLOPs
                of one call: points (F_i, f_i), F_i increasing; between two points the
                fraction is linear in log10(F), beyond the ends it is the end's fraction
    attention   the same for fused attention kernels
    memory      fraction of `mem_bw` reached by bandwidth-bound work: elementwise ops, norms,
                reductions, copies, partial-sum folds, and the bytes transfers read and write
    transfer_slowdown
                fraction of the compute rate a device loses while one of its transfers runs
                (NCCL moves bytes with kernels on the SMs that compute would use)
    transfer_memory
                share of a running transfer's byte rate that its two end devices' memory
                carries beside their kernels (1: every byte is read from the sender's HBM and
                written to the receiver's; 0: the transport's copies are already in the
                fitted link figures, as on the calibrated gloo ranks)

Every stage that prices work reads these figures through `planning/kernel_time.py`, so the
optimizer and the simulator see one model. The defaults (fractions 1, slowdown and transfer
memory 0: no contention) are the datasheet; `einsummable calibrate` measures them.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Curve:
    """A fraction of peak as a function of a kernel call's FLOPs (module docstring)."""
    points: tuple[tuple[float, float], ...] = ((1.0, 1.0),)

    def __post_init__(self) -> None:
        pts = tuple((float(f), float(v)) for f, v in self.points)
        object.__setattr__(self, "points", pts)
        if not pts or any(f <= 0 or not 0 < v <= 1 for f, v in pts):
            raise ValueError("a curve needs points (FLOPs > 0, fraction in (0, 1])")
        if any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
            raise ValueError("a curve's FLOP counts must increase")

    @staticmethod
    def constant(fraction: float) -> "Curve":
        return Curve(((1.0, fraction),))

    def at(self, flops: float) -> float:
        pts = self.points
        if len(pts) == 1 or flops <= pts[0][0]:
            return pts[0][1]
        if flops >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([f for f, _ in pts], flops)
        (f0, v0), (f1, v1) = pts[i - 1], pts[i]
        w = (math.log10(flops) - math.log10(f0)) / (math.log10(f1) - math.log10(f0))
        return v0 + w * (v1 - v0)

    def to_yaml(self) -> Any:
        """A bare fraction for a constant curve, else the list of [FLOPs, fraction]."""
        if len(self.points) == 1:
            return self.points[0][1]
        return [[f, v] for f, v in self.points]


DATASHEET = Curve()


@dataclass(frozen=True)
class Achieved:
    matmul: Curve = field(default_factory=Curve)
    attention: Curve = field(default_factory=Curve)
    memory: float = 1.0
    transfer_slowdown: float = 0.0
    transfer_memory: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.memory <= 1:
            raise ValueError(f"memory must be a fraction in (0, 1], got {self.memory!r}")
        if not 0 <= self.transfer_slowdown < 1:
            raise ValueError("transfer_slowdown must be in [0, 1), "
                             f"got {self.transfer_slowdown!r}")
        if not 0 <= self.transfer_memory <= 1:
            raise ValueError(f"transfer_memory must be in [0, 1], got {self.transfer_memory!r}")

    @property
    def is_datasheet(self) -> bool:
        return self == Achieved()

    def to_dict(self) -> dict[str, Any]:
        """The YAML form; only the figures that differ from the datasheet."""
        out: dict[str, Any] = {}
        if self.matmul != DATASHEET:
            out["matmul"] = self.matmul.to_yaml()
        if self.attention != DATASHEET:
            out["attention"] = self.attention.to_yaml()
        if self.memory != 1.0:
            out["memory"] = self.memory
        if self.transfer_slowdown:
            out["transfer_slowdown"] = self.transfer_slowdown
        if self.transfer_memory:
            out["transfer_memory"] = self.transfer_memory
        return out
