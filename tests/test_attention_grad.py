"""The attention backward's kernel ("attention_grad"): its three ops equal torch.autograd's
gradients of attention, and every decomposition of each (batch, heads and queries split; dK
and dV as partial sums over the queries) equals the whole op."""
from __future__ import annotations

import pytest
import torch

from einsummable.frontend.capture import trace_step
from einsummable.frontend.reference import evaluate_op
from einsummable.planning.spec import decompositions

from helpers import evaluate_by_tuples, max_rel_err

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
