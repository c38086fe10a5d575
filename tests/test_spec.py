"""Join-agg specs: decomposition enumeration and tuple geometry against the reference."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import einsummable as es
from einsummable.frontend.reference import evaluate
from helpers import WORLD_SIZES, evaluate_by_tuples
from einsummable.frontend.scalar import arg, call
from einsummable.core.geometry import block_bounds
from einsummable.planning.spec import decompositions, n_partials, output_blocks, tuples

def _check_all_decompositions(graph, inputs, ns=WORLD_SIZES):
    env = evaluate(graph, inputs, keep_all=True)
    checked = 0
    for op in graph.ops:
        blocks = [env[n] for n in op.inputs]
        for n in ns:
            for dec in decompositions(op, n):
                got = evaluate_by_tuples(op, dec, blocks)
                want = env[op.output]
                assert torch.allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True), \
                    f"{op.describe()} under {dec}"
                checked += 1
    return checked


@given(st.integers(1, 40), st.integers(1, 12))
def test_block_bounds_cover_evenly(size, parts):
    if parts > size:
        with pytest.raises(ValueError):
            block_bounds(size, parts)
        return
    b = block_bounds(size, parts)
    assert b[0][0] == 0 and b[-1][1] == size
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(b, b[1:]))
    lengths = [hi - lo for lo, hi in b]
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("j", [0, 1, 2, 3])
def test_count_matches_closed_form(k, j):
    """k modes, n = 2^j, all sizes >= n: C(j+k-1, k-1) exact decompositions."""
    n = 2 ** j
    letters = "abcd"[:k]
    b = es.Builder()
    x = b.input("x", (8,) * k)
    g = b.build([x.exp()])
    op = g.ops[0]
    assert op.modes == tuple(letters)  # k modes, named a.. by the builder
    exact = decompositions(op, n, replication=False)
    assert len(exact) == math.comb(j + k - 1, k - 1)
    # exact: the parts of every mode multiply to n (each of the n devices gets one tuple)
    assert all(math.prod(d.part[m] for m in letters) == n for d in exact)
    with_rep = decompositions(op, n)
    assert len(with_rep) == sum(math.comb(i + k - 1, k - 1) for i in range(j + 1))
    assert len({d.parts for d in with_rep}) == len(with_rep)
    assert all(n % math.prod(d.part[m] for m in letters) == 0 for d in with_rep)


def test_matmul_decompositions_include_every_split():
    b = es.Builder()
    x, w = b.input("x", (8, 8)), b.weight("w", (8, 8))
    op = b.build([b.einsum("ij,jk->ik", x, w)]).ops[0]
    parts = {tuple(p for _, p in d.parts) for d in decompositions(op, 8, replication=False)}
    assert (2, 2, 2) in parts and (8, 1, 1) in parts and (1, 1, 8) in parts
    d = next(d for d in decompositions(op, 8) if tuple(p for _, p in d.parts) == (2, 2, 2))
    assert n_partials(op, d) == 2 and len(output_blocks(op, d)) == 4
    assert len(tuples(op, d)) == 8


def test_parts_never_exceed_sizes_and_respect_fused_modes():
    b = es.Builder()
    q = b.input("q", (2, 3, 5, 4))
    op = b.build([b.attention(q, q, q, fused=True)]).ops[0]
    for d in decompositions(op, 8):
        part = d.part
        assert all(part[m] <= op.size[m] for m in op.modes)
        assert all(part[m] == 1 for m in op.modes if m not in "bhq")


def test_grouped_dims_stay_contiguous():
    b = es.Builder()
    x = b.input("x", (2, 12))
    op = b.build([x.reshape(2, 3, 4)]).ops[0]
    for d in decompositions(op, 4):
        part = d.part
        modes = op.in_dims[0][1]
        assert not (part[modes[0]] < op.size[modes[0]] and part[modes[1]] > 1)


def _ops_graph(shape_b, shape_s, shape_d, shape_f, shape_h):
    B, S, D, F, H = shape_b, shape_s, shape_d, shape_f, shape_h
    b = es.Builder()
    x = b.input("x", (B, S, D))
    w = b.weight("w", (D, F))
    bias = b.weight("bias", (F,))
    y = b.einsum("bsd,df->bsf", x, w)                 # matmul
    y2 = b.einsum("bsf,btf->bst", y, y)               # batched matmul
    z = y + bias                                       # broadcast elementwise
    m = z.amax(-1)                                     # max reduction
    s = z.sum((0, 1), keepdim=True)                    # sum reduction
    sm = b.softmax(y2, -1)                             # softmax chain
    q = b.input("q", (B, H, S, D))
    kv = b.input("kv", (B, 1, S, D))
    att = b.attention(q, kv, kv, causal=True)          # attention chain, grouped heads
    fa = b.attention(q, q, q, causal=True, fused=True)  # fused attention
    ln = b.layer_norm(z, bias, bias)
    return b.build([m, s, sm, att, fa, ln, z.gelu(), (z * 0.5).silu()])


@pytest.mark.parametrize("shape", [(2, 4, 8, 6, 2), (3, 5, 7, 3, 3), (1, 6, 5, 9, 2)])
def test_every_decomposition_equals_reference(shape):
    g = _ops_graph(*shape)
    torch.manual_seed(0)
    inputs = {t.name: torch.randn(t.shape) for t in g.inputs}
    assert _check_all_decompositions(g, inputs) > 500


@st.composite
def random_op_graph(draw):
    """One random join-agg op: random modes, operands, join expression and aggregation."""
    n_modes = draw(st.integers(1, 4))
    modes = "abcd"[:n_modes]
    sizes = {m: draw(st.integers(1, 7)) for m in modes}
    n_in = draw(st.integers(1, 3))
    operands = [draw(st.lists(st.sampled_from(modes), min_size=1, max_size=n_modes, unique=True))
                for _ in range(n_in)]
    used = sorted({m for o in operands for m in o})
    out = draw(st.lists(st.sampled_from(used), max_size=len(used), unique=True))
    agg = draw(st.sampled_from(["sum", "max", "min"])) if len(out) < len(used) else None
    unary = draw(st.sampled_from(["exp", "tanh", "silu", "sigmoid", "neg", "abs"]))
    binary = draw(st.sampled_from(["add", "mul", "sub", "max"]))
    join = call(unary, arg(0))
    for i in range(1, n_in):
        join = call(binary, join, arg(i))
    b = es.Builder()
    xs = [b.input(f"x{i}", tuple(sizes[m] for m in o)) for i, o in enumerate(operands)]
    spec = ",".join("".join(o) for o in operands) + "->" + "".join(out)
    y = b.joinagg(spec, join, agg, *xs)
    return b.build([y])


@settings(max_examples=60)
@given(random_op_graph(), st.sampled_from(WORLD_SIZES), st.integers(0, 2 ** 16))
def test_random_ops_every_decomposition(graph, n, seed):
    torch.manual_seed(seed)
    inputs = {t.name: torch.randn(t.shape) for t in graph.inputs}
    _check_all_decompositions(graph, inputs, ns=(n,))
