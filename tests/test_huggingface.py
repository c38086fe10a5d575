"""transformers models built from a model type's config (`einsummable.models.huggingface`):
the layer wrapper computes the mask and the rotary tables as the model's own forward does, so a
layer run alone equals the same layer inside the model; bad types and fields are named."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

from einsummable.errors import EinsummableError
from einsummable.models import hf, hf_config
from einsummable.models.huggingface import DecoderLayer, _layers, parse_overrides

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 128,
        "pad_token_id": None}


@pytest.mark.parametrize("model_type,extra", [
    ("llama", {}), ("mistral", {"sliding_window": 4}), ("qwen2", {}),
    ("gemma", {"head_dim": 16}), ("phi3", {})])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_layer_equals_the_layer_inside_the_model(model_type, extra, attn):
    """norm(DecoderLayer(x)) == the one-layer base model on the same embeddings: mask (a
    sliding window of 4 at 12 tokens for Mistral, so it matters) and rotary as the model
    computes them."""
    config = hf_config(model_type, {**TINY, **extra})
    config._attn_implementation = attn
    config.use_cache = False
    torch.manual_seed(0)
    base = tf.AutoModel.from_config(config).eval()
    layer = DecoderLayer(config, _layers(base, 1)[0], base.rotary_emb, causal=True).eval()
    x = torch.randn(2, 12, 64)
    with torch.no_grad():
        want = base(inputs_embeds=x).last_hidden_state
        got = base.norm(layer(x))
    assert torch.allclose(got, want, atol=1e-6), float((got - want).abs().max())


def test_a_sliding_window_changes_the_answer():
    """The check above can fail: the same layer with a plain causal mask differs."""
    config = hf_config("mistral", {**TINY, "sliding_window": 4})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    base = tf.AutoModel.from_config(config).eval()
    plain = hf_config("mistral", TINY)  # no window: plain causal mask
    plain._attn_implementation = "sdpa"
    x = torch.randn(2, 12, 64)
    with torch.no_grad():
        windowed = DecoderLayer(config, base.layers[0], base.rotary_emb, causal=True)(x)
        causal = DecoderLayer(plain, base.layers[0], base.rotary_emb, causal=True)(x)
    assert (windowed - causal).abs().max() > 1e-3


def test_defaults_are_the_model_types_and_build_on_meta():
    module, (x,) = hf("llama", batch=2, seq=16)
    assert x.shape == (2, 16, 4096) and x.dtype == torch.float16
    params = list(module.parameters())
    assert all(p.is_meta for p in params)
    # one LLaMA-7B layer: 4 x 4096^2 attention + 3 x 4096 x 11008 FFN + 2 norms
    assert sum(p.numel() for p in params) == 4 * 4096 ** 2 + 3 * 4096 * 11008 + 2 * 4096


def test_whole_model_returns_logits():
    module, (ids,) = hf("llama", part="model", batch=2, seq=8, dtype=torch.float32,
                        device="cpu", overrides={**TINY, "num_hidden_layers": 2})
    assert ids.dtype == torch.int64 and ids.shape == (2, 8)
    with torch.no_grad():
        assert module(ids).shape == (2, 8, 128)


def test_bad_input_is_named():
    with pytest.raises(EinsummableError, match="(?s)no model type .lama..*llama"):
        hf_config("lama")
    with pytest.raises(EinsummableError, match="(?s)no field .hiden_size..*hidden_size"):
        hf_config("llama", {"hiden_size": 64})
    with pytest.raises(EinsummableError, match="part must be"):
        hf("llama", part="block")
    with pytest.raises(EinsummableError, match="not key=value"):
        parse_overrides(["num_hidden_layers"])
    assert parse_overrides(["a=2", "b=true", "c=1e-5", "d=silu", "e=[1,2]"]) == \
        {"a": 2, "b": True, "c": 1e-5, "d": "silu", "e": [1, 2]}


def test_plan_command_plans_a_transformers_layer(capsys):
    """`einsummable plan --hf TYPE --hf-set ...`: built, captured (rotary and mask computed in
    forward) and planned; the attention and the norms fused."""
    import json

    from einsummable.cli import main as cli
    sets = ["hidden_size=64", "intermediate_size=128", "num_attention_heads=4",
            "num_key_value_heads=2", "vocab_size=128", "pad_token_id=null"]
    args = ["plan", "--hf", "qwen2", "--topology", "cpu4", "--batch", "2", "--seq", "16",
            "--dtype", "float32", "--mip-only", "--no-cache", "--json"]
    for s in sets:
        args += ["--hf-set", s]
    assert cli(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective_s"] > 0 and out["gap"] == 0.0
    choice = out["choice"]
    assert "attention" in choice and sum(k.startswith("input:") for k in choice) >= 7
