"""Candidates per op: a decomposition per topology level, placed canonically on the devices.

A topology's levels go from slow to fast (e.g. node, then GPU in node); level l splits every
unit of level l-1 into F_l children (`Topology.fanouts`). A candidate picks, per level, parts
p[l, m] per mode with prod_m p[l, m] = c_l dividing F_l; r_l = F_l / c_l is the replication at
that level. Mode m is cut into P_m = prod_l p[l, m] blocks; block i_m has the mixed-radix digits
(i_{0,m}, ..., i_{L-1,m}) (slow level most significant), so the slow level owns contiguous runs
of blocks. The level-l tuple index j_l (row-major over modes of the digits) picks children
[j_l r_l, (j_l + 1) r_l) of the current unit. With one level this is exactly
`placement.place`: tuple t runs on devices[t r : (t + 1) r].

Mode roles (`roles`) say what a mode means for the model: "batch" and "seq" (token dims of an
activation input, and what they flow into), "hidden" (the activation's feature dim), "feature"
(a dim first made by a weight: projections, heads, FFN width), "inner" (a mode nested inside a
grouped dim, e.g. the head width e in (h e) or the rotary halves), "unit" (size one). Roles
drive the named strategies and one pruning rule.

Pruning (each rule keeps the named strategies' choices and the plans we know to be good):

- inner modes are never split: splitting a head width or a rotary half only cuts contractions
  into partial sums of the largest tensors (attention scores) and never pays;
- replication (c_l < F_l at some level) only for cheap ops, whose arithmetic intensity is at
  most `CHEAP_INTENSITY` FLOP per byte (elementwise, reductions, views) and whose output is no
  larger than the largest activation input (norms and residual adds, not attention scores),
  and for graph inputs whose layout is free; a replicated matmul repeats the expensive part;
- at most `MAX_SPLIT_MODES` modes split per level (3: enough for a 3D matmul); on a machine
  with several levels, the slow levels split one mode and never replicate ops (traffic across
  them is what a plan must avoid; data parallel or one feature split is what pays there), and
  the fastest level splits at most `MULTI_LEVEL_FAST_SPLIT_MODES` modes and replicates over
  the whole level or not at all;
- with weights="sharded" a weight's layout never replicates, so each byte is stored once.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from ..frontend.ir import Graph, Op, TensorInfo
from .placement import INPUT_PREFIX, Candidate, input_op
from .spec import decompositions, is_legal

CHEAP_INTENSITY = 16.0   # FLOP per byte touched; matmuls of model widths are in the hundreds
MAX_SPLIT_MODES = 3
SLOW_LEVEL_SPLIT_MODES = 1
MULTI_LEVEL_FAST_SPLIT_MODES = 2
REPLICATE_MAX_OUTPUT_RATIO = 1.0  # replicated ops: output at most the residual stream's size
ROLES = ("batch", "seq", "hidden", "feature", "inner", "unit")
TOKEN_ROLES = ("batch", "seq")

LevelParts = tuple[tuple[tuple[str, int], ...], ...]  # per level: (mode, parts) of split modes


@dataclass(frozen=True)
class OpCandidates:
    """The candidates of one node (an op, or the layout of a graph input) and, for each, the
    parts per level that made it (the same order)."""

    key: str
    op: Op
    cands: tuple[Candidate, ...]
    level_parts: tuple[LevelParts, ...]

    def index_of(self, level_parts: LevelParts) -> int | None:
        for i, lp in enumerate(self.level_parts):
            if lp == level_parts:
                return i
        return None


# --------------------------------------------------------------------------- roles

def _input_dim_roles(info: TensorInfo) -> tuple[str, ...]:
    r = len(info.shape)
    if r == 0:
        return ()
    if r == 1:
        return ("hidden",)
    tokens = ("batch",) + ("seq",) * (r - 2) if r >= 3 else ("seq",)
    return tokens + ("hidden",)


def _nested_role(outer: str) -> str:
    return "seq" if outer in TOKEN_ROLES else "inner"


@dataclass(frozen=True)
class Roles:
    tensors: Mapping[str, tuple[str | None, ...]]
    modes: Mapping[str, Mapping[str, str]]  # op name -> mode -> role


def roles(graph: Graph) -> Roles:
    """Propagate dim roles from the activation inputs through every op (see module doc)."""
    tensors: dict[str, tuple[str | None, ...]] = {}
    for t in graph.tensors:
        if t.kind == "input":
            tensors[t.name] = _input_dim_roles(t)
        elif t.kind in ("weight", "constant"):
            tensors[t.name] = (None,) * len(t.shape)
    modes: dict[str, dict[str, str]] = {}
    for op in graph.ops:
        mr: dict[str, str] = {}
        for name, dims in zip(op.inputs, op.in_dims):
            for role, group in zip(tensors.get(name, ()), dims):
                if role is None:
                    continue
                for j, m in enumerate(group):
                    mr.setdefault(m, role if j == 0 else _nested_role(role))
        for name, dims in zip(op.inputs, op.in_dims):  # weight-only modes
            for group in dims:
                for j, m in enumerate(group):
                    mr.setdefault(m, "feature" if j == 0 else "inner")
        for m in op.modes:
            if op.size[m] == 1:
                mr[m] = "unit"
            mr.setdefault(m, "unit")
        modes[op.name] = mr
        tensors[op.output] = tuple(mr[g[0]] for g in op.out_dims)
    return Roles(tensors, modes)


def input_roles(info: TensorInfo, r: Roles) -> dict[str, str]:
    """Roles of the modes of a graph input's identity op (from the tensor's consumers)."""
    op = input_op(info)
    dims = r.tensors.get(info.name, ())
    return {m: (dims[i] if i < len(dims) and dims[i] else "feature")
            for i, m in enumerate(op.modes)}


# --------------------------------------------------------------------------- structure

def structural(op: Op) -> Op:
    """The op without names: tied ops of repeated blocks share one entry in every cache."""
    return dataclasses.replace(op, name="", inputs=tuple(f"in{i}" for i in range(len(op.inputs))),
                               output="out", source=None)


def is_cheap(op: Op, graph: Graph) -> bool:
    """Worth replicating: low arithmetic intensity and an output no larger than the largest
    activation input (the residual stream); replicating a big tensor's op repeats big work."""
    if op.name.startswith(INPUT_PREFIX):
        return True
    out = graph.tensor(op.output).nbytes
    stream = max((t.nbytes for t in graph.tensors if t.kind == "input"), default=out)
    if out > stream * REPLICATE_MAX_OUTPUT_RATIO:
        return False
    if op.is_view:
        return True
    touched = sum(graph.tensor(n).nbytes for n in op.inputs) + out
    return op.flops <= CHEAP_INTENSITY * touched


def _children(topology) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """children[l][u]: the level-l group indices inside unit u of level l-1 (u = 0: root)."""
    out = []
    parents: tuple[tuple[int, ...], ...] = (tuple(range(topology.world_size)),)
    for lv in topology.levels:
        kids = []
        for p in parents:
            pset = set(p)
            kids.append(tuple(gi for gi, g in enumerate(lv.groups) if set(g) <= pset))
        out.append(tuple(kids))
        parents = lv.groups
    return tuple(out)


def _place(op: Op, per_level: Sequence[dict[str, int]], topology, label: str) -> Candidate:
    """Devices per tuple for parts per level (module docstring), tuples in canonical order."""
    modes = op.modes
    kids = _children(topology)
    fan = topology.fanouts()
    combined = {m: math.prod(lp.get(m, 1) for lp in per_level) for m in modes}
    radix = [[lp.get(m, 1) for m in modes] for lp in per_level]
    devices = []
    for index in itertools.product(*(range(combined[m]) for m in modes)):
        digits = []  # per level, per mode
        rest = list(index)
        for lv in reversed(range(len(per_level))):
            row = []
            for k, p in enumerate(radix[lv]):
                row.append(rest[k] % p)
                rest[k] //= p
            digits.append(row)
        digits.reverse()
        units = [0]
        for lv, row in enumerate(digits):
            count = math.prod(radix[lv])
            r = fan[lv] // count
            j = 0
            for d, p in zip(row, radix[lv]):
                j = j * p + d
            units = [kids[lv][u][c] for u in units for c in range(j * r, (j + 1) * r)]
        groups = topology.levels[-1].groups
        devices.append(tuple(groups[u][0] for u in units))
    return Candidate(tuple((m, combined[m]) for m in modes), tuple(devices), label)


def describe(level_parts: LevelParts, level_names: Sequence[str], fanouts: Sequence[int]) -> str:
    parts = []
    for name, lp, f in zip(level_names, level_parts, fanouts):
        split = " ".join(f"{m}/{p}" for m, p in lp) or "whole"
        count = math.prod(p for _, p in lp)
        rep = f" x{f // count}" if count < f else ""
        parts.append(f"{name}: {split}{rep}")
    return " | ".join(parts)


def level_candidates(op: Op, topology, *, replicate: bool, forbidden: frozenset[str],
                     slow_replicate: bool = False
                     ) -> tuple[tuple[Candidate, ...], tuple[LevelParts, ...]]:
    """An op's candidates and their parts per level under the module's rules; `forbidden`
    modes are never split; `slow_replicate` lets a slow level replicate an op that is not a
    graph input (a node-parallel plan's tables, `node_parallel.py`)."""
    return _op_candidates(op, topology, replicate, forbidden, MAX_SPLIT_MODES, slow_replicate)


@lru_cache(maxsize=8192)
def _op_candidates(op: Op, topology, replicate: bool, forbidden: frozenset[str],
                   max_split: int, slow_replicate: bool = False
                   ) -> tuple[tuple[Candidate, ...], tuple[LevelParts, ...]]:
    fan = topology.fanouts()
    names = [lv.name for lv in topology.levels]
    per_level = []
    multi = len(fan) > 1
    for lv, f in enumerate(fan):
        slow = lv < len(fan) - 1
        cap = max_split
        if multi and max_split == MAX_SPLIT_MODES:
            cap = SLOW_LEVEL_SPLIT_MODES if slow else MULTI_LEVEL_FAST_SPLIT_MODES
        rep = replicate and (slow_replicate or not (slow and not op.name.startswith(INPUT_PREFIX)))
        decs = []
        for dec in decompositions(op, f, replication=rep):
            split = dec.split_modes()
            if forbidden.intersection(split) or len(split) > cap:
                continue
            if multi and 1 < dec.n_tuples < f and max_split == MAX_SPLIT_MODES:
                continue  # several levels: replicate a level fully or not at all
            decs.append(tuple((m, p) for m, p in dec.parts if p > 1))
        per_level.append(decs)
    cands: list[Candidate] = []
    lps: list[LevelParts] = []
    seen: set[tuple] = set()
    for combo in itertools.product(*per_level):
        dicts = [dict(lp) for lp in combo]
        combined = {m: math.prod(d.get(m, 1) for d in dicts) for m in op.modes}
        if not is_legal(op, combined):
            continue
        cand = _place(op, dicts, topology, describe(combo, names, fan))
        key = (cand.parts, cand.devices)
        if key in seen:
            continue
        seen.add(key)
        cands.append(cand)
        lps.append(tuple(combo))
    return tuple(cands), tuple(lps)


def op_candidates(op: Op, graph: Graph, topology, mode_roles: Mapping[str, str], *,
                  replicate: bool | None = None, key: str | None = None) -> OpCandidates:
    """Candidates of one op under the pruning rules; `replicate` overrides the cheap-op rule."""
    allow = is_cheap(op, graph) if replicate is None else replicate
    forbidden = frozenset(m for m in op.modes if mode_roles.get(m) == "inner")
    s = structural(op)
    cands, lps = _op_candidates(s, topology, allow, forbidden, MAX_SPLIT_MODES)
    if not cands:  # nothing survives (e.g. too few elements): keep the legal fallbacks
        cands, lps = _op_candidates(s, topology, True, frozenset(), len(op.modes))
    return OpCandidates(key or op.name, op, cands, lps)


def input_candidates(info: TensorInfo, topology, mode_roles: Mapping[str, str], *,
                     sharded: bool) -> OpCandidates:
    """Layouts a graph input may arrive in. Sharded: every byte on exactly one device."""
    op = input_op(info)
    key = INPUT_PREFIX + info.name
    forbidden = frozenset(m for m in op.modes if mode_roles.get(m) == "inner")
    cands, lps = _op_candidates(op, topology, not sharded, forbidden, MAX_SPLIT_MODES)
    if not cands:
        cands, lps = _op_candidates(op, topology, not sharded, frozenset(), len(op.modes))
    if not cands:  # too small to shard over every device: one copy on device 0
        whole = tuple(() for _ in topology.levels)
        cands = (Candidate(tuple((m, 1) for m in op.modes), ((0,),), "whole on device 0"),)
        lps = (whole,)
    return OpCandidates(key, op, cands, lps)


def graph_candidates(graph: Graph, topology, *, weights: str = "sharded",
                     r: Roles | None = None) -> dict[str, OpCandidates]:
    """Every node's candidates: graph inputs first ("input:<name>"), then ops in order."""
    r = r or roles(graph)
    out: dict[str, OpCandidates] = {}
    for t in graph.inputs:
        sharded = t.kind == "weight" and weights == "sharded"
        out[INPUT_PREFIX + t.name] = input_candidates(t, topology, input_roles(t, r),
                                                      sharded=sharded)
    for op in graph.ops:
        out[op.name] = op_candidates(op, graph, topology, r.modes[op.name])
    return out
