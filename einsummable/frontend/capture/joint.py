"""torch.export's joint forward-backward of a training step, with attention kept fused.

`_export_forward_backward` decomposes the step to core ATen, and core ATen spells the CPU
attention kernel out as math attention, whose softmax guards fully masked rows by comparing
the scores with -inf (a comparison of data, which has no join-agg form):

    P = where(not any_k(S != -inf), 0, softmax_k(S))

This is the same export with that one decomposition left out: the forward stays
`_scaled_dot_product_flash_attention_for_cpu`, its backward op is recorded beside it, and
`attention.py` maps both to fused ops. Which kernel sdpa runs is torch's choice by device and
inputs (on the meta device, where large models are planned, always math attention), so before
the export every sdpa call whose backward `attention.py` maps (no dropout, 4-d q, k and v with
one batch and head width, kv heads dividing the query heads, no mask or an additive one of
q's dtype) on the CPU or the meta device is written as that CPU kernel itself, which computes
the same. Where math attention remains (batch dims broadcast between q, k and v, a boolean
mask on the meta device), its guard is rewritten as what it computes for finite scores, NaN to 0 after
the softmax (a row is NaN exactly where every score is -inf):

    P = nan_to_zero(softmax_k(S))

Attention a model spells out (matmul, scale, causal mask, softmax, matmul) is first written
as sdpa where it is exactly that (`fuse_grad.py`), so it takes the same fused path.
"""
from __future__ import annotations

import contextlib
import math
import operator

import torch
import torch.fx

from .fuse_grad import fuse_spelled_attention

aten = torch.ops.aten
# Kernels kept whole in the joint graph: `attention.py` maps them and their backward ops.
KEPT = (aten._scaled_dot_product_flash_attention_for_cpu.default,)
# Devices of the sdpa calls written as the CPU kernel (the meta device: planning only).
DEVICES = ("cpu", "meta")


def export_joint(ep: torch.export.ExportedProgram, fuse_spelled: bool = True
                 ) -> torch.export.ExportedProgram:
    """The joint forward-backward program of `ep`, whose output is a loss (index 0);
    `fuse_spelled`: spelled-out attention written as sdpa first (`fuse_grad.py`)."""
    from torch._decomp import core_aten_decompositions
    from torch.export.exported_program import _decompose_exported_program
    from torch.export.experimental import (
        _copy_graph_module_and_signature,
        _remove_detach_pass,
    )
    table = core_aten_decompositions()
    for op in KEPT:
        table.pop(op, None)
    gm, signature = _copy_graph_module_and_signature(ep)
    # before `_as_cpu_kernel`, which takes the sdpa calls this writes
    spelled = fuse_spelled and fuse_spelled_attention(gm, _cpu_kernel_takes, _run_on_values)
    if _as_cpu_kernel(gm) or spelled:
        ep = ep._update(gm, signature)
    ep = _decompose_exported_program(ep, cia_to_decomp={}, python_decomp_table=table,
                                     joint_loss_index=0, decompose_custom_triton_ops=False)
    gm, signature = _copy_graph_module_and_signature(ep)
    _remove_detach_pass(gm, signature)
    _unguard_softmax(gm)
    return ep._update(gm, signature)


def _as_cpu_kernel(gm: torch.fx.GraphModule) -> bool:
    """Every sdpa call the CPU kernel takes as that kernel's output (module docstring);
    whether any was."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.target is not aten.scaled_dot_product_attention.default:
            continue
        opts = dict(zip(("attn_mask", "dropout_p", "is_causal"), node.args[3:]))
        opts.update(node.kwargs)
        if not _cpu_kernel_takes(node.args[:3], opts):
            continue
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(
                KEPT[0], (*node.args[:3], 0.0, bool(opts.get("is_causal", False))),
                {"attn_mask": opts.get("attn_mask"), "scale": opts.get("scale")})
            out = gm.graph.call_function(operator.getitem, (fused, 0))
        fused.meta = {**node.meta, "val": _run_on_values(fused)}
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.recompile()
    return changed


def _run_on_values(node: torch.fx.Node):
    """The node's op run on its arguments' recorded values (fake tensors), as export records
    every node's value."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    mode = getattr(args[0], "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        return node.target(*args, **kwargs)


def _cpu_kernel_takes(qkv, opts: dict) -> bool:
    vals = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in qkv]
    if any(not isinstance(v, torch.Tensor) or v.ndim != 4 or v.device.type not in DEVICES
           for v in vals):
        return False
    q, k, v = vals
    mask = opts.get("attn_mask")
    mask = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else mask
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != q.dtype):
        return False  # a boolean mask, or one torch would cast first
    heads_ok = k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0 and (
        q.shape[1] == k.shape[1] or opts.get("enable_gqa", False))
    return (not opts.get("dropout_p") and q.shape[0] == k.shape[0] == v.shape[0] and heads_ok
            and q.shape[3] == k.shape[3] == v.shape[3] and k.shape[2] == v.shape[2])


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
