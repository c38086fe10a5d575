"""A training step captured as one graph (`trace_step`): the loss and every parameter's
gradient, checked against torch.autograd on the reference evaluator, under random plans on
the local executor and on gloo ranks."""
from __future__ import annotations

import functools
import logging
import math
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import einsummable as es
from einsummable.errors import EinsummableError, UnsupportedOpError
from einsummable.backend.lowering import lower
from einsummable.backend.runtime.local import run_local
from einsummable.frontend.capture import bind_step, trace_step
from einsummable.models.gpt2 import GPT2Block, GPT2Config
from einsummable.models.llama import LlamaBlock, LlamaConfig
from einsummable.models import preset
from einsummable.models.mlp import MLP

from helpers import TOPOS, max_rel_err, random_choice

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


def _gpt2(batch: int, seq: int):
    torch.manual_seed(0)
    block = GPT2Block(GPT2Config(dim=32, n_heads=4, ffn_dim=48), seed=0)
    with torch.no_grad():  # norm weights and biases away from 1 and 0
        for n, p in block.named_parameters():
            if "ln_" in n:
                p.uniform_(0.5, 1.5) if n.endswith("weight") else p.uniform_(-0.5, 0.5)
    return block, torch.randn(batch, seq, 32, generator=torch.Generator().manual_seed(0))


CASES = {
    # uneven sizes: batch 3, sequence 5, GQA with 2 kv heads
    "llama-mse": lambda: (*_llama(3, 5), torch.nn.functional.mse_loss),
    # causal SDPA, layer norm with bias, tanh GELU, biases; uneven batch and sequence
    "gpt2-mse": lambda: (*_gpt2(3, 5), torch.nn.functional.mse_loss),
    "mlp-sum-bias": lambda: (MLP([12, 20, 7], act="gelu"), torch.randn(6, 12),
                             lambda out, y: ((out - y) ** 2).sum()),
}


def _preset(name: str):
    module, (x,) = preset(name, batch=2, seq=5)
    return module, x, torch.nn.functional.mse_loss


# Cases of the property under random plans: GPT-2 calls sdpa; llama-tiny spells attention out
# (fused before differentiation, `capture/fuse_grad.py`); mistral-tiny is GQA through sdpa.
PLANNED = {"gpt2-mse": CASES["gpt2-mse"], "llama-tiny": lambda: _preset("llama-tiny"),
           "mistral-tiny": lambda: _preset("mistral-tiny")}


@functools.lru_cache(maxsize=None)
def _planned_step(case: str):
    """A case's module, input, targets, step graph, and autograd's loss and gradients
    (traced once for every example of the property)."""
    module, x, loss_fn = PLANNED[case]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    return (module, x, y, step, *_autograd(module, (x,), loss_fn, (y,)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_graph_gives_autograds_loss_and_gradients(case):
    module, x, loss_fn = CASES[case]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    loss, grads = _autograd(module, (x,), loss_fn, (y,))
    _check(es.evaluate(step.graph, bind_step(step, module, (x,), (y,))), step, loss, grads)


@pytest.mark.parametrize("model_type,overrides", [
    ("gpt2", {"n_embd": 32, "n_head": 4}),
    ("llama", {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 48})])
def test_transformers_sdpa_layers_give_autograds_gradients(model_type, overrides):
    # transformers' sdpa attention (GQA for llama): the backward as attention_grad ops
    module, (x,) = es.models.hf(model_type, batch=2, seq=5, dtype=torch.float32,
                                device="cpu", overrides=overrides)
    y = torch.randn_like(module(x))
    loss_fn = torch.nn.functional.mse_loss
    step = trace_step(module, (x,), loss_fn, (y,))
    assert sum(op.fused == "attention_grad" for op in step.graph.ops) == 3
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
    # amax's backward picks the maxima by comparing the data with them: no join-agg form
    class Peak(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            return self.w(x).amax(-1)
    x = torch.randn(4, 8)
    with pytest.raises(UnsupportedOpError, match="cannot capture ATen op aten.eq"):
        trace_step(Peak(), (x,), torch.nn.functional.mse_loss, (torch.randn(4),))


@pytest.mark.parametrize("case", sorted(PLANNED))
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.sampled_from([2, 3, 4, 8]))
def test_step_gradients_under_random_plans(case, seed, n):
    # causal attention's backward as three attention_grad ops, split at random (dK and dV as
    # partial sums over the queries where the queries are split), layer norm with bias, GELU,
    # RMSNorm, rotary embeddings, GQA
    module, x, y, step, loss, grads = _planned_step(case)
    choice = random_choice(step.graph, n, random.Random(seed))
    outs = run_local(lower(step.graph, choice, TOPOS[n]), bind_step(step, module, (x,), (y,)))
    _check(outs, step, loss, grads)


def test_bind_step_counts_its_tensors():
    module, x, loss_fn = CASES["mlp-sum-bias"]()
    y = torch.randn_like(module(x))
    step = trace_step(module, (x,), loss_fn, (y,))
    with pytest.raises(EinsummableError, match="takes 2 tensors"):
        bind_step(step, module, (x,), ())


def _sized(op, graph, size: int) -> int:
    return sum(d == size for d in graph.tensor(op.output).shape)


def test_spelled_out_attention_trains_fused_and_keeps_no_scores():
    # LLaMA's attention is matmul, scale, -inf triu mask, float softmax, matmul: its step
    # has the fused forward and the three backward ops, and no tensor of seq x seq scores
    # (fuse=False keeps the chain and its backward as written: scores and probabilities)
    seq = 7  # no other size of llama-tiny (batch 2, width 64, 4 heads of 16, FFN 172) is 7
    module, (x,) = preset("llama-tiny", batch=2, seq=seq)
    y = torch.randn_like(module(x))
    for fuse in (True, False):
        step = trace_step(module, (x,), torch.nn.functional.mse_loss, (y,), fuse=fuse)
        fused = sorted(op.fused for op in step.graph.ops if op.fused in ("attention",
                                                                         "attention_grad"))
        scores = [op.name for op in step.graph.ops if _sized(op, step.graph, seq) >= 2]
        assert fused == (["attention"] + ["attention_grad"] * 3 if fuse else [])
        assert (scores == []) == fuse, scores


class _Attention(torch.nn.Module):
    """Spelled-out causal attention over (batch, heads, seq, width) projections of x;
    `reuse` also adds the probabilities' sum to the output (a reader outside the chain)."""

    def __init__(self, reuse: bool) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 3 * 8, bias=False)
        self.reuse = reuse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # q, k and v sliced from one tensor: each operand of the fused ops has its own
        # size-1 mode for its slice, which the backward kernel drops as the forward does
        q, k, v = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
        mask = torch.full((s, s), float("-inf")).triu(1)
        probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4) + mask, dim=-1)
        out = probs @ v
        if self.reuse:
            out = out + probs.sum(-1, keepdim=True)
        return out


class _Shifted(_Attention):
    """The same with a mask that is not the causal one (each query also sees the next key)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
        mask = torch.full((s, s), float("-inf")).triu(2)
        return torch.softmax(q @ k.transpose(-2, -1) + mask, dim=-1) @ v


# module, why it is not fused (None: fused)
UNFUSED = {"own": (lambda: _Attention(False), None),
           "reused-probabilities": (lambda: _Attention(True), "read outside the chain"),
           "other-mask": (lambda: _Shifted(False), "other than one causal mask")}


@pytest.mark.parametrize("case", sorted(UNFUSED))
def test_spelled_out_attention_fuses_only_where_the_chain_is_exactly_its_own(case, caplog):
    # probabilities read outside the chain, another mask: left spelled out (correct), the
    # reason logged
    make, why = UNFUSED[case]
    torch.manual_seed(0)
    module, x = make(), torch.randn(2, 5, 8)
    y = torch.randn_like(module(x))
    with caplog.at_level(logging.DEBUG, logger="einsummable.frontend.capture.fuse_grad"):
        step = trace_step(module, (x,), torch.nn.functional.mse_loss, (y,))
    fused = sum(op.fused in ("attention", "attention_grad") for op in step.graph.ops)
    assert fused == (4 if why is None else 0)
    assert why is None or why in caplog.text
    loss, grads = _autograd(module, (x,), torch.nn.functional.mse_loss, (y,))
    _check(es.evaluate(step.graph, bind_step(step, module, (x,), (y,))), step, loss, grads)
