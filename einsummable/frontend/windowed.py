"""Builders of the windowed ops (convolution and pooling over 1 to 3 spatial dims).

Modes: b batch, g groups (only where groups > 1), c input channels per group, o output channels
per group, spatial input modes (h, w; d h w in 3-D; w in 1-D), output positions (y, x; z y x;
x) and kernel taps of the weight (k, l; j k l; l). Convolution:

    x [b, (g c), h, w],  w [(g o), c, k, l]  [, bias [(g o)]]  ->  out [b, (g o), y, x]

aggregated by sum over c (partial sums where c is split) and over the taps, whose window ties h
to y and w to x (`windows.py` states the access and its halo). Pooling: x [b, c, h, w] ->
out [b, c, y, x], the window folded by the kernel (max, or the mean). The spatial, tap and
window modes are never split; everything else may be.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ShapeError
from .ir import Op
from .windows import Window, check_window, out_extent

IN_MODES, OUT_MODES, TAP_MODES = "dhw", "zyx", "jkl"


def _ints(v: int | Sequence[int], nd: int, what: str, name: str) -> tuple[int, ...]:
    out = (int(v),) * nd if isinstance(v, int) else tuple(int(a) for a in v)
    if len(out) == 1 and nd > 1:
        out = out * nd
    if len(out) != nd:
        raise ShapeError(f"{what} {v!r} for a {nd}-D window", op=name,
                         fix=f"give one {what} or {nd} of them")
    return out


def _windows(name: str, spatial: Sequence[int], kernel: Sequence[int], stride, padding,
             dilation, source: str | None, pad_hi: Sequence[int] | None = None
             ) -> tuple[tuple[Window, ...], dict[str, int]]:
    """The windows of the spatial dims and the sizes of their modes. `padding` is torch's:
    per dim (symmetric), "valid" (none) or "same" (the output as long as the input at stride
    1: d (K - 1) in all, the odd one after); `pad_hi` overrides the padding after."""
    nd = len(spatial)
    s, d = (_ints(v, nd, w, name) for v, w in ((stride, "stride"), (dilation, "dilation")))
    if padding == "same":
        if any(v != 1 for v in s):
            raise ShapeError("padding='same' with a stride", op=name, source=source,
                             fix="torch allows 'same' at stride 1 only")
        lo = [di * (k - 1) // 2 for di, k in zip(d, kernel)]
        hi = [di * (k - 1) - a for di, k, a in zip(d, kernel, lo)]
    else:
        lo = [0] * nd if padding == "valid" else list(_ints(padding, nd, "padding", name))
        hi = list(lo)
    if pad_hi is not None:
        hi = list(pad_hi)
    wins, size = [], {}
    for i in range(nd):
        m, y = IN_MODES[3 - nd + i], OUT_MODES[3 - nd + i]
        extent = out_extent(spatial[i], kernel[i], s[i], d[i], lo[i], hi[i])
        if extent < 1:
            raise ShapeError(f"input extent {spatial[i]} is smaller than the kernel's reach "
                             f"{(kernel[i] - 1) * d[i] + 1} with padding {lo[i]}", op=name,
                             source=source, fix="pad more or use a smaller kernel or dilation")
        wins.append(Window(m, y, kernel[i], s[i], d[i], lo[i]))
        size[m], size[y] = spatial[i], extent
        check_window(wins[-1], size, name, source)
    return tuple(wins), size


def conv_op(name: str, x: str, w: str, bias: str | None, out: str, x_shape: Sequence[int],
            w_shape: Sequence[int], *, stride=1, padding=0, dilation=1, groups: int = 1,
            pad_hi: Sequence[int] | None = None, source: str | None = None) -> Op:
    """out = conv(x, w) + bias, torch's convolution, as a windowed op; `padding` as torch's
    (`_windows`), `pad_hi` the padding after where it differs."""
    nd = len(x_shape) - 2
    if nd not in (1, 2, 3) or len(w_shape) != len(x_shape):
        raise ShapeError(f"convolution of input {tuple(x_shape)} with weight {tuple(w_shape)}",
                         op=name, source=source,
                         fix="input (batch, channels, spatial...) and weight (out, in/groups, "
                             "taps...) with 1 to 3 spatial dims")
    batch, chans = x_shape[0], x_shape[1]
    outs, per_group = w_shape[0], w_shape[1]
    if groups < 1 or outs % groups or per_group * groups != chans:
        raise ShapeError(f"{groups} groups: input has {chans} channels, weight {tuple(w_shape)}",
                         op=name, source=source,
                         fix="the weight's dim 1 times groups is the input's channels, and "
                             "groups divides the weight's dim 0")
    wins, size = _windows(name, x_shape[2:], w_shape[2:], stride, padding, dilation, source,
                          pad_hi)
    taps = TAP_MODES[3 - nd:]
    for t, k in zip(taps, w_shape[2:]):
        size[t] = k
    ins, outm = IN_MODES[3 - nd:], OUT_MODES[3 - nd:]
    g = ("g",) if groups > 1 else ()
    size.update(b=batch, c=per_group, o=outs // groups, **({"g": groups} if g else {}))
    in_dims = [(("b",), g + ("c",), *((m,) for m in ins)),
               (g + ("o",), ("c",), *((t,) for t in taps))]
    if bias is not None:
        in_dims.append((g + ("o",),))
    out_dims = (("b",), g + ("o",), *((m,) for m in outm))
    modes = ["b", *g, "o", *outm, "c", *ins, *taps]
    return Op(name, (x, w) + ((bias,) if bias is not None else ()), tuple(in_dims), out,
              out_dims, tuple((m, size[m]) for m in modes), agg="sum", fused="conv",
              splittable=frozenset(["b", *g, "o", "c", *outm]), source=source, windows=wins)


def pool_op(name: str, kind: str, x: str, out: str, x_shape: Sequence[int],
            kernel: int | Sequence[int], *, stride=None, padding=0, dilation=1,
            count_include_pad: bool = True, source: str | None = None) -> Op:
    """Max ("max") or average ("avg") pooling of x (batch, channels, spatial...), torch's
    semantics without ceil mode; stride defaults to the kernel."""
    nd = len(x_shape) - 2
    if nd not in (1, 2, 3) or kind not in ("max", "avg"):
        raise ShapeError(f"{kind} pooling of input {tuple(x_shape)}", op=name, source=source,
                         fix="pool 'max' or 'avg' over input (batch, channels, spatial...)")
    taps = _ints(kernel, nd, "kernel size", name)
    if kind == "avg" and any(v != 1 for v in _ints(dilation, nd, "dilation", name)):
        raise ShapeError("average pooling with dilation", op=name, source=source,
                         fix="average pooling has no dilation (torch's neither)")
    wins, size = _windows(name, x_shape[2:], taps, taps if stride in (None, []) else stride,
                          padding, dilation, source)
    ins, outm = IN_MODES[3 - nd:], OUT_MODES[3 - nd:]
    size.update(b=x_shape[0], c=x_shape[1])
    modes = ["b", "c", *outm, *ins]
    params = (("count_include_pad", bool(count_include_pad)),) if kind == "avg" else ()
    return Op(name, (x,), ((("b",), ("c",), *((m,) for m in ins)),), out,
              (("b",), ("c",), *((m,) for m in outm)), tuple((m, size[m]) for m in modes),
              agg=kind if kind == "max" else "sum", fused=f"{kind}_pool", params=params,
              splittable=frozenset(["b", "c", *outm]), source=source, windows=wins)
