"""ATen convolution, pooling, batch norm and nearest upsampling, registered into `aten.TABLE`.

Convolution and pooling become windowed ops (`frontend/windowed.py`) over stored operands:
a view is copied first, since a window reads its input's stored spatial dims. Batch norm in
eval mode is the per-channel affine (x - mean) * rsqrt(var + eps) * weight + bias, an
elementwise join over x and the channel statistics (broadcast along the spatial dims), which
fuses with its neighbours like any other map. Nearest upsampling by integer factors is a view
(each element repeated, an expand), read in place by its consumer. A transposed convolution is
a convolution of the input with zeros between its elements (an elementwise product with a
one-hot constant, a view otherwise) with the weight's taps flipped (a contraction with an
anti-diagonal constant) and its in and out channels swapped.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir import validate_op
from ..windowed import conv_op, pool_op
from . import values as V
from .aten import Ctx, aten, normalized, register
from .values import View


def _ints(v: Any, nd: int) -> list[int]:
    if isinstance(v, int):
        return [v] * nd
    v = [int(a) for a in v]
    return v * nd if len(v) == 1 else v


def _stored(cx: Ctx, value: Any) -> View:
    return cx.em.stored(value)


def _emit(cx: Ctx, op_for) -> View:
    """Append the windowed op `op_for(name)` and return its output as a view."""
    em = cx.em
    name = em.fresh(em.stem)
    op = op_for(name)
    validate_op(op, {t: em.tensors[t].shape for t in op.inputs})
    em.ops.append(op)
    return em.add_tensor(name, cx.shape, cx.dtype, "intermediate", em.source)


def _conv(cx: Ctx, x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
          groups: int) -> View:
    xv, wv = _stored(cx, x), _stored(cx, w)
    bv = _stored(cx, bias) if bias is not None else None
    nd = len(xv.shape) - 2
    if nd < 1 or len(wv.shape) != nd + 2:
        raise cx.fail(f"convolution of an input of shape {xv.shape}",
                      fix="give the input a batch dim: (batch, channels, spatial...)")
    return _emit(cx, lambda name: conv_op(
        name, xv.base, wv.base, bv.base if bv is not None else None, name, xv.shape, wv.shape,
        stride=_ints(stride, nd), padding=padding if isinstance(padding, str)
        else _ints(padding, nd), dilation=_ints(dilation, nd), groups=int(groups),
        source=cx.em.source))


def _arg(a: list, kw: dict, i: int, name: str, default: Any) -> Any:
    return a[i] if len(a) > i else kw.get(name, default)


@register(aten.conv1d.default, aten.conv2d.default, aten.conv3d.default,
          aten.conv1d.padding, aten.conv2d.padding, aten.conv3d.padding)
def _conv_h(cx, node, a, kw):
    return _conv(cx, a[0], a[1], _arg(a, kw, 2, "bias", None), _arg(a, kw, 3, "stride", 1),
                 _arg(a, kw, 4, "padding", 0), _arg(a, kw, 5, "dilation", 1),
                 _arg(a, kw, 6, "groups", 1))


@register(aten.convolution.default)
def _convolution(cx, node, a, kw):
    x, w, bias, stride, padding, dilation, transposed, _, groups = a[:9]
    if transposed:
        return _conv_transpose(cx, x, w, bias, stride, padding, groups, dilation)
    return _conv(cx, x, w, bias, stride, padding, dilation, groups)


@register(aten.conv_transpose1d.default, aten.conv_transpose2d.input)
def _conv_transpose_h(cx, node, a, kw):
    return _conv_transpose(cx, a[0], a[1], _arg(a, kw, 2, "bias", None),
                           _arg(a, kw, 3, "stride", 1), _arg(a, kw, 4, "padding", 0),
                           _arg(a, kw, 6, "groups", 1),
                           _arg(a, kw, 7, "dilation", 1))


def _conv_transpose(cx, x, w, bias, stride, padding, groups, dilation) -> View:
    """y = conv(zero-stuffed x, flipped w^T): input rows i land at i s, the s - 1 rows between
    are zero; the window pads d (K - 1) - p before (not negative) and d (K - 1) - p +
    output_padding after, which the output's extent implies (output_padding is read there)."""
    xv, wv = cx.em.view(x), _stored(cx, w)
    nd = len(xv.shape) - 2
    s, p, d = (_ints(v, nd) for v in (stride, padding, dilation))
    taps = list(wv.shape[2:])
    if int(groups) != 1 or any(pi > di * (k - 1) for pi, di, k in zip(p, d, taps)):
        raise cx.fail("a transposed convolution with groups or padding past the kernel's reach",
                      fix="use groups=1 and padding at most dilation * (kernel - 1)")
    # Zero-stuffing: x (b, c, h, w) -> (b, c, h, s, w, s) * onehot(s) -> (b, c, h s, w s),
    # then the trailing s - 1 zero rows of each dim are dropped by the window's extent.
    stuffed: Any = xv
    if any(si > 1 for si in s):
        shape = list(xv.shape[:2])
        for i in range(nd):
            stuffed = V.unsqueeze(stuffed, 3 + 2 * i)
            shape += [xv.shape[2 + i], s[i]]
        stuffed = V.expand(stuffed, shape)
        for i in range(nd):
            hot = torch.zeros([s[i] if j == i else 1 for j in range(nd)])
            hot.view(-1)[0] = 1.0
            onehot = cx.em.literal(hot.reshape([1] * (2 * i + 1) + [s[i]]
                                               + [1] * (2 * (nd - i - 1))), xv.dtype, "stuff")
            stuffed = cx.em.elementwise(lambda a_, b_: a_ * b_, [stuffed, onehot], xv.dtype)
        stuffed = cx.em.reshape(cx.em.view(stuffed),
                                list(xv.shape[:2]) + [n * si for n, si in zip(xv.shape[2:], s)])
    # Weight (c_in, o, taps) -> (o, c_in, flipped taps): one contraction with anti-diagonals.
    sizes = {0: wv.shape[0], 1: wv.shape[1]}
    operands: list = []
    for i, k in enumerate(taps):
        flip = torch.flip(torch.eye(k), [0])
        sizes[2 + i], sizes[2 + nd + i] = k, k
        operands.append((cx.em.literal(flip, wv.dtype, "flip"), [2 + i, 2 + nd + i]))
    wt = cx.em.contract([(wv, list(range(2 + nd)))] + operands, sizes,
                        [1, 0] + [2 + nd + i for i in range(nd)], wv.dtype)
    xs = _stored(cx, stuffed)
    lo = [di * (k - 1) - pi for di, k, pi in zip(d, taps, p)]
    # The padding after that makes the output extent torch's (it drops the stuffed tail).
    hi = [y - n - a + di * (k - 1) for y, n, a, di, k in
          zip(cx.shape[2:], xs.shape[2:], lo, d, taps)]
    bv = _stored(cx, bias) if bias is not None else None
    return _emit(cx, lambda name: conv_op(
        name, xs.base, wt.base, bv.base if bv is not None else None, name, xs.shape,
        wt.shape, padding=lo, pad_hi=hi, dilation=d, source=cx.em.source))


def _pool(cx: Ctx, kind: str, x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any,
          ceil_mode: bool, count_include_pad: bool = True) -> View:
    xv = _stored(cx, x)
    nd = len(xv.shape) - 2
    if ceil_mode:
        raise cx.fail("pooling with ceil_mode=True", fix="use ceil_mode=False")
    stride = None if stride in (None, []) else _ints(stride, nd)
    return _emit(cx, lambda name: pool_op(
        name, kind, xv.base, name, xv.shape, _ints(kernel, nd), stride=stride,
        padding=_ints(padding, nd), dilation=_ints(dilation, nd),
        count_include_pad=count_include_pad, source=cx.em.source))


@register(aten.max_pool1d.default, aten.max_pool2d.default, aten.max_pool3d.default)
def _max_pool(cx, node, a, kw):
    return _pool(cx, "max", a[0], a[1], _arg(a, kw, 2, "stride", None),
                 _arg(a, kw, 3, "padding", 0), _arg(a, kw, 4, "dilation", 1),
                 _arg(a, kw, 5, "ceil_mode", False))


@register(aten.avg_pool1d.default, aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(cx, node, a, kw):
    if _arg(a, kw, 6, "divisor_override", None) is not None:
        raise cx.fail("average pooling with divisor_override", fix="divide after pooling")
    return _pool(cx, "avg", a[0], a[1], _arg(a, kw, 2, "stride", None),
                 _arg(a, kw, 3, "padding", 0), 1, _arg(a, kw, 4, "ceil_mode", False),
                 _arg(a, kw, 5, "count_include_pad", True))


@register(aten.adaptive_avg_pool1d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool(cx, node, a, kw):
    """Output sizes that divide the input's: an average pool whose kernel is its stride."""
    shape = list(cx.em.view(a[0]).shape)
    nd = len(shape) - 2
    out = [shape[2 + i] if o is None else int(o) for i, o in enumerate(_ints(a[1], nd))]
    if any(h % o for h, o in zip(shape[2:], out)):
        raise cx.fail(f"adaptive pooling of {shape[2:]} to {out}: windows of unequal sizes",
                      fix="pick output sizes that divide the input's")
    kernel = [h // o for h, o in zip(shape[2:], out)]
    return _pool(cx, "avg", a[0], kernel, kernel, 0, 1, False)


def _channel(cx: Ctx, v: Any, rank: int) -> Any:
    """A per-channel vector (C,) as (C, 1, ...) broadcasting over rank - 2 spatial dims."""
    v = cx.em.view(v)
    for _ in range(rank - 2):
        v = V.unsqueeze(v, -1)
    return v


def _batch_norm_eval(cx: Ctx, x, w, b, mean, var, eps) -> Any:
    rank = len(cx.em.view(x).shape) if not hasattr(x, "shape") else len(x.shape)
    stats = [_channel(cx, mean, rank), _channel(cx, var, rank)]
    extra = [_channel(cx, t, rank) for t in (w, b) if t is not None]

    return cx.em.elementwise(normalized(eps, w is not None, b is not None), [x] + stats + extra,
                             cx.dtype)


@register(aten.batch_norm.default)
def _batch_norm(cx, node, a, kw):
    x, w, b, mean, var, training = a[:6]
    if training or mean is None or var is None:
        raise cx.fail("batch norm in training mode (statistics of the batch)",
                      fix="capture the module in eval mode: module.eval()")
    return _batch_norm_eval(cx, x, w, b, mean, var, _arg(a, kw, 7, "eps", 1e-5))


@register(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.default)
def _batch_norm_training(cx, node, a, kw):
    raise cx.fail("batch norm in training mode (statistics of the batch, running stats updated)",
                  fix="capture the module in eval mode: module.eval()")


@register(aten._native_batch_norm_legit_no_training.default)
def _native_batch_norm(cx, node, a, kw):
    y = _batch_norm_eval(cx, a[0], a[1], a[2], a[3], a[4], _arg(a, kw, 6, "eps", 1e-5))
    return y, None, None  # the saved statistics serve training only


@register(aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec)
def _upsample_nearest(cx, node, a, kw):
    """Integer factors: each element repeated f times along its dim (a view)."""
    v = cx.em.view(a[0])
    shape, want = list(v.shape), list(cx.shape)
    if any(o % i for i, o in zip(shape[2:], want[2:])):
        raise cx.fail(f"nearest upsampling of {shape[2:]} to {want[2:]}",
                      fix="use integer scale factors")
    full = shape[:2]
    for i in range(len(shape) - 2):
        v = V.unsqueeze(v, 3 + 2 * i)
        full += [shape[2 + i], want[2 + i] // shape[2 + i]]
    return cx.em.reshape(V.expand(v, full), want)
