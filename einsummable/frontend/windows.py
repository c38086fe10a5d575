"""Windowed dimensions: the input access of convolution and pooling, and the halo it implies.

Convolution is a join-agg op whose input is read through a window:

    out[b, g o, y, x] = sum over c, k, l of
        in[b, g c, y s_h + k d_h - p_h, x s_w + l d_w - p_w] * w[g o, c, k, l]  (+ bias[g o])

with stride s, dilation d, low padding p per spatial dimension and groups g splitting the
channels (input channel g c reads only the out channels g o of its group). Pooling is the same
access with no weight, the kernel's K elements folded by max or by a sum over K (average).

The input's spatial dimension is a mode of its own (h, of extent H), never split; a `Window`
ties it to the output mode it is read through (y, of extent Y). An output block of rows
[y0, y1) reads the input rows

    [y0 s - p,  (y1 - 1) s + (K - 1) d - p + 1)  ∩  [0, H)                      (its window)

and rows outside [0, H) are padding (zero for convolution and average pooling, -inf for max).
A decomposition that splits y into blocks makes each tuple's input region this window, so two
neighbouring blocks' windows overlap by (K - 1) d - s + 1 rows where that is positive: the
*halo*. The exchange synthesis sees the overlap as an ordinary need (a region of the input on
the block's device) and fetches the halo rows from the neighbour that holds them; no other
stage knows windows exist. A block pads only where its window runs past the true border of the
input, [0, H): a block whose window starts at row y0 s - p < 0 pads -(y0 s - p) rows before,
one whose window ends past H pads the excess after; interior blocks pad nothing.

The output extent is Y = floor((H + p + p_hi - (K - 1) d - 1) / s) + 1 for the high padding
p_hi; the op keeps Y, so p_hi is implied. Every output's window must meet the input (p ≤ (K - 1) d
and (Y - 1) s - p < H), so no tuple's input region is empty.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ShapeError

Range = tuple[int, int]


@dataclass(frozen=True)
class Window:
    """Input mode `mode` (extent H) is read through output mode `out` (extent Y): output row
    y reads input rows y * stride + k * dilation - padding for k in [0, kernel)."""

    mode: str
    out: str
    kernel: int
    stride: int = 1
    dilation: int = 1
    padding: int = 0

    def to_json(self) -> list:
        return [self.mode, self.out, self.kernel, self.stride, self.dilation, self.padding]

    @staticmethod
    def from_json(d: list) -> "Window":
        m, o, k, s, dl, p = d
        return Window(m, o, int(k), int(s), int(dl), int(p))

    def span(self, out: Range) -> Range:
        """The rows output rows `out` read, padding included (may run past [0, H))."""
        y0, y1 = out
        return (y0 * self.stride - self.padding,
                (y1 - 1) * self.stride + (self.kernel - 1) * self.dilation - self.padding + 1)

    def read(self, out: Range, extent: int) -> Range:
        """The input rows output rows `out` read, clipped to [0, extent): the block's window."""
        lo, hi = self.span(out)
        return max(lo, 0), min(hi, extent)

    def pads(self, out: Range, have: Range) -> tuple[int, int, int, int]:
        """(skip, take, before, after): of a block holding input rows `have`, the rows from
        `skip` on, `take` of them, padded with `before` and `after` rows, are exactly the rows
        output rows `out` read (padding only where the window runs past what the block has)."""
        lo, hi = self.span(out)
        a, b = max(lo, have[0]), min(hi, have[1])
        return a - have[0], b - a, a - lo, hi - b


def out_extent(extent: int, kernel: int, stride: int, dilation: int, pad_lo: int,
               pad_hi: int) -> int:
    """Y for an input extent H padded by pad_lo before and pad_hi after (module docstring)."""
    return (extent + pad_lo + pad_hi - (kernel - 1) * dilation - 1) // stride + 1


def check_window(win: Window, size: dict[str, int], op: str, source: str | None) -> None:
    """Every output's window meets the input (module docstring); raises a ShapeError."""
    if win.mode not in size or win.out not in size:
        raise ShapeError(f"window over {win.mode!r} through {win.out!r} names a mode the op lacks",
                         op=op, source=source)
    if min(win.kernel, win.stride, win.dilation) < 1 or win.padding < 0:
        raise ShapeError(f"window over {win.mode!r}: kernel {win.kernel}, stride {win.stride}, "
                         f"dilation {win.dilation}, padding {win.padding}", op=op, source=source,
                         fix="kernel, stride and dilation are positive, padding non-negative")
    extent, y = size[win.mode], size[win.out]
    if win.padding > (win.kernel - 1) * win.dilation or (y - 1) * win.stride - win.padding >= extent:
        raise ShapeError(f"window over {win.mode!r} (extent {extent}) with kernel {win.kernel}, "
                         f"stride {win.stride}, dilation {win.dilation}, padding {win.padding} "
                         f"has outputs that read padding only ({y} outputs)", op=op,
                         source=source, fix="use padding at most (kernel - 1) * dilation and an "
                                            "output extent whose windows meet the input")
