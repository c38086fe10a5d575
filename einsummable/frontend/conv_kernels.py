"""Kernels of the windowed ops: convolution, max pooling and average pooling, on one block.

A block's input is the window of its output block (`windows.py`), clipped to the input; the
kernel pads it only where the window runs past the input's true border (`Window.pads`) and
then runs torch's convolution or pooling with no padding of its own, so a block computes
exactly the outputs of its range. Convolution's input channels may be split: each block then
computes a partial sum over its channels (the op's aggregation, sum, folds them), and the
bias is added by the block of the first channels only, so it is counted once. Groups: the
channel dims are (g c) and (g o), and a block holding g_b whole groups runs with g_b groups.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from .kernels import KERNELS, FusedOp, Kernel, Ranges

# Scalar operations per output element and kernel tap: a multiply and an add (convolution),
# one compare or add (pooling).
CONV_OPS_PER_TAP = 2
POOL_OPS_PER_TAP = 1
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _spatial(op: FusedOp) -> tuple[str, ...]:
    """The windowed modes of operand 0, outermost first (its dims after batch and channels)."""
    return tuple(g[0] for g in op.in_dims[0][2:])


def _windowed(op: FusedOp, x: torch.Tensor, ranges: Ranges, fill: float) -> torch.Tensor:
    """The block's input cropped to its window and padded with `fill` at the true borders."""
    pad: list[int] = []
    for axis, m in enumerate(_spatial(op), start=2):
        win = op.window[m]
        skip, take, before, after = win.pads(ranges[win.out], ranges[m])
        if skip or take != x.shape[axis]:
            x = x.narrow(axis, skip, take)
        pad = [before, after] + pad  # F.pad lists the last dim first
    return F.pad(x, pad, value=fill) if any(pad) else x


def _taps(op: FusedOp) -> int:
    return math.prod(op.window[m].kernel for m in _spatial(op))


def _out_points(op: FusedOp) -> int:
    return math.prod(op.size[m] for m in op.out_modes)


def _conv(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """x (b, (g c), spatial...), w ((g o), c, taps...) [, bias ((g o),)] -> (b, (g o), out...)."""
    x, w = xs[0], xs[1]
    spatial = _spatial(op)
    x = _windowed(op, x, ranges, 0.0)
    channels = op.in_dims[0][1]
    groups = ranges[channels[0]][1] - ranges[channels[0]][0] if len(channels) > 1 else 1
    wins = [op.window[m] for m in spatial]
    y = _CONV[len(spatial)](x, w, None, tuple(v.stride for v in wins), 0,
                            tuple(v.dilation for v in wins), groups)
    if len(xs) > 2 and ranges[channels[-1]][0] == 0:  # the first channels' block adds the bias
        y = y + xs[2].reshape((1, -1) + (1,) * len(spatial))
    return y


def _conv_flops(op: FusedOp) -> int:
    channels = op.in_dims[0][1][-1]
    bias = _out_points(op) if len(op.in_dims) > 2 else 0
    return CONV_OPS_PER_TAP * _out_points(op) * op.size[channels] * _taps(op) + bias


def _max_pool(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    spatial = _spatial(op)
    wins = [op.window[m] for m in spatial]
    x = _windowed(op, xs[0], ranges, float("-inf"))
    return _MAX_POOL[len(spatial)](x, tuple(v.kernel for v in wins), tuple(v.stride for v in wins),
                                   0, tuple(v.dilation for v in wins))


def _avg_pool(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """The window's mean; padding counts as zeros unless param count_include_pad is False,
    when each output divides by the input elements its window meets."""
    spatial = _spatial(op)
    wins = [op.window[m] for m in spatial]
    pool = _AVG_POOL[len(spatial)]
    kernel, stride = tuple(v.kernel for v in wins), tuple(v.stride for v in wins)
    y = pool(_windowed(op, xs[0], ranges, 0.0), kernel, stride, 0)
    if op.param.get("count_include_pad", True):
        return y
    ones = torch.ones((1, 1) + tuple(r[1] - r[0] for r in (ranges[m] for m in spatial)),
                      dtype=y.dtype, device=y.device)
    return y / pool(_windowed(op, ones, ranges, 0.0), kernel, stride, 0)


def _pool_flops(op: FusedOp) -> int:
    return POOL_OPS_PER_TAP * _out_points(op) * _taps(op)


WINDOWED_KERNELS: dict[str, Kernel] = {
    k.name: k for k in (
        Kernel("conv", _conv, _conv_flops,
               "convolution through windows (stride, dilation, padding at the true borders), "
               "groups, optional bias; splits batch, groups, out and in channels, out positions"),
        Kernel("max_pool", _max_pool, _pool_flops,
               "max over each window, padding -inf; splits batch, channels, out positions"),
        Kernel("avg_pool", _avg_pool, _pool_flops,
               "mean over each window; splits batch, channels, out positions"),
    )
}
KERNELS.update(WINDOWED_KERNELS)
