"""transformers models as users have them: built from a model type's config, nothing downloaded.

    module, (x,) = hf("llama", batch=4, seq=2048)               # one decoder layer, 7B defaults
    module, (ids,) = hf("qwen2", part="model", overrides={"num_hidden_layers": 2})

The config is the model type's own defaults (`AutoConfig.for_model`: LLaMA's are the 7B
model's) with `overrides` in place of its fields, and the module is built on `device` (the
meta device by default: no weights allocated, which is all planning needs).

`part="layer"`: the first decoder layer, run as the model runs it. The model's forward computes
the causal mask (a sliding-window one for a layer whose type says so) and the rotary tables
from the positions and hands them to every layer; `DecoderLayer` computes them the same way in
its own forward, with the same transformers functions, so what is captured is what the model
executes per layer, not a hand-made copy. Input: hidden states (batch, seq, hidden).
`part="model"`: the whole model with its language-model head when the type has one
(`AutoModelForCausalLM`), else the base model; forward takes token ids (batch, seq) and
returns the logits (or the last hidden states), with the KV cache off: a forward pass over the
sequence, which is what is planned.
"""
from __future__ import annotations

import difflib
import json
from typing import Any, Mapping

import torch
from torch import nn

from einsummable.errors import EinsummableError
from einsummable.models.compat import torchvision_importable

PARTS = ("layer", "model")


def _transformers():
    torchvision_importable()  # transformers imports it where it is installed
    try:
        import transformers
    except ImportError:
        raise EinsummableError("building transformers models needs the transformers package",
                               fix="pip install transformers") from None
    return transformers


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`key=value` strings (the command line's `--hf-set`) as a dict; a value is read as JSON
    where it is JSON (numbers, true/false, null, lists), else kept as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise EinsummableError(f"--hf-set {item!r} is not key=value",
                                   fix="e.g. --hf-set num_hidden_layers=2")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def hf_config(model_type: str, overrides: Mapping[str, Any] | None = None):
    """The model type's default config with `overrides` set. A key the config does not have
    is an error (transformers would keep it silently and build the defaults)."""
    tf = _transformers()
    types = sorted(tf.CONFIG_MAPPING.keys())
    if model_type not in types:
        near = difflib.get_close_matches(model_type, types, n=5)
        raise EinsummableError(f"transformers has no model type {model_type!r}",
                               fix=f"did you mean {', '.join(near)}?" if near else
                               "pass a model type such as llama, mistral, qwen2, gemma, phi3, "
                               "gpt2 or bert")
    default = tf.AutoConfig.for_model(model_type)
    known = set(default.to_dict())
    for key in overrides or {}:
        if key not in known and not hasattr(default, key):
            near = difflib.get_close_matches(key, sorted(known), n=3)
            raise EinsummableError(f"the {model_type} config has no field {key!r}",
                                   fix=f"did you mean {', '.join(near)}?" if near else
                                   f"see {type(default).__name__}'s fields")
    return tf.AutoConfig.for_model(model_type, **dict(overrides or {}))


def _layers(model: nn.Module, n_layers: int) -> nn.ModuleList:
    """The model's stack of decoder (or encoder) layers: its first ModuleList of
    `num_hidden_layers` modules (`model.layers`, GPT-2's `h`, BERT's `encoder.layer`)."""
    for _, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n_layers:
            return mod
    raise EinsummableError(f"{type(model).__name__} has no list of {n_layers} layers",
                           fix="plan the whole model: part='model' (--hf-part model)")


class DecoderLayer(nn.Module):
    """One layer of a transformers model, with the mask and rotary tables computed in forward
    as the model's own forward computes them (module docstring)."""

    def __init__(self, config, layer: nn.Module, rotary: nn.Module | None, causal: bool,
                 index: int = 0):
        super().__init__()
        self.config = config
        self.layer = layer
        self.rotary_emb = rotary
        self.causal = causal  # an encoder's layer (BERT) attends both ways: no mask
        self.index = index

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from transformers import masking_utils
        positions = torch.arange(hidden_states.shape[1],
                                 device=hidden_states.device).unsqueeze(0)
        # a layer's type where the config lists them (Qwen2, Gemma 2, ...), else the whole
        # model's window (Mistral: a sliding window whenever one is set)
        kinds = getattr(self.config, "layer_types", None)
        sliding = (kinds[self.index] == "sliding_attention" if kinds is not None
                   else getattr(self.config, "sliding_window", None) is not None)
        make_mask = (masking_utils.create_sliding_window_causal_mask if sliding
                     else masking_utils.create_causal_mask)
        kwargs: dict[str, Any] = {"position_ids": positions}
        if self.causal:
            kwargs["attention_mask"] = make_mask(config=self.config, inputs_embeds=hidden_states,
                                                 attention_mask=None, cache=None,
                                                 position_ids=positions)
        if self.rotary_emb is not None:
            kwargs["position_embeddings"] = self.rotary_emb(hidden_states, position_ids=positions)
        out = self.layer(hidden_states, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


class WholeModel(nn.Module):
    """The whole model on token ids, returning logits (or the last hidden states), KV cache
    off."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, use_cache=False)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


def hf(model_type: str, *, part: str = "layer", batch: int = 4, seq: int = 2048,
       dtype: torch.dtype = torch.float16, device: str | torch.device = "meta",
       overrides: Mapping[str, Any] | None = None, attn_implementation: str = "sdpa",
       seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The module and its example input for a transformers model type (module docstring).
    `attn_implementation`: "sdpa" (fused attention, the default) or "eager" (spelled out).
    `seed`: random init on a real device (token ids too)."""
    if part not in PARTS:
        raise EinsummableError(f"part must be one of {', '.join(PARTS)}, got {part!r}",
                               fix="part='layer' (one decoder layer) or 'model' (the whole)")
    tf = _transformers()
    config = hf_config(model_type, overrides)
    config._attn_implementation = attn_implementation
    config.use_cache = False
    torch.manual_seed(seed)
    with torch.device(device):
        if part == "model":
            try:
                model = tf.AutoModelForCausalLM.from_config(config)
            except ValueError:  # a type with no causal LM head (an encoder): the base model
                model = tf.AutoModel.from_config(config)
            module: nn.Module = WholeModel(model)
            x = torch.randint(0, config.vocab_size, (batch, seq))
        else:
            # one layer's worth: build the base model with a single layer, keep that layer
            one = hf_config(model_type, {**dict(overrides or {}), "num_hidden_layers": 1})
            one._attn_implementation = attn_implementation
            base = tf.AutoModel.from_config(one)
            causal = model_type in tf.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            module = DecoderLayer(one, _layers(base, 1)[0], getattr(base, "rotary_emb", None),
                                  causal)
            x = torch.randn(batch, seq, config.hidden_size)
    module = module.to(dtype).eval()
    return module, (x.to(dtype) if x.is_floating_point() else x,)
