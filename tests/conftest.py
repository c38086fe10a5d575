"""Shared test settings: a deterministic hypothesis profile sized for a 2-core CI machine, and
torchvision made importable on the CPU build of torch.

timm imports torchvision at import time (for FrozenBatchNorm2d and its data transforms). The
torchvision wheel for torch 2.13 carries kernels linked against the CUDA build of torch; on the
CPU build they do not load, and torchvision's import then fails registering fake kernels for
two ops its library never defined (`nms`, `qnms`). Defining those two schemas, with no kernel,
lets the pure-Python parts import; no test calls them (they would fail with "no kernel")."""
import importlib.util
import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


def _torchvision_without_kernels() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    lib = os.path.join(spec.submodule_search_locations[0], "_C.so")
    try:
        torch.ops.load_library(lib)
        return  # its kernels load: torchvision imports as it is
    except (OSError, RuntimeError):
        pass
    _torchvision_without_kernels.lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _torchvision_without_kernels.lib.define(
            f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


_torchvision_without_kernels()
