"""System names -> per-rank steps (measured) for the harness.

Hand-written baselines live in `baselines/`; `einsummable` comes from `einsummable_system`;
`vllm` is only ever real vLLM.
"""
from __future__ import annotations

import importlib.util

from .baselines import BASELINES, RankStep
from .einsummable_system import measured_step
from .unavailable import Unavailable

MEASURED_SYSTEMS = ("einsummable", "pytorch", "pytorch-tp", "pytorch-tp-sp", "data-parallel",
                    "vllm", "floor", "floor-fused")


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def rank_step(name: str, block, x, rank: int, world: int, weights: str = "sharded",
              payload: str | None = None) -> RankStep:
    if name in BASELINES:
        return BASELINES[name].build(block, x, rank, world, weights=weights)
    if name == "einsummable":
        return measured_step(payload, block, x, rank, world)
    if name == "vllm":
        raise Unavailable("vLLM is not installed" if not vllm_available() else
                          "vLLM needs CUDA GPUs; this run is on CPU gloo ranks")
    raise Unavailable(f"unknown system {name!r}")
