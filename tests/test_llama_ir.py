"""The builder's LLaMA block equals the nn.Module block for every preset at reduced width."""
import pytest

import einsummable as es
from einsummable.models import preset
from einsummable.models.llama_ir import llama_block_graph

from helpers import module_inputs

PRESETS = ["llama-tiny", "llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama3-8b"]


@pytest.mark.parametrize("name", PRESETS)
def test_ir_block_equals_module(name):
    width = None if name == "llama-tiny" else (0.25 if name == "llama3-8b" else 0.0625)
    module, (x,) = preset(name, batch=2, seq=12, width=width)
    g = llama_block_graph(module.config, 2, 12)
    out = es.evaluate(g, module_inputs(module, x))[g.outputs[0]]
    ref = module(x).detach()
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-5


def test_ir_stack_equals_module_stack():
    module, (x,) = preset("llama-tiny", batch=1, seq=8, n_layers=2)
    g = llama_block_graph(module.config, 1, 8, n_layers=2)
    names = {t.name for t in g.weights}
    params = dict(module.named_parameters())
    assert names == set(params), sorted(names ^ set(params))
    out = es.evaluate(g, module_inputs(module, x))[g.outputs[0]]
    ref = module(x).detach()
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-5


def test_big_presets_build_from_shapes_only():
    module, (x,) = preset("llama-65b", batch=4, seq=2048, device="meta")
    g = llama_block_graph(module.config, 4, 2048, dtype="float16")
    assert g.flops > 4 * 2048 * 12 * 8192 * 8192  # at least the projections
    assert all(t.dtype == "float16" for t in g.tensors)
