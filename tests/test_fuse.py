"""Fusion passes: a fused graph computes what the unfused one does (reference, 1e-5), fires only
on chains whose intermediates are their own, and its fused ops split like their specs say."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einsummable.frontend.builder import Builder
from einsummable.frontend.capture import bind, trace
from einsummable.frontend.fuse import fuse, fuse_attention, fuse_rms_norm
from einsummable.models import preset
from einsummable.models.llama_ir import llama_block_graph
from einsummable.frontend.reference import evaluate, evaluate_op
from einsummable.planning.spec import decompositions

from helpers import evaluate_by_tuples, inputs_for, max_rel_err

TOL = 1e-5


def _same(g, f, ins):
    a, b = evaluate(g, ins), evaluate(f, ins)
    for name in g.outputs:
        assert max_rel_err(b[name], a[name]) <= TOL, name


def _attention_graph(h=4, kvh=4, causal=True, mask=False, s=12):
    b = Builder()
    q = b.input("q", (2, h, s, 8))
    k = b.input("k", (2, kvh, s, 8))
    v = b.input("v", (2, kvh, s, 6))
    m = b.input("m", (s, s)) if mask else None
    return b.build([b.attention(q, k, v, causal=causal, mask=m)])


@pytest.mark.parametrize("h,kvh,causal,mask", [(4, 4, True, False), (4, 2, True, False),
                                               (4, 2, False, False), (4, 4, False, True),
                                               (4, 1, True, True)])
def test_builder_attention_fuses_to_one_exact_op(h, kvh, causal, mask):
    g = _attention_graph(h, kvh, causal, mask)
    f = fuse_attention(g)
    assert len(f.ops) == 1 and f.ops[0].fused == "attention", f.summary()
    op = f.ops[0]
    assert op.param["causal"] == (causal and not mask)  # the builder: a mask replaces causal
    assert len(op.inputs) == 3 + mask
    _same(g, f, inputs_for(g, 0))
    # batch, heads (and query groups) and queries split; keys, head width, value width do not
    assert set(op.param["q"]) <= op.splittable
    assert not (set(op.param["k"] + op.param["e"] + op.param["f"]) & op.splittable)


@pytest.mark.parametrize("causal,mask", [(True, False), (False, True)])
def test_fused_attention_decompositions_match_whole(causal, mask):
    g = fuse_attention(_attention_graph(4, 2, causal, mask))
    op = g.ops[0]
    ins = inputs_for(g, 1)
    blocks = [ins[n] for n in op.inputs]
    whole = evaluate_op(op, blocks)
    decs = decompositions(op, 4)
    assert any(d.part.get(m, 1) > 1 for d in decs for m in op.param["q"])
    for dec in decs:
        assert max_rel_err(evaluate_by_tuples(op, dec, blocks), whole) <= TOL, dec


def test_llama_block_fuses_attention_and_norms():
    m, (x,) = preset("llama-tiny", batch=2, seq=16)
    h = llama_block_graph(m.config, 2, 16)
    f = fuse(h)
    assert [op.fused for op in f.ops if op.fused] == ["rms_norm", "attention", "rms_norm"]
    assert len(f.ops) == len(h.ops) - 10  # softmax 4, scores, mask add, 2 views; 2 norms
    assert not any(op.is_view for op in f.ops)
    assert f.bytes < h.bytes
    ins = {"x": x, **{k: v.detach() for k, v in m.named_parameters()}}
    _same(h, f, ins)


def test_trace_fuses_by_default_and_not_with_fuse_false():
    m, (x,) = preset("llama-tiny", batch=2, seq=16)
    g, plain = trace(m, (x,)), trace(m, (x,), fuse=False)
    assert sum(op.fused == "attention" for op in g.ops) == 1
    assert not any(op.fused for op in plain.ops)
    assert any(op.agg == "max" for op in plain.ops)
    ins = bind(g, m, (x,))
    _same(plain, g, ins)
    with torch.no_grad():
        assert max_rel_err(evaluate(g, ins)[g.outputs[0]], m(x)) <= TOL


def test_no_fusion_when_an_intermediate_has_another_reader():
    class Probs(nn.Module):
        def forward(self, q, k, v):
            p = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
            return p @ v, p.sum(-1)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=gen) for _ in range(3))
    g = trace(Probs(), (q, k, v))
    assert not any(op.fused == "attention" for op in g.ops)
    outs = evaluate(g, bind(g, Probs(), (q, k, v)))
    assert max_rel_err(outs[g.outputs[0]], Probs()(q, k, v)[0]) <= TOL


def test_rms_norm_fusion_keeps_rows_splittable():
    b = Builder()
    x = b.input("x", (3, 5, 16))
    w = b.weight("w", (16,))
    g = b.build([b.rms_norm(x, w, 1e-5) * 2.0])
    f = fuse_rms_norm(g)
    op = next(o for o in f.ops if o.fused == "rms_norm")
    assert op.splittable == frozenset(op.out_modes[:-1])
    assert len(f.ops) == len(g.ops) - 1
    _same(g, f, inputs_for(g, 0))
    ins = inputs_for(g, 0)
    for dec in decompositions(op, 3):
        blocks = [ins[n] for n in op.inputs]
        assert max_rel_err(evaluate_by_tuples(op, dec, blocks), evaluate_op(op, blocks)) <= TOL


def test_fusion_flops_are_the_two_matmuls_and_softmax():
    g = fuse_attention(_attention_graph(4, 2, True, False, s=12))
    op = g.ops[0]
    scores = 2 * 4 * 12 * 12
    assert op.flops == 2 * scores * (8 + 6) + 7 * scores  # causal counted in full


def test_batch_of_one_takes_the_sdpa_path():
    # Capture gives a batch of one a separate size-1 mode per operand; the fused attention
    # must still run torch's attention, not the spelled-out einsum fallback.
    import einsummable.frontend.kernels as kernels
    from einsummable.frontend.reference import evaluate
    module, (x,) = preset("llama-tiny", batch=1, seq=16)
    g = trace(module, (x,))
    att = [op for op in g.ops if op.fused == "attention"]
    assert att and all(kernels._sdpa_plan(op) is not None for op in att)
    with torch.no_grad():
        got = evaluate(g, bind(g, module, (x,)))[g.outputs[0]]
        torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 4])
def test_sdpa_reads_the_captured_blocks_in_place(batch, monkeypatch):
    # Queries, keys and values reach torch's attention as views of the blocks the kernel is
    # given (batch and heads kept apart), not as copies: merging a permuted batch and head
    # mode would copy every operand on every call. The output still equals the module's.
    import einsummable.frontend.kernels as kernels
    module, (x,) = preset("llama-tiny", batch=batch, seq=16)
    g = trace(module, (x,))
    seen: list[tuple[int, set[int]]] = []
    real = F.scaled_dot_product_attention
    given: set[int] = set()
    real_run = kernels._attention

    def spy_run(op, xs, ranges):
        given.update(t.untyped_storage().data_ptr() for t in xs)
        return real_run(op, xs, ranges)

    def spy(q, k, v, **kw):
        seen.append(tuple(t.untyped_storage().data_ptr() for t in (q, k, v)))
        return real(q, k, v, **kw)
    monkeypatch.setattr(kernels, "_attention", spy_run)
    monkeypatch.setitem(kernels.KERNELS, "attention", dataclasses.replace(
        kernels.KERNELS["attention"], run=spy_run, bind=None))
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        got = evaluate(g, bind(g, module, (x,)))[g.outputs[0]]
        torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)
    assert seen and all(set(ptrs) <= given for ptrs in seen)


class _WeightFirstRMSNorm(nn.Module):
    """transformers' LLaMA / Qwen2 / Mistral spelling: the weight multiplies from the left."""

    def __init__(self, n: int, gemma: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.gemma = gemma

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.gemma:  # Gemma scales by (1 + w)
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm_fuses_however_the_library_spells_it(gemma):
    from helpers import capture_check
    m = _WeightFirstRMSNorm(16, gemma)
    x = torch.randn(2, 5, 16)
    g = capture_check(m, x)
    assert [op.fused for op in g.ops] == ["rms_norm"], g.summary()
    assert dict(g.ops[0].params).get("offset", 0.0) == (1.0 if gemma else 0.0)
    _same(trace(m, (x,), fuse=False), g, bind(g, m, (x,)))


def test_layer_norm_is_one_kernel_that_splits_rows():
    from helpers import capture_check
    ln = nn.LayerNorm(16)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    g = capture_check(ln, torch.randn(2, 5, 16))
    (op,) = g.ops
    assert op.fused == "layer_norm" and len(op.inputs) == 3
    assert op.splittable == frozenset(op.out_modes[:-1])


def test_half_precision_rms_norm_upcast_fuses_into_the_kernel():
    # x.to(float32) read by both the mean and the scale is a cast op of its own; the kernel
    # upcasts x itself, so the cast joins the chain and the op reads x in half precision
    from helpers import max_rel_err as err
    m = _WeightFirstRMSNorm(16).half()
    x = torch.randn(2, 5, 16).half()
    g, plain = trace(m, (x,)), trace(m, (x,), fuse=False)
    assert len(plain.ops) == 3 and [op.fused for op in g.ops] == ["rms_norm"], g.summary()
    assert g.ops[0].inputs[0] == "x"
    with torch.no_grad():
        assert err(evaluate(g, bind(g, m, (x,)))[g.outputs[0]].float(), m(x).float()) <= 2e-3


class _EagerGQA(nn.Module):
    """transformers' eager attention with grouped-query heads: repeat_kv (expand + reshape),
    scores, softmax in float32, probabilities times values."""

    def forward(self, q, k, v):
        def repeat_kv(x, n):
            b, h, s, d = x.shape
            return x[:, :, None].expand(b, h, n, s, d).reshape(b, h * n, s, d)
        k, v = repeat_kv(k, 2), repeat_kv(v, 2)
        w = torch.matmul(q, k.transpose(2, 3)) * 0.25
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v).transpose(1, 2)


def test_eager_grouped_query_attention_fuses():
    from einsummable.frontend.refine import refine_modes
    m = _EagerGQA()
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    g, plain = trace(m, (q, k, v)), trace(m, (q, k, v), fuse=False)
    assert [op.fused for op in g.ops] == ["attention", None], g.summary()  # and the transpose
    ins = bind(g, m, (q, k, v))
    _same(plain, g, ins)
    _same(plain, refine_modes(plain), ins)  # the refined graph computes the same
    assert any(len(op.modes) > len(p.modes) for op, p in zip(refine_modes(plain).ops, plain.ops))
    with torch.no_grad():
        assert max_rel_err(evaluate(g, ins)[g.outputs[0]], m(q, k, v)) <= TOL
