"""Fused kernels: ops whose body is one library call rather than a join expression.

A kernel runs on the blocks of one tuple. It also gets the global index range of every mode of
that tuple, because some kernels depend on where the block sits (a causal mask compares global
query and key positions). Each kernel states which modes it lets a decomposition split; the
others stay whole inside every tuple.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from .einsum import Dims, flat_modes


class FusedOp(Protocol):
    """What a kernel reads of its op (an `ir.Op` with `fused` set): the kernel sits below the
    IR, which looks kernels up by name for their FLOP counts and splittable modes."""
    fused: str | None
    in_dims: tuple[Dims, ...]
    size: Mapping[str, int]

    @property
    def modes(self) -> tuple[str, ...]: ...

    @property
    def out_modes(self) -> tuple[str, ...]: ...

    @property
    def param(self) -> dict[str, Any]: ...

Ranges = dict[str, tuple[int, int]]

# Scalar operations per score element of attention besides the two matmuls:
# scale, mask, max, subtract, exp, sum, divide.
SOFTMAX_OPS_PER_SCORE = 7
# Per element of a normalisation: square, sum, scale, (sub, mean for layer norm) and the affine.
NORM_OPS_PER_ELEMENT = 4
LAYER_NORM_EXTRA_OPS = 3
SOFTMAX_OPS_PER_ELEMENT = 5


@dataclass(frozen=True)
class Kernel:
    name: str
    run: Callable[[FusedOp, Sequence[torch.Tensor], Ranges], torch.Tensor]
    flops: Callable[[FusedOp], int]
    doc: str
    # The kernel for blocks of given extents with what depends on them worked out once
    # (executors bind each instruction's kernel once per plan); None: `run` as it is.
    bind: Callable[[FusedOp, Ranges], Callable[[Sequence[torch.Tensor]], torch.Tensor]] \
        | None = None


def _sdpa(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """q bhqe, k bhke, v bhkf [, additive mask over a subset of b h q k] -> bhqf."""
    q, k, v = xs[0], xs[1], xs[2]
    scale = op.param.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bhqe,bhke->bhqk", q, k) * scale
    qm, km = op.in_dims[0][2][0], op.in_dims[1][2][0]
    if op.param.get("causal", False):
        q0, q1 = ranges[qm]
        k0, k1 = ranges[km]
        qi = torch.arange(q0, q1, device=q.device)[:, None]
        ki = torch.arange(k0, k1, device=q.device)[None, :]
        scores = scores.masked_fill(ki > qi, float("-inf"))
    if len(xs) > 3:
        scores = scores + _align(xs[3], op.in_dims[3], op.in_dims[0][:3] + (op.in_dims[1][2],))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    # A fully masked row (possible only for blocks of keys) yields NaN; it contributes nothing.
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("bhqk,bhkf->bhqf", probs, v)


def _align(t: torch.Tensor, dims, target) -> torch.Tensor:
    """View `t` (dims over a subset of `target`'s modes, same order) as broadcastable to target."""
    have = [g[0] for g in dims]
    shape = []
    it = iter(t.shape)
    for g in target:
        shape.append(next(it) if g[0] in have else 1)
    return t.reshape(shape)


def _sdpa_flops(op: FusedOp) -> int:
    b, h, q, e = (op.size[g[0]] for g in op.in_dims[0])
    kk = op.size[op.in_dims[1][2][0]]
    f = op.size[op.in_dims[2][3][0]]
    matmuls = 2 * b * h * q * kk * (e + f)
    softmax = SOFTMAX_OPS_PER_SCORE * b * h * q * kk
    return matmuls + softmax  # causal counts in full, as in `_attention_flops`


def _axis(op: FusedOp) -> int:
    return op.out_modes.index(op.param["axis"])


def _softmax(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    return torch.softmax(xs[0], dim=_axis(op))


def _log_softmax(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    return torch.log_softmax(xs[0], dim=_axis(op))


def _rms_norm(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    x, w = xs[0], xs[1]
    var = x.float().pow(2).mean(dim=-1, keepdim=True)
    offset = op.param.get("offset", 0.0)  # Gemma scales by (1 + w)
    return (x.float() * torch.rsqrt(var + op.param["eps"])).to(x.dtype) * (w + offset if offset
                                                                            else w)


def _layer_norm(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, op.param["eps"])


def _elementwise_flops(per_element: int) -> Callable[[FusedOp], int]:
    return lambda op: per_element * math.prod(op.size.values())


KERNELS: dict[str, Kernel] = {
    k.name: k for k in (
        Kernel("sdpa", _sdpa, _sdpa_flops,
               "scaled dot-product attention; splits batch, heads and queries"),
        Kernel("softmax", _softmax, _elementwise_flops(SOFTMAX_OPS_PER_ELEMENT),
               "softmax over param 'axis'; splits every other mode"),
        Kernel("log_softmax", _log_softmax, _elementwise_flops(SOFTMAX_OPS_PER_ELEMENT + 1),
               "log-softmax over param 'axis'"),
        Kernel("rms_norm", _rms_norm, _elementwise_flops(NORM_OPS_PER_ELEMENT),
               "x * rsqrt(mean(x^2) + eps) * w over the last mode; splits the others"),
        Kernel("layer_norm", _layer_norm,
               _elementwise_flops(NORM_OPS_PER_ELEMENT + LAYER_NORM_EXTRA_OPS),
               "layer norm over the last mode with optional weight and bias"),
    )
}


def run_kernel(op: FusedOp, blocks: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    return KERNELS[op.fused].run(op, blocks, ranges)


def bind_kernel(op: FusedOp, ranges: Ranges) -> Callable[[Sequence[torch.Tensor]], torch.Tensor]:
    """`run_kernel` with the op and its block ranges bound."""
    kernel = KERNELS[op.fused]
    if kernel.bind is not None:
        return kernel.bind(op, ranges)
    run = kernel.run
    return lambda blocks: run(op, blocks, ranges)


# --------------------------------------------------------------------------- added by capture

def fine_blocks(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> list[torch.Tensor]:
    """Blocks viewed with one axis per mode (grouped dims split), block-local extents."""
    ext = {m: hi - lo for m, (lo, hi) in ranges.items()}
    return [x.reshape([ext[m] for g in d for m in g]) for x, d in zip(xs, op.in_dims)]


def positions(modes: str, op: FusedOp, ranges: Ranges, device) -> torch.Tensor:
    """Global flat index (row-major over `modes`, full sizes) of every element of a block."""
    pos = torch.zeros((), dtype=torch.long, device=device)
    for m in modes:
        lo, hi = ranges[m]
        pos = pos[..., None] * op.size[m] + torch.arange(lo, hi, device=device)
    return pos.reshape(-1)


def _attention(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """Layout-generic attention: params name the query ("q"), key ("k"), head-width ("e") and
    value-width ("f") modes; every other output mode is a batch mode (batch, heads, or the
    query-group mode of grouped-query attention, which k and v lack). Operand 3, if present, is
    an additive mask over a subset of the batch, query and key modes."""
    return bind_attention(op, ranges)(xs)


@dataclass(frozen=True)
class _SdpaPlan:
    """How one attention op's operands map onto torch's (N, H, L, E) sdpa layout."""
    shared: str     # batch modes k and v have too (the kv heads)
    group: str      # batch modes only q has (query heads per kv head)
    names: tuple[str, ...]  # per operand, its flat modes less the size-1 batch modes
    out: str                # output modes, likewise


# Plans depend on the op only; ops hash by value, so a plan is shared by equal ops.
PLAN_CACHE_SIZE = 1024


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _sdpa_plan(op: FusedOp) -> _SdpaPlan | None:
    p = op.param
    qm, km, em, fm = p["q"], p["k"], p["e"], p["f"]
    # Size-1 batch modes are dropped: a batch of one is captured with a separate size-1 mode
    # per operand (and a broadcast one in the output), which would otherwise miss this path.
    one = {m for m in op.modes if op.size[m] == 1} - set(qm + km + em + fm)
    names = tuple("".join(m for m in flat_modes(d) if m not in one) for d in op.in_dims)
    nq, nk, nv = names[:3]
    out_modes = "".join(m for m in op.out_modes if m not in one)
    batch = [m for m in out_modes if m not in qm and m not in fm]
    if any(m not in nq for m in batch) or not qm or not km or not fm:
        return None
    shared = "".join(m for m in batch if m in nk)
    group = "".join(m for m in batch if m not in nk)
    if any(m in nv for m in group) or set(nk) - set(shared + km + em) \
            or set(nv) - set(shared + km + fm) or set(nq) - set(shared + group + qm + em) \
            or set(out_modes) != set(shared + group + qm + fm):
        return None
    if len(names) > 3 and set(names[3]) - set(shared + group + qm + km):
        return None
    return _SdpaPlan(shared, group, names, out_modes)


class _Views:
    """A chain of view calls (reshape, permute, expand) on an operand whose shape is known
    when a kernel is bound to its block extents: worked out once, identity steps dropped, so
    a call pays for the views that change something (each view call costs about a
    microsecond, as much as small blocks' arithmetic)."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.start = torch.Size(shape)
        self.shape = self.start
        self.steps: list[tuple[str, tuple[int, ...]]] = []

    def reshape(self, shape: Sequence[int]) -> "_Views":
        return self._resized("reshape", shape)

    def expand(self, shape: Sequence[int]) -> "_Views":
        return self._resized("expand", shape)

    def _resized(self, call: str, shape: Sequence[int]) -> "_Views":
        shape = torch.Size(shape)
        if shape != self.shape:
            self.steps.append((call, tuple(shape)))
            self.shape = shape
        return self

    def to_modes(self, have: str, want: str, ext: Mapping[str, int]) -> "_Views":
        """From one axis per mode of `have` to `want`'s order; absent modes become size 1."""
        present = [m for m in want if m in have]
        if present != list(have):
            perm = tuple(have.index(m) for m in present)
            self.steps.append(("permute", perm))
            self.shape = torch.Size(self.shape[i] for i in perm)
        return self.reshape([ext[m] if m in have else 1 for m in want])

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if t.shape != self.start:  # a block in another grouping of the same elements
            t = t.reshape(self.start)
        for name, arg in self.steps:
            t = getattr(t, name)(arg)
        return t


def _bind_sdpa(op: FusedOp, ranges: Ranges, plan: _SdpaPlan
               ) -> Callable[[Sequence[torch.Tensor]], torch.Tensor]:
    """The attention op on blocks of these extents as torch's sdpa, its operands' views
    worked out here (`_Views`)."""
    p = op.param
    qm, km, em, fm = p["q"], p["k"], p["e"], p["f"]
    ext = {m: hi - lo for m, (lo, hi) in ranges.items()}
    n = lambda ms: math.prod(ext[m] for m in ms)  # noqa: E731
    # Operands viewed with one axis per mode the plan uses (size-1 batch modes dropped).
    fine = [_Views([ext[m] for m in nm]) for nm in plan.names]
    sh, gr = plan.shared, plan.group
    # sdpa's (N, H, L, E): the last shared mode (with the query groups) is H, the other
    # shared modes are N. Operands are permuted views; splitting there, not at N = 1, keeps
    # them views (merging a permuted batch and head mode would copy every operand).
    lead, head = sh[:-1], sh[-1:]
    q = fine[0].to_modes(plan.names[0], sh + gr + qm + em, ext).reshape(
        (n(lead), n(head + gr), n(qm), n(em)))
    k = fine[1].to_modes(plan.names[1], sh + km + em, ext).expand(
        [ext[m] for m in sh + km + em]).reshape((n(lead), n(head), n(km), n(em)))
    v = fine[2].to_modes(plan.names[2], sh + km + fm, ext).expand(
        [ext[m] for m in sh + km + fm]).reshape((n(lead), n(head), n(km), n(fm)))
    add = None
    if len(plan.names) > 3:
        add = fine[3].to_modes(plan.names[3], sh + gr + qm + km, ext).expand(
            [ext[m] for m in sh + gr + qm + km]).reshape((n(lead), n(head + gr), n(qm), n(km)))
    causal, positional = False, False
    if p.get("causal", False):
        (q0, _), (k0, _) = ranges[qm[0]], ranges[km[0]]
        # local and global positions agree: torch's top-left causal mask; else a mask of
        # global positions
        causal = len(qm) == 1 and len(km) == 1 and q0 == k0
        positional = not causal
    have = sh + gr + qm + fm
    out = _Views([n(lead), n(head + gr), n(qm), n(fm)]).reshape(
        [ext[m] for m in have]).to_modes(have, plan.out, ext)
    scale, gqa = p["scale"], n(gr) > 1

    def run(xs: Sequence[torch.Tensor]) -> torch.Tensor:
        qt = q(xs[0])
        mask = None
        if positional:
            pq = positions(qm, op, ranges, qt.device)
            pk = positions(km, op, ranges, qt.device)
            mask = pk[None, :] <= pq[:, None]
        if add is not None:
            extra = add(xs[3]).to(qt.dtype)
            mask = extra if mask is None else extra.masked_fill(~mask, float("-inf"))
        y = torch.nn.functional.scaled_dot_product_attention(
            qt, k(xs[1]), v(xs[2]), attn_mask=mask, is_causal=causal, scale=scale,
            enable_gqa=gqa)
        if mask is not None:  # a fully masked row is NaN in torch; it contributes nothing here
            y = torch.nan_to_num(y, nan=0.0)
        return out(y)
    return run


def bind_attention(op: FusedOp, ranges: Ranges
                   ) -> Callable[[Sequence[torch.Tensor]], torch.Tensor]:
    """The attention kernel on blocks of these extents, with what depends on them worked out
    once (executors bind each instruction's kernel once per plan)."""
    fast = _sdpa_plan(op)
    if fast is not None:
        return _bind_sdpa(op, ranges, fast)
    return lambda xs: _attention_einsum(op, xs, ranges)


def _attention_einsum(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """Any layout the sdpa path does not take: scores, mask, float softmax, probs·v."""
    p = op.param
    qm, km, fm = p["q"], p["k"], p["f"]
    fine = fine_blocks(op, xs, ranges)
    names = ["".join(flat_modes(d)) for d in op.in_dims]
    batch = "".join(m for m in op.out_modes if m not in qm and m not in fm
                    and (m in names[0] or m in names[1]))
    target = batch + qm + km
    scores = torch.einsum(f"{names[0]},{names[1]}->{target}", fine[0], fine[1]) * p["scale"]
    ext = {m: hi - lo for m, (lo, hi) in ranges.items()}
    if p.get("causal", False):
        pq = positions(qm, op, ranges, scores.device)
        pk = positions(km, op, ranges, scores.device)
        hide = (pk[None, :] > pq[:, None]).reshape([ext[m] for m in qm + km])
        scores = scores.masked_fill(hide, float("-inf"))
    if len(xs) > 3:
        have = "".join(m for m in target if m in names[3])
        mask = torch.einsum(f"{names[3]}->{have}", fine[3])
        scores = scores + mask.reshape([ext[m] if m in have else 1 for m in target])
    lead = [ext[m] for m in batch + qm]
    flat = scores.reshape(lead + [-1]).float()
    probs = torch.nan_to_num(torch.softmax(flat, dim=-1), nan=0.0).to(fine[0].dtype)
    probs = probs.reshape(scores.shape)
    out = "".join(m for m in op.out_modes if m in target or m in names[2])
    return torch.einsum(f"{target},{names[2]}->{out}", probs, fine[2])


def _attention_flops(op: FusedOp) -> int:
    p = op.param
    size = lambda ms: math.prod(op.size[m] for m in ms)  # noqa: E731
    batch = size(m for m in op.out_modes if m not in p["q"] and m not in p["f"])
    scores = batch * size(p["q"]) * size(p["k"])
    # Causal attention counts every score: the CPU kernel computes the masked half too (torch's
    # sdpa takes as long causal as not), and split queries need an explicit mask.
    return 2 * scores * (size(p["e"]) + size(p["f"])) + SOFTMAX_OPS_PER_SCORE * scores


def _embedding(op: FusedOp, xs: Sequence[torch.Tensor], ranges: Ranges) -> torch.Tensor:
    """Rows of table xs[0] (first dim: the vocabulary, never split) picked by indices xs[1]."""
    table, idx = xs[0], xs[1]
    return table.reshape(table.shape[0], -1)[idx.long()]


KERNELS.update({
    k.name: k for k in (
        Kernel("attention", _attention, _attention_flops,
               "attention over any layout (views read in place, grouped-query heads shared); "
               "splits batch, head and query modes", bind_attention),
        Kernel("embedding", _embedding, _elementwise_flops(1),
               "table lookup; splits the index modes and the embedding width"),
    )
})
