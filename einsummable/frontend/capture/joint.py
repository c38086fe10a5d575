"""torch.export's joint forward-backward of a training step, with attention kept fused.

`_export_forward_backward` decomposes the step to core ATen, and core ATen spells the CPU
attention kernel out as math attention, whose masked softmax guards fully masked rows by
comparing scores to -inf (a comparison of data, which has no join-agg form). This is the same
export with that one decomposition left out: the forward stays
`_scaled_dot_product_flash_attention_for_cpu` and its backward op is recorded beside it, and
`attention.py` maps both to fused ops.
"""
from __future__ import annotations

import torch

# Kernels kept whole in the joint graph: `attention.py` maps them and their backward ops.
KEPT = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


def export_joint(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The joint forward-backward program of `ep`, whose output is a loss (index 0)."""
    from torch._decomp import core_aten_decompositions
    from torch.export.exported_program import _decompose_exported_program
    from torch.export.experimental import (
        _copy_graph_module_and_signature,
        _remove_detach_pass,
    )
    table = core_aten_decompositions()
    for op in KEPT:
        table.pop(op, None)
    ep = _decompose_exported_program(ep, cia_to_decomp={}, python_decomp_table=table,
                                     joint_loss_index=0, decompose_custom_triton_ops=False)
    gm, signature = _copy_graph_module_and_signature(ep)
    _remove_detach_pass(gm, signature)
    return ep._update(gm, signature)
