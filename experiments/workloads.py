"""Workloads and their modules: the one place that turns a config entry into a block and x."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from einsummable.models import preset

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16,
                                        "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Workload:
    """A model preset at one shape. `tokens` = batch × seq is what sweeps are plotted against."""

    name: str
    model: str
    batch: int
    seq: int
    width: float | None = None
    dtype: str = "float32"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def build(self, device: str = "cpu", seed: int = 0):
        """(module, x): identical on every process for the same seed (weights drawn on the CPU)."""
        module, (x,) = preset(self.model, batch=self.batch, seq=self.seq, device=device,
                              dtype=TORCH_DTYPES[self.dtype], width=self.width, seed=seed)
        return module, x

    def to_dict(self) -> dict:
        return {"name": self.name, "model": self.model, "batch": self.batch, "seq": self.seq,
                "width": self.width, "dtype": self.dtype, "tokens": self.tokens}

    @staticmethod
    def from_dict(d: dict, dtype: str = "float32") -> "Workload":
        return Workload(str(d.get("name") or f"{d['model']}-b{d['batch']}s{d['seq']}"),
                        str(d["model"]), int(d["batch"]), int(d["seq"]),
                        float(d["width"]) if d.get("width") is not None else None,
                        str(d.get("dtype", dtype)))
