"""The model zoo: presets build and run, meta builds are free, blocks match independent
functional references written here from the papers' formulas."""
from __future__ import annotations

import math

import pytest
import torch

from einsummable.errors import EinsummableError, ShapeError, UnknownFunctionError
from einsummable.models import (MLP, PRESETS, GPT2Config, LlamaBlock, LlamaConfig,
                                LlamaStack, MistralBlock, MistralConfig, TwoLayerMLP,
                                list_presets, llama_ffn_dim, preset, preset_config)

REQUIRED = ["llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama3-8b", "llama-tiny",
            "gpt2-tiny", "mistral-tiny"]


# ---------------------------------------------------------------- independent references (float64)

def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: (b, s, h, d). Pairs (i, i + d/2) rotated by pos * theta^(-2i/d), via complex numbers."""
    d = x.shape[-1]
    pos = torch.arange(x.shape[1], dtype=torch.float64)
    freq = theta ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    rot = torch.polar(torch.ones(len(pos), d // 2, dtype=torch.float64), torch.outer(pos, freq))
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * rot[None, :, None, :]
    return torch.cat((z.real, z.imag), dim=-1)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: (b, s, h, d); k, v: (b, s, h_kv, d). Query head h reads KV head h // (h / h_kv)."""
    n_rep = q.shape[2] // k.shape[2]
    s = q.shape[1]
    allowed = torch.ones(s, s, dtype=torch.bool).tril()
    heads = []
    for h in range(q.shape[2]):
        kv = h // n_rep
        scores = torch.einsum("bid,bjd->bij", q[:, :, h], k[:, :, kv]) / math.sqrt(q.shape[-1])
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        heads.append(torch.einsum("bij,bjd->bid", probs, v[:, :, kv]))
    return torch.stack(heads, dim=2)


def ref_llama(x: torch.Tensor, p: dict[str, torch.Tensor], cfg: LlamaConfig) -> torch.Tensor:
    b, s, _ = x.shape
    lin = lambda t, name: t @ p[name].T  # noqa: E731
    h_in = _rmsnorm(x, p["attention_norm.weight"], cfg.norm_eps)
    q = lin(h_in, "attention.wq.weight").reshape(b, s, cfg.n_heads, cfg.head_dim)
    k = lin(h_in, "attention.wk.weight").reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    v = lin(h_in, "attention.wv.weight").reshape(b, s, cfg.n_kv_heads, cfg.head_dim)
    att = _causal_attention(_rotary(q, cfg.rope_theta), _rotary(k, cfg.rope_theta), v)
    h = x + lin(att.reshape(b, s, -1), "attention.wo.weight")
    f_in = _rmsnorm(h, p["ffn_norm.weight"], cfg.norm_eps)
    a = lin(f_in, "feed_forward.w1.weight")
    ffn = lin(a * torch.sigmoid(a) * lin(f_in, "feed_forward.w3.weight"), "feed_forward.w2.weight")
    return h + ffn


def ref_gpt2(x: torch.Tensor, p: dict[str, torch.Tensor], cfg: GPT2Config) -> torch.Tensor:
    b, s, d = x.shape

    def ln(t: torch.Tensor, name: str) -> torch.Tensor:
        mu = t.mean(-1, keepdim=True)
        var = ((t - mu) ** 2).mean(-1, keepdim=True)
        return (t - mu) / torch.sqrt(var + cfg.norm_eps) * p[name + ".weight"] + p[name + ".bias"]

    lin = lambda t, name: t @ p[name + ".weight"].T + p[name + ".bias"]  # noqa: E731
    qkv = lin(ln(x, "ln_1"), "attn.c_attn")
    q, k, v = (qkv[..., i * d:(i + 1) * d].reshape(b, s, cfg.n_heads, -1) for i in range(3))
    x = x + lin(_causal_attention(q, k, v).reshape(b, s, d), "attn.c_proj")
    u = lin(ln(x, "ln_2"), "mlp.c_fc")
    gelu = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
    return x + lin(gelu, "mlp.c_proj")


MISTRAL_TO_LLAMA = {
    "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
}


def _params64(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v.detach().double() for k, v in module.state_dict().items()
            if k.startswith(prefix)}


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol)


# ---------------------------------------------------------------- presets

def test_list_presets_has_required_names() -> None:
    names = list_presets()
    assert set(REQUIRED) <= set(names)
    assert names == list(PRESETS)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_runs_at_reduced_width(name: str) -> None:
    module, (x,) = preset(name, batch=2, seq=16, width=0.0625)
    cfg = preset_config(name, width=0.0625)
    assert x.shape == (2, 16, cfg.dim)
    with torch.no_grad():
        y = module(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    assert 0.1 < y.std().item() < 10  # activations stay O(1)


def test_published_sizes() -> None:
    expected = {"llama-7b": (32, 11008), "llama-13b": (40, 13824), "llama-30b": (52, 17920),
                "llama-65b": (64, 22016)}
    for name, (heads, ffn) in expected.items():
        c = preset_config(name)
        assert (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.dim) == (heads, heads, 128, ffn, heads * 128)
        assert llama_ffn_dim(c.dim) == ffn  # Meta's 2/3 * 4d rounded to 256
    c = preset_config("llama3-8b")
    assert (c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.rope_theta) == (4096, 32, 8, 14336, 500000.0)
    assert llama_ffn_dim(4096, multiple_of=1024, ffn_dim_multiplier=1.3) == 14336
    c = preset_config("llama2-70b")
    assert (c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim, c.max_seq) == (8192, 64, 8, 28672, 4096)
    assert llama_ffn_dim(8192, multiple_of=4096, ffn_dim_multiplier=1.3) == 28672


def test_width_keeps_structure() -> None:
    c = preset_config("llama3-8b", width=0.0625)
    assert c.head_dim == 128 and c.n_heads == 4 * c.n_kv_heads and c.dim == c.n_heads * 128
    assert c.ffn_dim == 14336 * c.n_heads // 32
    c = preset_config("llama-65b", width=0.0625)
    assert (c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim) == (512, 4, 4, 1376)
    c = preset_config("gpt2-small", width=0.25)
    assert (c.n_heads, c.dim, c.ffn_dim) == (3, 192, 768)
    assert preset_config("llama-tiny", width=1e-6).n_heads == 1  # never below one head
    with pytest.raises(ShapeError):
        preset_config("llama-7b", width=0.0)


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(UnknownFunctionError) as info:
        preset("llama-8b")
    assert "llama-8b" in str(info.value) and "llama3-8b" in str(info.value)
    assert isinstance(info.value, EinsummableError)


def test_meta_build_of_llama65b_allocates_nothing() -> None:
    module, (x,) = preset("llama-65b", batch=4, seq=2048, device="meta")
    tensors = list(module.parameters()) + list(module.buffers()) + [x]
    assert all(t.device.type == "meta" for t in tensors)
    assert {n for n, _ in module.named_buffers()} == {"attention.cos", "attention.sin"}
    n_params = sum(p.numel() for p in module.parameters())
    assert n_params == 4 * 8192 * 8192 + 3 * 8192 * 22016 + 2 * 8192
    y = module(x)  # shape propagation only
    assert y.shape == (4, 2048, 8192) and y.device.type == "meta"


def test_meta_build_in_half_precision() -> None:
    module, (x,) = preset("llama3-8b", batch=1, seq=4096, device="meta", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and p.is_meta for p in module.parameters())
    assert x.dtype == torch.bfloat16 and module(x).shape == x.shape


def test_deterministic_in_seed() -> None:
    m1, (x1,) = preset("llama-tiny", seq=8)
    m2, (x2,) = preset("llama-tiny", seq=8)
    m3, (x3,) = preset("llama-tiny", seq=8, seed=1)
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert not torch.equal(m1.attention.wq.weight, m3.attention.wq.weight)
    norm = m1.attention_norm.weight
    assert not torch.allclose(norm, torch.ones_like(norm))  # norm scales are exercised


def test_bfloat16_forward() -> None:
    module, (x,) = preset("llama-tiny", seq=16, dtype=torch.bfloat16)
    with torch.no_grad():
        y = module(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y.float()).all()


# ---------------------------------------------------------------- numerics against references

@pytest.mark.parametrize("name", ["llama-tiny", "llama3-8b", "llama-7b"])
def test_llama_block_matches_reference(name: str) -> None:
    # llama3-8b at 1/4 width: 2 KV heads serving 4 query heads each, so a wrong head mapping shows.
    width = {"llama-tiny": None, "llama3-8b": 0.25, "llama-7b": 0.0625}[name]
    module, (x,) = preset(name, batch=2, seq=24, width=width)
    cfg = module.config
    if name == "llama3-8b":
        assert (cfg.n_kv_heads, cfg.n_rep) == (2, 4)  # GQA path (repeat_kv: expand + reshape)
    with torch.no_grad():
        y = module(x)
    _close(y, ref_llama(x.double(), _params64(module), cfg))


def test_llama_stack_matches_reference() -> None:
    cfg = LlamaConfig(dim=48, n_heads=6, n_kv_heads=2, ffn_dim=96, max_seq=32)
    stack = LlamaStack(cfg, n_layers=3, seed=5)
    x = torch.randn(2, 20, 48, generator=torch.Generator().manual_seed(0))
    want = x.double()
    for i in range(3):
        want = ref_llama(want, _params64(stack, f"layers.{i}."), cfg)
    assert not torch.equal(stack.layers[0].attention.wq.weight, stack.layers[1].attention.wq.weight)
    with torch.no_grad():
        _close(stack(x), want)


def test_mistral_block_matches_reference() -> None:
    module, (x,) = preset("mistral-tiny", batch=2, seq=24)
    cfg = module.config
    assert cfg.n_rep == 2
    p = {}
    for k, v in _params64(module).items():
        stem, leaf = k.rsplit(".", 1)
        p[f"{MISTRAL_TO_LLAMA[stem]}.{leaf}"] = v
    as_llama = LlamaConfig(dim=cfg.dim, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                           head_dim=cfg.head_dim, ffn_dim=cfg.ffn_dim, norm_eps=cfg.norm_eps,
                           rope_theta=cfg.rope_theta, max_seq=cfg.max_seq)
    with torch.no_grad():
        _close(module(x), ref_llama(x.double(), p, as_llama))


def test_gpt2_block_matches_reference() -> None:
    module, (x,) = preset("gpt2-tiny", batch=2, seq=24)
    with torch.no_grad():
        _close(module(x), ref_gpt2(x.double(), _params64(module), module.config))


def test_llama_and_mistral_spellings_agree() -> None:
    """Same weights, two spellings (repeat_kv vs repeat_interleave, explicit mask vs SDPA)."""
    lc = LlamaConfig(dim=64, n_heads=8, n_kv_heads=2, ffn_dim=80, max_seq=64)
    mc = MistralConfig(dim=64, n_heads=8, n_kv_heads=2, ffn_dim=80, max_seq=64)
    llama, mistral = LlamaBlock(lc, seed=3), MistralBlock(mc, seed=None)
    back = {v: k for k, v in MISTRAL_TO_LLAMA.items()}
    mistral.load_state_dict({f"{back[k.rsplit('.', 1)[0]]}.{k.rsplit('.', 1)[1]}": v
                             for k, v in llama.state_dict().items()})
    x = torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(mistral(x), llama(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- sequence limits, buffers, export

def test_seq_above_max_seq_raises() -> None:
    llama = LlamaBlock(LlamaConfig(dim=32, n_heads=2, max_seq=8))
    llama(torch.randn(1, 8, 32))
    with pytest.raises(ShapeError, match="max_seq"):
        llama(torch.randn(1, 9, 32))
    mistral = MistralBlock(MistralConfig(dim=32, n_heads=2, n_kv_heads=1, ffn_dim=40, max_seq=8))
    with pytest.raises(ShapeError, match="max_seq"):
        mistral(torch.randn(1, 9, 32))


def test_preset_extends_max_seq_for_long_inputs() -> None:
    module, (x,) = preset("llama-tiny", seq=300)
    assert module.config.max_seq == 300 and module.attention.cos.shape == (300, 16)
    assert module(x).shape == (1, 300, 64)


def test_rotary_tables_are_buffers_not_state() -> None:
    module, _ = preset("llama-tiny")
    assert "attention.cos" in dict(module.named_buffers())
    assert "attention.cos" not in module.state_dict()
    assert module.to(torch.float64).attention.cos.dtype == torch.float64


@pytest.mark.parametrize("name", ["llama-tiny", "mistral-tiny", "gpt2-tiny"])
def test_torch_export_captures(name: str) -> None:
    module, args = preset(name, batch=2, seq=16)
    exported = torch.export.export(module, args)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(*args), module(*args))


# ---------------------------------------------------------------- MLPs

def test_mlp() -> None:
    m = MLP([8, 16, 16, 4], act="silu")
    assert [type(l).__name__ for l in m] == ["Linear", "SiLU", "Linear", "SiLU", "Linear"]
    x = torch.randn(5, 8)
    assert m(x).shape == (5, 4)
    assert all(l.bias is None for l in MLP([8, 4], bias=False) if isinstance(l, torch.nn.Linear))
    with pytest.raises(UnknownFunctionError):
        MLP([8, 4, 2], act="swish")
    with pytest.raises(ShapeError):
        MLP([8])


def test_two_layer_mlp() -> None:
    m = TwoLayerMLP(16, 64)
    assert m.w1.bias is None and m.w2.bias is None
    assert m.w1.weight.shape == (64, 16) and m.w2.weight.shape == (16, 64)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    m = m.double()
    want = torch.nn.functional.gelu(x @ m.w1.weight.T) @ m.w2.weight.T
    torch.testing.assert_close(m(x), want)
    assert torch.equal(TwoLayerMLP(16, 64).w1.weight, TwoLayerMLP(16, 64).w1.weight)
