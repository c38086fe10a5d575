"""Kernels specialised on a known constant operand equal the generic kernel, and decline what
they do not cover."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from einsummable.frontend.constant_kernels import selection_kernel
from einsummable.frontend.ir import make_op
from einsummable.frontend.reference import evaluate_op, op_runner
from einsummable.frontend.scalar import arg


def _op(eq: str, sizes: dict[str, int]):
    ins = eq.split("->")[0].split(",")
    names = [f"t{i}" for i in range(len(ins))]
    shapes = {}
    for name, spec in zip(names, ins):
        dims, i = [], 0
        while i < len(spec):  # "(ac)b": a group is one dim of the product of its sizes
            if spec[i] == "(":
                j = spec.index(")", i)
                size = 1
                for m in spec[i + 1:j]:
                    size *= sizes[m]
                dims.append(size)
                i = j + 1
            else:
                dims.append(sizes[spec[i]])
                i += 1
        shapes[name] = tuple(dims)
    return make_op("op", eq, names, "out", shapes, join=arg(0) * arg(1), agg="sum",
                   out_sizes=sizes)


def _selector(rows: int, cols: int, picks: list[int], coefs: list[float]) -> torch.Tensor:
    k = torch.zeros(rows, cols)
    for f, (j, c) in enumerate(zip(picks, coefs)):
        k[j % rows, f] = c
    return k


@settings(max_examples=60, deadline=None, database=None)
@given(b=st.integers(1, 3), s=st.integers(1, 5), h=st.integers(1, 3), half=st.integers(1, 4),
       picks=st.lists(st.integers(0, 1), min_size=2, max_size=2),
       coefs=st.lists(st.sampled_from([1.0, -1.0, 0.5, -2.0]), min_size=2, max_size=2))
def test_rotate_half_form_equals_the_generic_contraction(b, s, h, half, picks, coefs):
    # ab(cde),df->abc(fe): capture's rotate-half against any selector with one entry a column
    op = _op("ab(cde),df->abc(fe)", {"a": b, "b": s, "c": h, "d": 2, "e": half, "f": 2})
    x = torch.randn(b, s, h * 2 * half)
    k = _selector(2, 2, picks, coefs)
    got = op_runner(op, known={1: k})([x, k])
    assert torch.equal(got, evaluate_op(op, [x, k]))
    assert selection_kernel(op, dict(op.size), 1, k) is not None
    # a selector that moves or scales a column copies: x is left as it was
    before = x.clone()
    op_runner(op, known={1: k})([x, k])
    assert torch.equal(x, before)


@settings(max_examples=40, deadline=None, database=None)
@given(chunks=st.integers(1, 6), rows=st.integers(1, 5), width=st.integers(1, 4),
       pick=st.integers(0, 5))
def test_one_hot_slice_form_equals_the_generic_contraction(chunks, rows, width, pick):
    # (ac)b,ad->cb: a slice of the rotary table by a one-hot selector over chunks
    op = _op("(ac)b,ad->cb", {"a": chunks, "c": rows, "b": width, "d": 1})
    table = torch.randn(chunks * rows, width)
    sel = torch.zeros(chunks, 1)
    sel[pick % chunks, 0] = 1.0
    got = op_runner(op, known={1: sel})([table, sel])
    assert torch.equal(got, evaluate_op(op, [table, sel]))
    assert torch.equal(got, table[(pick % chunks) * rows:(pick % chunks + 1) * rows])
    # consecutive rows, unscaled: a view of the table, nothing copied
    assert got.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()


def test_declines_what_is_not_a_selection():
    op = _op("ab(cde),df->abc(fe)", {"a": 2, "b": 3, "c": 2, "d": 2, "e": 4, "f": 2})
    dense = torch.tensor([[1.0, 2.0], [3.0, 4.0]])   # two entries in a column
    empty = torch.tensor([[0.0, 1.0], [0.0, 0.0]])   # a column of zeros
    for k in (dense, empty):
        assert selection_kernel(op, dict(op.size), 1, k) is None
        x = torch.randn(2, 3, 16)
        assert torch.allclose(op_runner(op, known={1: k})([x, k]), evaluate_op(op, [x, k]))
    # a batch mode shared by both operands is not a selection either
    batched = _op("abc,acd->abd", {"a": 2, "b": 3, "c": 2, "d": 2})
    assert selection_kernel(batched, dict(batched.size), 1, torch.eye(2).expand(2, 2, 2)) is None
