"""torch.export's joint forward-backward of a training step, with attention kept fused.

`_export_forward_backward` decomposes the step to core ATen, and core ATen spells the CPU
attention kernel out as math attention, whose softmax guards fully masked rows by comparing
the scores with -inf (a comparison of data, which has no join-agg form):

    P = where(not any_k(S != -inf), 0, softmax_k(S))

This is the same export with that one decomposition left out: the forward stays
`_scaled_dot_product_flash_attention_for_cpu`, its backward op is recorded beside it, and
`attention.py` maps both to fused ops. Where torch itself runs math attention (inputs its CPU
kernel refuses: batch dims broadcast between q, k and v, a head dim that is not contiguous),
the guard is rewritten as what it computes for finite scores, NaN to 0 after the softmax
(a row is NaN exactly where every score is -inf):

    P = nan_to_zero(softmax_k(S))
"""
from __future__ import annotations

import math

import torch
import torch.fx

aten = torch.ops.aten
# Kernels kept whole in the joint graph: `attention.py` maps them and their backward ops.
KEPT = (aten._scaled_dot_product_flash_attention_for_cpu.default,)


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
    _unguard_softmax(gm)
    return ep._update(gm, signature)


def _unguard_softmax(gm: torch.fx.GraphModule) -> None:
    """Every guarded softmax of math attention as NaN to 0 after the softmax (module doc)."""
    changed = False
    for node in list(gm.graph.nodes):
        probs = _guarded(node)
        if probs is None:
            continue
        with gm.graph.inserting_after(node):
            clean = gm.graph.call_function(aten.nan_to_num.default,
                                           (probs, 0.0, math.inf, -math.inf))
        clean.meta = dict(node.meta)
        node.replace_all_uses_with(clean)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()


def _guarded(node: torch.fx.Node) -> torch.fx.Node | None:
    """The softmax of `where(not any(not (S == -inf), dim, keepdim), 0, softmax(S, dim))`,
    or None where `node` is not that guard."""
    if node.target is not aten.where.self:
        return None
    cond, zero, probs = node.args
    if not (_is(probs, aten._softmax.default) and _is(zero, aten.full_like.default)
            and zero.args[1] == 0 and _is(cond, aten.logical_not.default)):
        return None
    scores, dim = probs.args[0], probs.args[1]
    anyk = cond.args[0]
    if not (_is(anyk, aten.any.dim) and anyk.args[1] == dim and anyk.args[2:3] == (True,)):
        return None
    kept = anyk.args[0]
    if not _is(kept, aten.logical_not.default):
        return None
    eq = kept.args[0]
    if not (_is(eq, aten.eq.Scalar) and eq.args[0] is scores and eq.args[1] == -math.inf):
        return None
    return probs


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.target is target
