"""A training step captured as one graph (`trace_step`): the loss and every parameter's
gradient, checked against torch.autograd on the reference evaluator and on gloo ranks."""
from __future__ import annotations

import pytest
import torch

import einsummable as es
from einsummable.errors import EinsummableError, UnsupportedOpError
from einsummable.frontend.capture import bind_step, trace_step
from einsummable.models.llama import LlamaBlock, LlamaConfig
from einsummable.models.mlp import MLP

from helpers import max_rel_err

TOL = 1e-5


def _autograd(module, args, loss_fn, targets):
    module.zero_grad()
    loss = loss_fn(module(*args), *targets)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in module.named_parameters()}


def _check(outs, step, loss, grads):
    assert max_rel_err(outs[step.loss].reshape(()), loss) <= TOL
    assert {n for n, _ in step.grads} == set(grads)
    for name, out in step.grads:
        assert max_rel_err(outs[out].reshape(grads[name].shape), grads[name]) <= TOL, name


def _llama(batch: int, seq: int):
    cfg = LlamaConfig(dim=48, n_heads=4, n_kv_heads=2, ffn_dim=80, max_seq=64)
    torch.manual_seed(0)
    block = LlamaBlock(cfg)
    with torch.no_grad():  # norm weights away from 1, so their gradients are not trivial
        for n, p in block.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return block, torch.randn(batch, seq, cfg.dim)


CASES = {
    # uneven sizes: batch 3, sequence 5, GQA with 2 kv heads
    "llama-mse": lambda: (*_llama(3, 5), torch.nn.functional.mse_loss),
    "mlp-sum-bias": lambda: (MLP([12, 20, 7], act="gelu"), torch.randn(6, 12),
                             lambda out, y: ((out - y) ** 2).sum()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_graph_gives_autograds_loss_and_gradients(case):
    module, x, loss_fn = CASES[case]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    loss, grads = _autograd(module, (x,), loss_fn, (y,))
    _check(es.evaluate(step.graph, bind_step(step, module, (x,), (y,))), step, loss, grads)


def test_a_planned_step_runs_on_gloo_ranks_as_autograd():
    module, x, loss_fn = CASES["llama-mse"]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    loss, grads = _autograd(module, (x,), loss_fn, (y,))
    plan = es.optimize(step.graph, "cpu4", cache=False)
    # the loss is a 0-d partial sum where the batch is split: folded like any other
    outs = es.run(plan, bind_step(step, module, (x,), (y,)), backend="gloo")
    _check(outs, step, loss, grads)


def test_a_backward_with_no_join_mapping_is_named():
    # SDPA with a mask: its backward guards fully masked rows by comparing scores to -inf
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            q = self.w(x).view(2, 4, 2, 4).transpose(1, 2)
            mask = torch.ones(4, 4, dtype=torch.bool).tril()
            return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    x = torch.randn(2, 4, 8)
    with pytest.raises(UnsupportedOpError, match="cannot capture ATen op"):
        trace_step(Masked(), (x,), torch.nn.functional.mse_loss, (torch.randn(2, 2, 4, 4),))


def test_bind_step_counts_its_tensors():
    module, x, loss_fn = CASES["mlp-sum-bias"]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    with pytest.raises(EinsummableError, match="takes 2 tensors"):
        bind_step(step, module, (x,), ())
