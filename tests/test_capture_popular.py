"""Capture of what popular model code writes: rotary tables computed in forward, lookups
(gather, index_select, tensor indexing), integer buffers beside floats, empty slices, masks
built in forward, transformers models with their KV cache. Each capture is checked against the
module itself through the reference evaluator (float32, relative error <= 1e-5)."""
from __future__ import annotations

import conftest  # noqa: F401  (transformers imports torchvision: see conftest)
import pytest
import torch
from torch import nn

from einsummable.frontend.capture import trace

from helpers import Fn, capture_check as check, rand as r


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
