"""The attention backward's kernel ("attention_grad"): its three ops equal torch.autograd's
gradients of attention, and every decomposition of each (batch, heads and queries split; dK
and dV as partial sums over the queries) equals the whole op. Attention torch runs as math
attention (keys broadcast over the batch) captures spelled out, its guard for fully masked
rows rewritten (`capture/joint.py`)."""
from __future__ import annotations

import math

import pytest
import torch

from einsummable.frontend.capture import trace_step
from einsummable.frontend.reference import evaluate_op
from einsummable.planning.spec import decompositions

from helpers import Fn, evaluate_by_tuples, max_rel_err

TOL = 1e-5


class _Attention(torch.nn.Module):
    """q, k, v from one projection; `mask`: None (causal), "additive" or "gqa"."""

    def __init__(self, mask: str | None) -> None:
        super().__init__()
        self.mask = mask
        self.w = torch.nn.Linear(8, 16 if mask == "gqa" else 24, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        F = torch.nn.functional
        if self.mask == "gqa":  # 4 query heads over 2 kv heads
            q, k, v = self.w(x).split([8, 4, 4], dim=-1)
            q = q.view(b, t, 4, 2).transpose(1, 2)
            k, v = (y.view(b, t, 2, 2).transpose(1, 2) for y in (k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        q, k, v = (y.view(b, t, 2, 4).transpose(1, 2) for y in self.w(x).split(8, dim=-1))
        if self.mask == "additive":
            add = torch.arange(t * t, dtype=x.dtype).reshape(t, t) / (t * t)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.3)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _step(mask):
    torch.manual_seed(0)
    module, x = _Attention(mask), torch.randn(3, 5, 8)
    y = torch.randn_like(module(x))
    return module, x, y, trace_step(module, (x,), torch.nn.functional.mse_loss, (y,))


@pytest.mark.parametrize("mask", [None, "additive", "gqa"])
def test_attention_steps_give_autograds_gradients(mask):
    from einsummable.frontend.capture import bind_step
    from einsummable.frontend.reference import evaluate
    module, x, y, step = _step(mask)
    grads = [op for op in step.graph.ops if op.fused == "attention_grad"]
    assert sorted(op.param["wrt"] for op in grads) == ["k", "q", "v"]
    outs = evaluate(step.graph, bind_step(step, module, (x,), (y,)))
    module.zero_grad()
    loss = torch.nn.functional.mse_loss(module(x), y)
    loss.backward()
    assert max_rel_err(outs[step.loss].reshape(()), loss.detach()) <= TOL
    for name, out in step.grads:
        want = dict(module.named_parameters())[name].grad
        assert max_rel_err(outs[out].reshape(want.shape), want) <= TOL, name


@pytest.mark.parametrize("mask", [None, "additive", "gqa"])
def test_every_decomposition_of_the_backward_ops_equals_the_whole(mask):
    _, _, _, step = _step(mask)
    shapes = {t.name: t.shape for t in step.graph.tensors}
    gen = torch.Generator().manual_seed(1)
    seen_partial = False
    for op in (op for op in step.graph.ops if op.fused == "attention_grad"):
        blocks = [torch.randn(shapes[n], generator=gen) for n in op.inputs]
        whole = evaluate_op(op, blocks)
        for n in (2, 3, 4):
            for dec in decompositions(op, n, replication=False):
                assert {m for m, p in dec.parts if p > 1} <= op.splittable
                seen_partial |= any(dec.part.get(m, 1) > 1 for m in op.agg_modes)
                got = evaluate_by_tuples(op, dec, blocks)
                assert max_rel_err(got, whole) <= TOL, (op.param["wrt"], dec)
    assert seen_partial  # dK and dV were split over the queries they sum


class _SharedKeys(torch.nn.Module):
    """Keys and values of batch 1 broadcast over the queries' batch: torch's CPU kernel
    refuses them, so sdpa runs as math attention. `mask`: the last query attends nothing."""

    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.masked = masked
        self.w = torch.nn.Linear(8, 8, bias=False)
        self.kv = torch.nn.Parameter(torch.randn(1, 2, 5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.w(x).view(b, t, 2, 4).transpose(1, 2)
        if not self.masked:
            return torch.nn.functional.scaled_dot_product_attention(q, self.kv, self.kv,
                                                                    is_causal=True)
        keep = torch.ones(t, 5, dtype=torch.bool)
        keep[-1] = False
        return torch.nn.functional.scaled_dot_product_attention(q, self.kv, self.kv,
                                                                attn_mask=keep)


@pytest.mark.parametrize("masked", [False, True])
def test_math_attention_steps_give_autograds_gradients(masked):
    from einsummable.frontend.capture import bind_step
    from einsummable.frontend.reference import evaluate
    torch.manual_seed(0)
    module, x = _SharedKeys(masked), torch.randn(3, 5, 8)
    y = torch.randn_like(module(x))
    loss_fn = torch.nn.functional.mse_loss
    step = trace_step(module, (x,), loss_fn, (y,))
    assert not any(op.fused == "attention_grad" for op in step.graph.ops)  # spelled out
    outs = evaluate(step.graph, bind_step(step, module, (x,), (y,)))
    module.zero_grad()
    loss = loss_fn(module(x), y)
    loss.backward()
    assert torch.isfinite(loss) and max_rel_err(outs[step.loss].reshape(()), loss.detach()) <= TOL
    for name, out in step.grads:
        want = dict(module.named_parameters())[name].grad
        assert max_rel_err(outs[out].reshape(want.shape), want) <= TOL, name


def test_nan_to_num_maps_only_nan_to_zero():
    from einsummable.errors import UnsupportedOpError
    from einsummable.frontend.capture import bind, trace
    from einsummable.frontend.reference import evaluate
    zero = Fn(lambda m, x: torch.nan_to_num(x, nan=0.0, posinf=math.inf, neginf=-math.inf))
    graph = trace(zero, (torch.ones(3),))
    x = torch.tensor([float("nan"), math.inf, -2.0])
    got = evaluate(graph, bind(graph, zero, (x,)))[graph.outputs[0]]
    assert got.tolist() == [0.0, math.inf, -2.0]
    with pytest.raises(UnsupportedOpError, match="keeping infinities"):
        trace(Fn(lambda m, x: torch.nan_to_num(x)), (torch.ones(3),))  # inf to the dtype's max


def test_on_the_meta_device_the_backward_is_fused_too():
    # torch runs sdpa on meta tensors as math attention; the step graph is the CPU kernel's
    from einsummable.models import preset
    module, (x,) = preset("gpt2-tiny", batch=2, seq=8, device="meta")
    step = trace_step(module, (x,), torch.nn.functional.mse_loss, (torch.empty_like(x),))
    fused = sorted(op.param.get("wrt", "forward") for op in step.graph.ops
                   if op.fused in ("attention", "attention_grad"))
    assert fused == ["forward", "k", "q", "v"]


def test_the_flash_kernels_give_the_spelled_out_gradients_on_every_block(monkeypatch):
    # dQ, dK and dV by torch's CPU flash kernels (`attention_grad._flash`) against the
    # scores spelled out, on the whole op and on every block of 2-4 tuples (queries split:
    # a mask of global positions; batch and heads split)
    from einsummable.frontend import attention_grad
    _, _, _, step = _step(None)
    shapes = {t.name: t.shape for t in step.graph.tensors}
    gen = torch.Generator().manual_seed(2)
    ops = [op for op in step.graph.ops if op.fused == "attention_grad"]
    blocks = {op.name: [torch.randn(shapes[n], generator=gen) for n in op.inputs] for op in ops}
    used = []
    real = attention_grad._flash

    def spy(*args):
        out = real(*args)
        used.append(out is not None)
        return out
    results = {}
    for flash in (True, False):
        monkeypatch.setattr(attention_grad, "_flash", spy if flash else (lambda *a: None))
        for op in ops:
            results[(flash, op.name, "whole")] = evaluate_op(op, blocks[op.name])
            for n in (2, 4):
                for dec in decompositions(op, n, replication=False):
                    results[(flash, op.name, str(dec))] = evaluate_by_tuples(
                        op, dec, blocks[op.name])
    assert used and all(used)  # every call took the flash kernels
    for (flash, name, dec), got in results.items():
        if flash:
            assert max_rel_err(got, results[(False, name, dec)]) <= TOL, (name, dec)


def test_the_three_gradient_ops_share_one_backward_call(monkeypatch):
    # dQ, dK and dV of one attention read the same blocks: one flash backward serves all
    # three (`attention_grad._LAST`), and the step's gradients are still autograd's
    from einsummable.frontend.capture import bind_step
    from einsummable.frontend.reference import evaluate
    module, x, y, step = _step(None)
    aten = torch.ops.aten
    real = aten._scaled_dot_product_flash_attention_for_cpu_backward
    calls = []

    class _Counting:
        def __call__(self, *a, **k):
            calls.append(1)
            return real(*a, **k)

    import einsummable.frontend.attention_grad as ag
    monkeypatch.setattr(ag.torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward",
                        _Counting(), raising=False)
    outs = evaluate(step.graph, bind_step(step, module, (x,), (y,)))
    assert len(calls) == 1
    module.zero_grad()
    torch.nn.functional.mse_loss(module(x), y).backward()
    for name, out in step.grads:
        want = dict(module.named_parameters())[name].grad
        assert max_rel_err(outs[out].reshape(want.shape), want) <= TOL, name
