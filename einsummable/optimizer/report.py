"""A plan explained: per node its split per level, compute and exchange seconds, bytes moved
in, and the same node under each named strategy. Every figure is priced on the plan's own
options (`model.plan_model`), so a report never prices a plan on another model."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from ..planning.candidates import input_roles, roles
from ..planning.placement import INPUT_PREFIX
from ..planning.plan import Plan, Solved
from .api import named_plan
from .model import Model, plan_model
from .named import STRATEGIES, STRATEGY_WEIGHTS
from .objective import split
from .peak import assignment_peaks

MS = 1e3  # seconds -> milliseconds in the report
MB = 1e-6  # bytes -> megabytes
GB = 1e9  # bytes per gigabyte


@dataclass(frozen=True)
class NodeCost:
    """One node of a plan: its unary seconds (compute, and the fold of an unfed output), the
    seconds of the exchanges into it, and the bytes they move."""
    compute_s: float
    exchange_s: float
    nbytes: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exchange_s


def node_costs(model: Model, choice: Mapping[str, int]) -> dict[str, NodeCost]:
    """Per node of `model`, its costs under `choice` (node -> candidate index)."""
    out = {k: [model.unary(k, choice[k]), 0.0, 0] for k in model.nodes}
    for e in model.edges:
        c = e.cost(choice[e.src], choice[e.dst])
        out[e.dst][1] += c.seconds
        out[e.dst][2] += c.nbytes
    return {k: NodeCost(v[0], v[1], v[2]) for k, v in out.items()}


def plan_costs(plan: Plan) -> dict[str, NodeCost]:
    """Per node of `plan`, its costs on the plan's own options."""
    model = plan_model(plan)
    return node_costs(model, {k: 0 for k in model.nodes})


_SPLIT = re.compile(r"\b([A-Za-z_]\w*)/(\d+)")


def splits_in_words(plan: Plan) -> dict[str, str]:
    """Per node, its split per level with each mode named by its role in the model
    (`planning.candidates.roles`) instead of its letter: "gpu: batch/4 seq/2". Roles: batch,
    seq, hidden; heads and head_dim where a hidden dim is read per head (`_heads`); ffn for
    the graph's widest feature where it is wider than the hidden size (the MLP's inner width);
    feature for other output features; inner. Where two split modes of one op share a role
    the letter stays beside it ("seq.q/2 seq.k/2")."""
    r = roles(plan.graph)
    ffn = _ffn_width(plan, r.modes)
    out = {}
    for k, cand in plan.choice:
        if k.startswith(INPUT_PREFIX):
            names = input_roles(plan.graph.tensor(k[len(INPUT_PREFIX):]), r)
        else:
            op = plan.graph.op(k)
            names = _heads(plan, op, {m: "ffn" if role == "feature" and op.size[m] == ffn
                                      else role for m, role in r.modes.get(k, {}).items()})
        label = str(cand)
        split = [m for m, _ in _SPLIT.findall(label) if m in names]
        shared = {names[m] for m in split if sum(names[x] == names[m] for x in split) > 1}

        def word(match: re.Match) -> str:
            m, parts = match.group(1), match.group(2)
            if m not in names:
                return match.group(0)
            role = names[m]
            return f"{role}.{m}/{parts}" if role in shared else f"{role}/{parts}"
        out[k] = _SPLIT.sub(word, label)
    return out


def _ffn_width(plan: Plan, modes: Mapping[str, Mapping[str, str]]) -> int | None:
    """The widest output feature of the graph where it is wider than every hidden mode (an
    MLP's inner width: LLaMA-7B's 11008 beside 4096), else None."""
    hidden, feature = 0, 0
    for op in plan.graph.ops:
        for m, role in modes.get(op.name, {}).items():
            if role == "hidden":
                hidden = max(hidden, op.size[m])
            elif role == "feature":
                feature = max(feature, op.size[m])
    return feature if feature > hidden else None


def _heads(plan: Plan, op, names: dict[str, str]) -> dict[str, str]:
    """Where an activation the op reads or writes holds a hidden (or feature) mode beside an
    inner one, its hidden dim is read per head: the outer mode is heads, the inner head_dim.
    Weights are left out (a projection's weight holds its output features beside them)."""
    out = dict(names)
    for tensor, dims in ((op.output, op.out_dims), *zip(op.inputs, op.in_dims)):
        if plan.graph.tensor(tensor).kind == "weight":
            continue
        modes = [m for g in dims for m in g]
        if not any(names.get(m) == "inner" for m in modes):
            continue
        for m in modes:
            if names.get(m) in ("hidden", "feature"):
                out[m] = "heads"
            elif names.get(m) == "inner":
                out[m] = "head_dim"
    return out


def where(plan: Plan, key: str) -> str:
    """Where an op came from: its module path and line, "layers.0.attention.wo (model.py:120)"
    for a captured op (capture keeps "file:line in module" as its source), the line alone for
    one built by hand; "" for graph inputs."""
    if key.startswith(INPUT_PREFIX):
        return ""
    op = plan.graph.op(key)
    if not op.source:
        return ""
    at, _, module = op.source.partition(" in ")
    path, _, line = at.rpartition(":")
    line = f"{os.path.basename(path)}:{line}" if path else at
    return f"{module} ({line})" if module else line


def _judged_lines(plan: Plan) -> list[str]:
    """What the simulator said: this plan's time, every plan it was chosen from, and which
    claim holds on which model."""
    j = plan.judged
    what = "one block in a stack" if j.measure == "block" else "its program"
    out = [f"simulated {j.simulated_s * MS:.4f} ms ({what}): the least of {len(j.considered)} "
           f"plans simulated (objective / simulated ms):"]
    out.extend(f"  {c.label:<18} {c.objective_s * MS:>10.4f} {c.simulated_s * MS:>10.4f}"
               for c in j.considered)
    out.extend(f"  {label:<18} left out: {why}" for label, why in j.left_out)
    proof = ("the bound and gap above are a proof on the objective's model; "
             if plan.bound_s is not None else "")
    out.append(f"  {proof}the choice by simulated time holds among these plans only")
    return out


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB else f"{nbytes * MB:.3g} MB"


def explain(plan: Plan, strategies: bool = True) -> str:
    """Text report: the objective and its parts, then per node the split per level, compute
    and exchange milliseconds, megabytes moved in, and (with `strategies`) the node's
    milliseconds under each named strategy on the same options."""
    options = plan.options
    graph, topology = plan.graph, plan.topology
    model = plan_model(plan)
    mine = {k: 0 for k in model.nodes}
    per_node = node_costs(model, mine)
    others: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = {}
    if strategies:
        for name in STRATEGIES:
            sp = named_plan(graph, topology, name, options=options)
            others[name] = {k: v.total_s for k, v in plan_costs(sp).items()}
            totals[name] = sp.objective_s
    stopped = isinstance(plan.origin, Solved) and plan.origin.status == "time_limit"
    lines = [f"plan for {len(graph.ops)} ops on {topology.name} ({topology.world_size} devices), "
             f"weights={options.weights}, steady_state={options.steady_state}"
             + (f", one block of {options.layers} layers" if options.layers > 1 else ""),
             f"objective {plan.objective_s * MS:.4f} ms"
             + (f", bound {plan.bound_s * MS:.4f} ms, gap {plan.gap:.2e}"
                if plan.bound_s is not None and plan.gap is not None else "")
             + (f", solved in {plan.solve_s:.2f} s" if plan.solve_s else "")
             + (" (stopped at the time limit: the best plan found)" if stopped else "")]
    if isinstance(plan.origin, Solved) and plan.origin.pool_rank > 1:
        lines.append(f"the MIP's plan {plan.origin.pool_rank}: optimal among the plans that "
                     f"split some time-heavy op otherwise than the {plan.origin.pool_rank - 1} "
                     "before it; its bound is the optimum's, a bound on every plan")
    if plan.judged is not None:
        lines.extend(_judged_lines(plan))
    if options.overlap:
        parts = split(model, mine)
        if parts.levels:
            names = [lv.name for lv in topology.levels]
            lines.append(f"max(activation exchanges {parts.activations_s * MS:.4f} ms + compute "
                         f"{parts.compute_s * MS:.4f} ms, per level the exchanges streamed "
                         "beside it: " + ", ".join(
                             f"{nm} {(parts.finish_s + a) * MS:.4f} + {w * MS:.4f} ms"
                             for nm, (a, w) in zip(names, parts.levels)) + ")")
        else:
            lines.append(f"activation exchanges {parts.activations_s * MS:.4f} ms + max(compute "
                         f"{parts.compute_s * MS:.4f} ms, weight exchanges "
                         f"{parts.weights_s * MS:.4f} ms streamed behind it)")
    peak = max(assignment_peaks(model, mine), key=lambda p: (p.bytes, -p.device))
    cap = topology.devices[peak.device].mem_bytes
    lines.append(f"memory: at most {_size(peak.bytes)} on a device (device {peak.device}"
                 + (f", at op {peak.op!r}" if peak.op else "") + f"), of its {_size(cap)}"
                 + (f"; {options.layers} layers' weights" if options.layers > 1 else ""))
    if totals:
        lines.append("named strategies: " + ", ".join(
            f"{n} {t * MS:.4f} ms" + (" (weights replicated)" if n in STRATEGY_WEIGHTS else "")
            for n, t in totals.items()))
    head = f"{'op':<28} {'split per level':<34} {'compute ms':>10} {'exch ms':>9} {'MB in':>9}"
    if others:
        head += "  " + " ".join(f"{n[:12]:>12}" for n in others)
    lines.append(head + "  where")
    words = splits_in_words(plan)
    for k, cost in per_node.items():
        label = words[k]
        row = f"{k[:28]:<28} {label[:34]:<34} {cost.compute_s * MS:>10.4f} " \
              f"{cost.exchange_s * MS:>9.4f} {cost.nbytes * MB:>9.2f}"
        if others:
            row += "  " + " ".join(f"{others[n].get(k, 0.0) * MS:>12.4f}" for n in others)
        lines.append(row + f"  {where(plan, k)}".rstrip())
    return "\n".join(lines)
