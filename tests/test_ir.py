"""The IR: einsum parsing, op validation, errors that name the op and the fix, JSON."""

import pytest
import torch

import einsummable as es
from einsummable.frontend.ir import Graph
from einsummable.frontend.einsum import parse_einsum
from einsummable.frontend.scalar import Expr, arg, call, const, evaluate as eval_expr


def test_parse_plain_and_grouped():
    ins, out = parse_einsum("bsd,df->bsf")
    assert ins == ((("b",), ("s",), ("d",)), (("d",), ("f",)))
    assert out == (("b",), ("s",), ("f",))
    ins, out = parse_einsum("bs(he)->bshe")
    assert ins[0][2] == ("h", "e")


@pytest.mark.parametrize("spec,bad", [
    ("bsd,df-bsf", "->"),
    ("bs1,df->bsf", "'1'"),
    ("bsd,,df->bsf", "empty operand"),
    ("bsd,df->bsz", "'z'"),
    ("bsb,df->bsf", "repeats"),
    ("bs(he->bshe", "unclosed"),
    ("ij->ij->ij", "->"),
])
def test_malformed_einsum_points_at_the_character(spec, bad):
    with pytest.raises(es.EinsumParseError) as e:
        parse_einsum(spec)
    msg = str(e.value)
    assert bad in msg
    assert "^" in msg  # a caret under the offending character


def test_caret_position():
    with pytest.raises(es.EinsumParseError) as e:
        parse_einsum("ab,b#->a")
    lines = str(e.value).splitlines()
    text_line = next(l for l in lines if "ab,b#->a" in l)
    caret_line = lines[lines.index(text_line) + 1]
    assert text_line.index("#") == caret_line.index("^")


def test_builder_einsum_error_names_op_and_source():
    b = es.Builder()
    x = b.input("x", (2, 3))
    with pytest.raises(es.EinsumParseError) as e:
        b.einsum("ij,jk>ik", x, x, name="proj")
    assert "proj" in str(e.value) and "test_ir.py" in str(e.value)


def test_mode_sizes_disagree():
    b = es.Builder()
    x, w = b.input("x", (2, 3)), b.weight("w", (4, 5))
    with pytest.raises(es.ShapeError) as e:
        b.einsum("ij,jk->ik", x, w, name="mm")
    msg = str(e.value)
    assert "mm" in msg and "disagree" in msg and "fix" in msg


def test_unknown_join_function_and_aggregation():
    with pytest.raises(es.UnknownFunctionError) as e:
        call("softplus", arg(0))
    assert "softplus" in str(e.value) and "silu" in str(e.value)
    b = es.Builder()
    x = b.input("x", (2, 3))
    with pytest.raises(es.UnknownFunctionError):
        b.joinagg("ij->i", arg(0), "mean", x)


def test_wrong_dtype():
    b = es.Builder()
    with pytest.raises(es.DTypeError) as e:
        b.input("x", (2,), dtype="int7")
    assert "float16" in str(e.value)
    with pytest.raises(es.DTypeError):
        es.Builder(dtype="fp8")


def test_missing_aggregation_is_refused():
    b = es.Builder()
    x = b.input("x", (2, 3))
    with pytest.raises(es.ShapeError) as e:
        b.joinagg("ij->i", arg(0), None, x, name="rowsum")
    assert "rowsum" in str(e.value) and "aggregation" in str(e.value)


def test_reshape_errors():
    b = es.Builder()
    x = b.input("x", (6, 4))
    with pytest.raises(es.ShapeError):
        x.reshape(5, 5)
    with pytest.raises(es.ShapeError) as e:
        x.reshape(4, 6)
    assert "two steps" in str(e.value)


def test_matmul_flops_and_bytes():
    b = es.Builder()
    x, w = b.input("x", (8, 16)), b.weight("w", (16, 32))
    y = b.einsum("ij,jk->ik", x, w)
    g = b.build([y])
    assert g.flops == 2 * 8 * 16 * 32
    assert g.bytes == 4 * (8 * 16 + 16 * 32 + 8 * 32)
    assert [t.name for t in g.weights] == ["w"]


def test_views_cost_nothing():
    b = es.Builder()
    x = b.input("x", (2, 12))
    y = x.reshape(2, 3, 4).permute(2, 0, 1)
    g = b.build([y])
    assert all(op.is_view for op in g.ops) and g.flops == 0


def test_graph_json_round_trip():
    b = es.Builder()
    x, w = b.input("x", (2, 5, 8)), b.weight("w", (8,))
    y = b.softmax(b.rms_norm(x, w), -1).reshape(2, 5, 2, 4)
    g = b.build([y])
    g2 = Graph.from_json(g.to_json())
    assert g2 == g and g2.to_json() == g.to_json()


def test_expr_json_and_print():
    e = call("silu", arg(0)) * arg(1) + const(2.0) ** 3
    assert Expr.from_json(e.to_json()) == e
    assert "silu(x0)" in str(e)
    t = torch.randn(4)
    assert torch.allclose(eval_expr(e, [t, t]), torch.nn.functional.silu(t) * t + 8.0)


def test_every_join_function_evaluates():
    from einsummable.frontend.scalar import FUNCTIONS
    t = torch.rand(5) + 0.5
    for name, (arity, fn) in FUNCTIONS.items():
        e = Expr(name, tuple(arg(i) for i in range(arity)), 2.0 if name == "pow" else None)
        out = eval_expr(e, [t] * max(arity, 1))
        want = fn(t, 2.0) if name == "pow" else fn(*([t] * arity))
        assert torch.allclose(out, want), name


def test_evaluate_checks_inputs():
    b = es.Builder()
    x = b.input("x", (2, 3))
    g = b.build([x.exp()])
    with pytest.raises(es.ShapeError) as e:
        es.evaluate(g, {"x": torch.zeros(3, 2)})
    assert "(3, 2)" in str(e.value)
    with pytest.raises(es.ShapeError):
        es.evaluate(g, {})
