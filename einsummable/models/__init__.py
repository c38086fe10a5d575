"""Model zoo: LLaMA, GPT-2, Mistral blocks and MLPs as plain nn.Modules, plus named presets.

    module, (x,) = preset("llama-7b", batch=4, seq=2048, device="meta")
    module, (x,) = hf("llama")      # a transformers model type's layer, its defaults (7B)
"""
from einsummable.models.gpt2 import GPT2Block, GPT2Config
from einsummable.models.huggingface import hf, hf_config
from einsummable.models.init import init_weights
from einsummable.models.llama import (
                                      Attention,
                                      FeedForward,
                                      LlamaBlock,
                                      LlamaConfig,
                                      LlamaStack,
                                      RMSNorm,
                                      apply_rotary,
                                      llama_ffn_dim,
                                      precompute_rotary,
                                      repeat_kv,
                                      rotate_half,
)
from einsummable.models.mistral import MistralBlock, MistralConfig
from einsummable.models.mlp import MLP, TwoLayerMLP
from einsummable.models.presets import (
                                      PRESETS,
                                      build,
                                      list_presets,
                                      preset,
                                      preset_config,
                                      scale_config,
)

__all__ = [
    "PRESETS", "preset", "preset_config", "list_presets", "scale_config", "build", "init_weights",
    "LlamaConfig", "LlamaBlock", "LlamaStack", "Attention", "FeedForward", "RMSNorm",
    "precompute_rotary", "rotate_half", "apply_rotary", "repeat_kv", "llama_ffn_dim",
    "GPT2Config", "GPT2Block", "MistralConfig", "MistralBlock", "MLP", "TwoLayerMLP",
    "hf", "hf_config",
]
