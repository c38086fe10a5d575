"""Capture of what popular model code writes: rotary tables computed in forward, lookups
(gather, index_select, tensor indexing), integer buffers beside floats, empty slices, masks
built in forward, transformers models with their KV cache. Each capture is checked against the
module itself through the reference evaluator (float32, relative error <= 1e-5)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from einsummable.errors import UnsupportedOpError
from einsummable.frontend.capture import trace

from helpers import Fn, LlamaLayerWithRotary, capture_check as check, rand as r


class Rotary(nn.Module):
    """LLaMA's rotary table as transformers computes it, in forward from an inv_freq buffer."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim),
                             persistent=False)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0).expand(x.shape[0], -1)
        freqs = pos[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return x * emb.cos().to(x.dtype) + x * emb.sin()


def test_rotary_table_in_forward_device_casts_cos_sin():
    check(Rotary(), r(2, 6, 8))


def test_rotary_table_on_the_meta_device_captures_as_cheap_ops():
    with torch.device("meta"):
        m = Rotary()
    g = trace(m, (torch.empty(2, 6, 8, device="meta"),))
    assert "inv_freq" in {t.name for t in g.weights}
    assert len(g.ops) <= 3, g.summary()


def test_gather_index_select_and_indexing():
    idx = torch.randint(0, 5, (2, 3), generator=torch.Generator().manual_seed(0))
    check(Fn(lambda m, x, i: torch.gather(x, 1, i)), r(2, 5), idx)
    check(Fn(lambda m, x, i: torch.gather(x, 0, i)), r(5, 3), idx % 5)
    # a source that does not vary off the gathered dim is one lookup, no flattening
    g = check(Fn(lambda m, x, i: torch.gather(x.expand(2, 5), 1, i)), r(1, 5), idx)
    assert [op.fused for op in g.ops].count("embedding") == 1
    check(Fn(lambda m, x, i: torch.index_select(x, 1, i)), r(2, 5, 3), idx[0])
    check(Fn(lambda m, x, i: x[:, i]), r(2, 5, 3), idx)
    check(Fn(lambda m, x, i: x[i]), r(5, 3), idx)
    check(Fn(lambda m, x: x[:, torch.arange(3)]), r(2, 5, 3))


def test_integer_buffer_slice_feeds_a_lookup():
    # BERT's position ids: a prefix of an int64 buffer, read through a 0/1 selection of the
    # buffer's own dtype (a float selection used to fail in the reference: Long vs Float)
    class Pos(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ids", torch.arange(12).unsqueeze(0))
            self.emb = nn.Embedding(12, 4)

        def forward(self, x):
            return x + self.emb(self.ids[:, : x.shape[1]])
    check(Pos(), r(2, 5, 4))


def test_empty_slice_is_dropped_by_cat():
    # Phi-3's partial rotary when it covers the whole head: q[..., rot:] is empty
    check(Fn(lambda m, x: torch.cat((x[..., :8] * 2.0, x[..., 8:]), dim=-1)), r(2, 3, 8))


class _Scaled(nn.Module):
    """Gemma's embedding scale: a 0-d buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(8.0), persistent=False)

    def forward(self, x):
        return x * self.scale


def test_scalar_buffer_is_a_number_and_on_meta_a_one_element_weight():
    g = check(_Scaled(), r(2, 3))
    assert not g.weights
    with torch.device("meta"):
        m = _Scaled()
    g = trace(m, (torch.empty(2, 3, device="meta"),))
    assert [(t.name, t.shape) for t in g.weights] == [("scale", (1,))]


def test_cat_of_a_tensor_with_itself_is_a_view():
    # rotary's cat((freqs, freqs)): a broadcast view read by the cos and sin maps, no op
    g = check(Fn(lambda m, x: (lambda f: torch.cat((f, f), dim=-1).cos())(x * 2.0)), r(2, 3, 4))
    assert len(g.ops) == 2, g.summary()  # f, then cos reading f twice over
    check(Fn(lambda m, x: (lambda f: torch.cat((f, f, f), dim=1).sin())(x * 2.0)), r(2, 3, 4))


# ---------------------------------------------------------------- transformers models

def _transformers():
    return pytest.importorskip("transformers")



def test_7b_transformers_layer_plans_like_the_preset():
    # The bar: a 7B-size LlamaDecoderLayer with its rotary in forward, built on the meta
    # device, plans on a100x8 within 1% of the llama-7b preset's objective, with attention and
    # RMSNorm fused the same way (batch 4, seq 2048, fp16, weights sharded, steady state).
    from einsummable.models import preset
    from einsummable.optimizer.api import optimize
    t = _transformers()
    config = t.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                           num_key_value_heads=32, num_hidden_layers=1, rms_norm_eps=1e-6,
                           max_position_embeddings=2048)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        layer = LlamaLayerWithRotary(config).to(torch.float16).eval()
    x = torch.empty(4, 2048, 4096, device="meta", dtype=torch.float16)
    ours = trace(layer, (x,))
    module, args = preset("llama-7b", batch=4, seq=2048, device="meta", dtype=torch.float16)
    theirs = trace(module, args)
    fused = lambda g: sorted(op.fused for op in g.ops if op.fused)  # noqa: E731
    assert fused(ours) == fused(theirs) == ["attention", "rms_norm", "rms_norm"]
    objective = [optimize(g, "a100x8", weights="sharded", steady_state=True, cache=False)
                 .objective_s for g in (ours, theirs)]
    assert objective[0] <= 1.01 * objective[1], objective


# ---------------------------------------------------------------- masks built in forward

_NEG, _MIN = float("-inf"), torch.finfo(torch.float32).min
MASKS = {  # (q, k) additive masks, spelled as models spell them
    "full-triu": lambda s: torch.full((s, s), _NEG).triu(1),
    "bool-triu-fill": lambda s: torch.zeros(s, s).masked_fill(
        torch.ones(s, s, dtype=torch.bool).triu(1), _NEG),
    "arange-compare": lambda s: torch.where(torch.arange(s)[None, :] > torch.arange(s)[:, None],
                                            _NEG, 0.0),
    "tril-ones-min": lambda s: (1 - torch.tril(torch.ones(s, s))) * _MIN,
    "sliding-window": lambda s: torch.where(
        (torch.arange(s)[:, None] - torch.arange(s)[None, :] >= 0)
        & (torch.arange(s)[:, None] - torch.arange(s)[None, :] < 5), 0.0, _MIN),
}


def _masked_attention(mask):
    return Fn(lambda m, q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.25
                                               + mask(q.shape[-2]), -1) @ v)


@pytest.mark.parametrize("name", list(MASKS))
def test_masks_built_in_forward_are_structure_at_any_size(name):
    q = r(2, 2, 12, 8)
    g = check(_masked_attention(MASKS[name]), q, q * 0.5, q + 1.0)
    assert [op.fused for op in g.ops] == ["attention"], g.summary()
    # at 4096 (16M elements: too many to compute, let alone embed) the same structure
    big = torch.zeros(1, 1, 4096, 8)
    g = trace(_masked_attention(MASKS[name]), (big, big, big))
    assert [op.fused for op in g.ops] == ["attention"], g.summary()
    assert all(c.kind in ("causal_mask", "diagonal") for _, c in g.constants), g.constants
    assert all(len(c.values) <= 8 for _, c in g.constants)


def test_diagonal_constant_blocks_equal_the_whole():
    from einsummable.frontend.ir import Constant, TensorInfo
    from einsummable.frontend.reference import materialize
    c = Constant("diagonal", (-6.0, _MIN, 0.0, 0.0, 3.0, _MIN))  # window of 3 behind
    info = TensorInfo("m", (7, 7), "float32", "constant")
    whole = materialize(c, info)
    d = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    assert torch.equal(whole, torch.where((d >= 0) & (d < 3), 0.0, _MIN))
    assert torch.equal(materialize(c, info, ((2, 5), (1, 7))), whole[2:5, 1:7])


@pytest.mark.parametrize("model", ["LlamaModel", "MistralModel"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_transformers_masks_at_4096_capture_as_structure(model, impl):
    # transformers builds its causal and sliding-window masks from index comparisons in
    # forward; on the meta device at seq 4096 they are diagonals, never literals
    t = _transformers()
    config = getattr(t, model.replace("Model", "Config"))(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64, max_position_embeddings=4096,
        **({"sliding_window": 512} if model == "MistralModel" else {}))
    config._attn_implementation = impl
    with torch.device("meta"):
        m = getattr(t, model)(config).eval()
    g = trace(m, (torch.zeros(1, 4096, dtype=torch.long, device="meta"),))
    masks = [c for _, c in g.constants if c.kind in ("causal_mask", "diagonal")]
    assert all(len(c.values) <= 4096 for _, c in g.constants)  # positions at most, no Q x K
    if impl == "sdpa":
        (attention,) = [op for op in g.ops if op.fused == "attention"]
        assert dict(attention.params)["causal"] == (model == "LlamaModel")
    if model == "MistralModel":
        assert [c.kind for c in masks] == ["diagonal"] and len(masks[0].values) == 6


def _padding(batch: int, seq: int) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq - 5:] = 0  # the last sequence is 5 tokens shorter
    return mask


@pytest.mark.parametrize("model", ["LlamaModel", "BertModel"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_attention_mask_input(model, impl):
    # transformers indexes the padding mask with aranges (a view of the input), joins it with
    # the causal diagonals (and: a product of 0/1 numbers), and adds it as 0 / -inf (log of
    # the mask) or where(mask, 0, min)
    t = _transformers()
    if model == "LlamaModel":
        config = t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                               max_position_embeddings=64)
    else:
        config = t.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64, vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = impl
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    g = check(getattr(t, model)(config), ids, kwargs={"attention_mask": _padding(2, 12)})
    assert [op.fused for op in g.ops].count("attention") == 1, g.summary()


def test_boolean_logic_and_casts_on_masks_that_depend_on_inputs():
    ids = torch.tensor([[3, 0, 2, 0], [1, 1, 0, 5]])
    x = r(2, 4)
    check(Fn(lambda m, x, i: torch.where(i.bool() & ~(torch.arange(4) == 3), x, 0.0)), x, ids)
    check(Fn(lambda m, x, i: torch.where(i.bool().logical_not(), float("-inf"), x).exp()), x, ids)
    check(Fn(lambda m, x, i: torch.where(i.bool() | (torch.arange(4) < 2), x, -1.0)), x, ids)
    check(Fn(lambda m, x, i: x.masked_fill(i.bool(), -2.0)), x, ids)
    with pytest.raises(UnsupportedOpError, match="cast to bool"):
        trace(Fn(lambda m, x: torch.where(x.bool(), x, 0.0)), (x,))


def _tiny_llama_config(t, **extra):
    return t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                         max_position_embeddings=64, **extra)


def test_causal_lm_is_captured_without_its_cache_and_the_config_is_kept():
    t = _transformers()
    m = t.LlamaForCausalLM(_tiny_llama_config(t))
    assert m.config.use_cache
    ids = torch.randint(3, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    g = check(m, ids)
    assert g.tensor(g.outputs[0]).shape == (2, 8, 64)  # the logits, and nothing of a cache
    assert m.config.use_cache  # restored after the export


def test_decoder_layer_taking_position_embeddings_as_inputs():
    t = _transformers()
    from transformers.models.llama import modeling_llama as ml
    config = _tiny_llama_config(t)
    layer = ml.LlamaDecoderLayer(config, 0)
    x = r(2, 8, 32)
    cos, sin = ml.LlamaRotaryEmbedding(config)(x, torch.arange(8).unsqueeze(0))
    g = check(layer, x, kwargs={"position_embeddings": (cos, sin), "attention_mask": None})
    assert sorted(op.fused for op in g.ops if op.fused) == ["attention", "rms_norm", "rms_norm"]
