"""Conformance: what transformers users write, captured, planned and run.

Each model family at a tiny config (hidden 64, 2 layers, vocabulary 96, seq 16, batch 2, random
init: nothing is downloaded) is traced, optimized on `cpu4`, lowered, and run on the local
backend and on 4 gloo ranks (one gloo run per model, one pool for the file); every output is
held to the module itself in float32 (relative error <= 1e-5). The LLaMA decoder layer computes
its rotary table in forward, under the sdpa and the eager attention implementations; Mistral's
sliding window is shorter than the sequence, so it masks; Qwen2 has grouped-query heads and
q/k/v biases; BERT runs with and without token-type ids; the causal LM is checked end to end
(embedding, layers, final norm, lm_head: the logits), also with a padding attention_mask;
timm's ViT starts with its patch-embedding convolution (a windowed op).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch
from torch.utils import _pytree as pytree

from einsummable.backend.lowering import lower
from einsummable.backend.runtime.pool import run_dist
from einsummable.backend.runtime.local import run_local
from einsummable.frontend.capture import bind, trace
from einsummable.optimizer.api import optimize

from helpers import LlamaLayerWithRotary, rel_err

transformers = pytest.importorskip("transformers")

TOL = 1e-5
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 64, 2, 4, 2, 128, 96
BATCH, SEQ = 2, 16
SLIDING_WINDOW = 6  # shorter than SEQ: the window masks keys a causal mask alone would keep


def _decoder_config(cls, **extra):
    return cls(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
               max_position_embeddings=4 * SEQ, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, **extra)



def _ids(seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def _llama_layer(impl: str):
    config = _decoder_config(transformers.LlamaConfig)
    config._attn_implementation = impl
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=torch.Generator().manual_seed(1))
    return LlamaLayerWithRotary(config), (x,), {}


def _decoder(model, config, **extra):
    def build():
        return getattr(transformers, model)(_decoder_config(getattr(transformers, config),
                                                            **extra)), (_ids(2),), {}
    return build


def _gpt2():
    config = transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                     vocab_size=VOCAB, n_positions=4 * SEQ, bos_token_id=1,
                                     eos_token_id=2)
    return transformers.GPT2Model(config), (_ids(3),), {}


def _bert(token_types: bool):
    config = transformers.BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FFN,
                                     vocab_size=VOCAB, max_position_embeddings=4 * SEQ)
    kwargs = {}
    if token_types:
        kwargs["token_type_ids"] = torch.randint(0, 2, (BATCH, SEQ),
                                                 generator=torch.Generator().manual_seed(5))
    return transformers.BertModel(config), (_ids(4),), kwargs


def _timm_vit():
    """timm's VisionTransformer: patch-embedding convolution, class token, position
    embedding, pre-norm encoder blocks (fused attention, GELU MLP), head."""
    import timm
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                               patch_size=8, embed_dim=HIDDEN, depth=LAYERS, num_heads=HEADS,
                               num_classes=10)
    images = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    return module, (images,), {}


def _padded(build):
    """The model with an attention_mask input: the last sequence 5 tokens shorter."""
    def padded():
        module, args, kwargs = build()
        mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        mask[-1, SEQ - 5:] = 0
        return module, args, {**kwargs, "attention_mask": mask}
    return padded


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple, dict]]] = {
    "llama-layer-sdpa": lambda: _llama_layer("sdpa"),
    "llama-layer-eager": lambda: _llama_layer("eager"),
    "mistral": _decoder("MistralModel", "MistralConfig", sliding_window=SLIDING_WINDOW),
    "qwen2": _decoder("Qwen2Model", "Qwen2Config"),
    "gemma": _decoder("GemmaModel", "GemmaConfig", head_dim=HIDDEN // HEADS),
    "phi3": _decoder("Phi3Model", "Phi3Config"),
    "gpt2": _gpt2,
    "bert": lambda: _bert(False),
    "bert-token-types": lambda: _bert(True),
    "llama-causal-lm": _decoder("LlamaForCausalLM", "LlamaConfig"),
    "llama-causal-lm-padded": _padded(_decoder("LlamaForCausalLM", "LlamaConfig")),
    "timm-vit": _timm_vit,
}


def _tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", list(MODELS))
def test_conformance(name, pools):
    torch.manual_seed(0)
    module, args, kwargs = MODELS[name]()
    module.eval()
    t0 = time.perf_counter()
    g = trace(module, args, kwargs)
    capture_s = time.perf_counter() - t0
    with torch.no_grad():
        want = _tensors(module(*args, **kwargs))
    assert len(want) == len(g.outputs), (g.outputs, [w.shape for w in want])
    feed = bind(g, module, args, kwargs)
    low = lower(optimize(g, "cpu4", cache=False))
    assert low.world_size == 4
    # the plan spreads the model: ranks exchange blocks, so gloo runs more than rank 0 alone
    assert sum(type(i).__name__ == "Send" for p in low.programs for i in p.instrs) > 0
    if name == "mistral":  # the window is a mask operand of every attention op
        assert all(len(op.inputs) == 4 for op in g.ops if op.fused == "attention"), g.summary()
    got = {"local": run_local(low, feed),
           "gloo": run_dist(low, feed, backend="gloo", pools=pools, no_collectives=True)}
    for backend, outs in got.items():
        for out, ref in zip(g.outputs, want):
            assert tuple(outs[out].shape) == tuple(ref.shape), (backend, out)
            assert rel_err(outs[out].float(), ref.float()) <= TOL, (backend, out)
    fused = sorted(op.fused for op in g.ops if op.fused)
    print(f"\n{name}: {len(g.ops)} ops, fused {fused}, capture {capture_s:.2f} s")


@pytest.mark.parametrize("name", list(MODELS))
def test_meta_capture_is_the_same_graph(name):
    # on the meta device buffers have no values: rotary tables, position ids and masks still
    # capture, as cheap ops or recognised structure, into the graph the CPU capture makes
    torch.manual_seed(0)
    module, args, kwargs = MODELS[name]()
    cpu = trace(module.eval(), args, kwargs)
    with torch.device("meta"):
        module, args, kwargs = MODELS[name]()
    meta = trace(module.eval(), tuple(a.to("meta") for a in args),
                 {k: v.to("meta") for k, v in kwargs.items()})
    # (Gemma's 0-d scale buffer is a number on the CPU, a one-element weight on meta)
    assert [(op.name, op.fused) for op in meta.ops] == [(op.name, op.fused) for op in cpu.ops]
