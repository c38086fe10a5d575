"""What a plan does, in words: per op, which modes it splits, named by their role.

Modes get their role from `candidates.roles` (batch, seq, feature, hidden, ...) and their
extent, so "seq 131072/8" reads as "the 131072 tokens split eight ways". Ops that split alike
are grouped; the most common split is stated once, the others op by op.
"""
from __future__ import annotations

from collections import Counter


def op_splits(plan) -> dict[str, str]:
    """op name -> its split, e.g. "seq 2048/8" or "feature 32/4 + batch 4/2" ("(attention)"
    added for attention kernels); "whole" for an op run unsplit, "replicated" for one run
    whole on several devices. Views are left out: they move nothing."""
    from einsummable.planning.candidates import roles
    graph = plan.graph
    mode_roles = roles(graph).modes
    chosen = dict(getattr(plan, "chosen", None) or plan.choice)
    out: dict[str, str] = {}
    for op in graph.ops:
        cand = chosen.get(op.name)
        if cand is None or op.is_view:
            continue
        split = [(m, p) for m, p in cand.parts if p > 1]
        if not split:
            out[op.name] = "replicated" if len(cand.used_devices) > 1 else "whole"
            continue
        role = mode_roles.get(op.name, {})
        attention = sum(1 for m in op.modes if role.get(m) == "seq") >= 2
        out[op.name] = " + ".join(
            f"{_label(role.get(m, m), m in op.agg_modes and attention)} {op.size[m]}/{p}"
            for m, p in split) + (" (attention)" if attention else "")
    return out


def _label(role: str, key: bool) -> str:
    """An attention op's aggregated sequence mode is the keys' (split: ring-style partials)."""
    return "key seq" if key and role == "seq" else role


def describe(plan) -> str:
    """One line: the most common split, then the ops that differ."""
    splits = op_splits(plan)
    if not splits:
        return "no ops"
    common, n = Counter(splits.values()).most_common(1)[0]
    others = [f"{name}: {s}" for name, s in splits.items() if s != common]
    text = f"{n} of {len(splits)} ops split {common}"
    return text + ("; " + "; ".join(others) if others else "")
