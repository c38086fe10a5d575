"""torchvision made importable where its compiled kernels cannot load.

transformers imports torchvision when it is installed (image processors), and timm imports it
always. A torchvision wheel built against the CUDA build of torch cannot load its kernels
under the CPU build, and its import then fails while registering fake kernels for two ops its
library never defined (`nms`, `qnms`), which takes every transformers model class down with it
("Could not import module 'LlamaConfig'"). Defining those two op schemas, with no kernel, lets
torchvision's pure-Python parts import; nothing here calls them (they would fail with "no
kernel"). Where torchvision's kernels load, or it is not installed, nothing is done.
"""
from __future__ import annotations

import importlib.util
import os

import torch

_LIBRARY: list = []  # the schemas' library, kept alive for the process


def torchvision_importable() -> None:
    if _LIBRARY:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    compiled = os.path.join(spec.submodule_search_locations[0], "_C.so")
    if not os.path.exists(compiled):
        return
    try:
        torch.ops.load_library(compiled)
        return  # its kernels load: torchvision imports as it is
    except (OSError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.append(lib)
