"""Builder composites against the PyTorch functions they stand for."""

import pytest
import torch
import torch.nn.functional as F

import einsummable as es


def _run(b, outs, inputs):
    g = b.build(outs)
    res = es.evaluate(g, inputs)
    return [res[o.name] for o in outs]


def test_softmax_layer_norm_rms_norm():
    torch.manual_seed(0)
    X, W, B = torch.randn(3, 5, 7), torch.randn(7), torch.randn(7)
    b = es.Builder()
    x, w, bias = b.input("x", X.shape), b.weight("w", W.shape), b.weight("b", B.shape)
    outs = [b.softmax(x, 1), b.layer_norm(x, w, bias, 1e-5), b.rms_norm(x, w, 1e-6),
            x.mean((0, 2), keepdim=True), x.amin(1), (x ** 2.0).sum(-1)]
    got = _run(b, outs, {"x": X, "w": W, "b": B})
    want = [torch.softmax(X, 1), F.layer_norm(X, (7,), W, B, 1e-5),
            X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + 1e-6) * W,
            X.mean((0, 2), keepdim=True), X.amin(1), (X ** 2).sum(-1)]
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-6)


def test_broadcasting_and_scalars():
    X, Y = torch.randn(4, 1, 3), torch.randn(5, 1)
    b = es.Builder()
    x, y = b.input("x", X.shape), b.input("y", Y.shape)
    (z,) = _run(b, [(2.0 - x) * y / 3.0 + x.gelu("tanh") - y.sigmoid()], {"x": X, "y": Y})
    torch.testing.assert_close(z, (2.0 - X) * Y / 3.0 + F.gelu(X, approximate="tanh")
                               - torch.sigmoid(Y))


def _rotate_half(t):
    h = t.shape[-1] // 2
    return torch.cat([-t[..., h:], t[..., :h]], -1)


@pytest.mark.parametrize("kv_heads,fused", [(4, False), (2, False), (1, False), (4, True)])
def test_attention_with_rotary_and_gqa(kv_heads, fused):
    torch.manual_seed(1)
    B, H, S, E = 2, 4, 6, 8
    Q, K, V = torch.randn(B, H, S, E), torch.randn(B, kv_heads, S, E), torch.randn(B, kv_heads, S, E)
    C, Sn = torch.randn(S, E), torch.randn(S, E)
    b = es.Builder()
    q, k, v = b.input("q", Q.shape), b.input("k", K.shape), b.input("v", V.shape)
    cos, sin = b.input("cos", C.shape), b.input("sin", Sn.shape)
    out = b.attention(b.rotary(q, cos, sin), b.rotary(k, cos, sin), v, causal=True, fused=fused)
    (got,) = _run(b, [out], {"q": Q, "k": K, "v": V, "cos": C, "sin": Sn})
    rq, rk = Q * C + _rotate_half(Q) * Sn, K * C + _rotate_half(K) * Sn
    rep = H // kv_heads
    want = F.scaled_dot_product_attention(rq, rk.repeat_interleave(rep, 1),
                                          V.repeat_interleave(rep, 1), is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reshape_split_merge_and_size_one_dims():
    X = torch.randn(2, 12, 1)
    b = es.Builder()
    x = b.input("x", X.shape)
    outs = [x.reshape(2, 3, 4), x.reshape(24), x.reshape(1, 2, 12), x.reshape(2, 3, 4, 1).permute(3, 2, 0, 1)]
    got = _run(b, outs, {"x": X})
    want = [X.reshape(2, 3, 4), X.reshape(24), X.reshape(1, 2, 12), X.reshape(2, 3, 4, 1).permute(3, 2, 0, 1)]
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)


def test_source_lines_are_recorded():
    b = es.Builder()
    x = b.input("x", (2, 2))
    g = b.build([x.exp()])
    assert g.ops[0].source.endswith(f"test_builder.py:{test_source_lines_are_recorded.__code__.co_firstlineno + 3}")
