"""Node-parallel candidates: the slowest level fixed, every node running its share of the batch.

On a machine of levels l = 0..L-1 (slow to fast, fanouts F_l; `candidates.py`), the full
search picks parts per level for every op, so its candidates multiply with the levels and
its exchanges are priced over every device: on 8 nodes of 8 GPUs a one-minute solve ends at
a gap of 81%. Most of what pays across nodes is known: the network is an order of magnitude
slower than the links inside a node, so a good plan sends as little across it as it can, and
the least is data parallelism over the nodes. A node-parallel plan fixes level 0:

- an op with a batch mode b (role "batch") whose size F_0 divides is split b / F_0 at level
  0, node k taking batch blocks [k B/F_0, (k+1) B/F_0);
- an op with no batch mode (tables, weight-only ops) is replicated over the nodes (F_0
  copies, the cheap work repeated rather than exchanged);
- a weight is stored as the weights option says: "sharded" splits one mode over the nodes
  (each byte stored once; every node gathers the rest, streamed behind compute as the
  objective prices it), "free" replicates it over the nodes;
- the levels below are searched as before (`candidates.op_candidates`' rules).

Where the batch does not divide over the F_0 nodes (batch 16 on 32 nodes), the nodes are
grouped first (`grouped`): g = the largest divisor of F_0 that divides the batch, each group
the F_0 / g consecutive nodes, and the groups become a new slowest level (fanouts g, F_0 / g,
F_1, ...). The rule above then fixes that level: every group runs its share of the batch,
and the MIP searches inside one group, its nodes and their devices together, so the nodes of
a group may split a sequence or a head between them over the network where that pays. The
devices, links and ports are the machine's; only the hierarchy the search sees changes.

Each op keeps the candidates of one node's search (times the weights' level-0 layouts), so
the MIP over them has the size of one node's, while its costs stay those of the whole
machine: the cross-node exchanges a plan does make (weights streamed, nothing else in a
forward block) are priced on the network. The plan it returns is a plan of the whole
machine, lowered and simulated like any other; it is one member of the set the selection
stage judges (`selection/choose.py`), beside the full search's optimum.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..errors import PlanError
from ..frontend.ir import Graph, Op
from ..topology.model import Level
from .candidates import (LevelParts, OpCandidates, Roles, input_roles, level_candidates,
                         op_candidates, roles, structural)
from .placement import INPUT_PREFIX, input_op


def applies(topology) -> bool:
    """A machine of several levels (nodes of devices): what fixing the slowest one means."""
    return len(topology.fanouts()) > 1


def batch_sizes(graph: Graph, r: Roles | None = None) -> tuple[int, ...]:
    """The sizes of the activation inputs' batch dims (the extents a node-parallel plan
    splits over the nodes)."""
    r = r or roles(graph)
    out = set()
    for t in graph.inputs:
        if t.kind == "input":
            op = input_op(t)
            out.update(op.size[m] for m, role in input_roles(t, r).items() if role == "batch")
    return tuple(sorted(out))


def grouped(graph: Graph, topology, r: Roles | None = None):
    """`topology` with its nodes grouped so that the batch divides over the groups (module
    docstring); `topology` itself where it already does, or where no grouping can help (a
    batch of 1, one level: `node_parallel_candidates` says why)."""
    if not applies(topology):
        return topology
    f0 = topology.fanouts()[0]
    sizes = batch_sizes(graph, r)
    if any(b % f0 == 0 for b in sizes):
        return topology
    g = max((d for d in range(2, f0) if f0 % d == 0 and any(b % d == 0 for b in sizes)),
            default=None)
    if g is None:
        return topology
    nodes = topology.levels[0].groups
    per = f0 // g
    groups = tuple(tuple(d for node in nodes[i * per:(i + 1) * per] for d in node)
                   for i in range(g))
    top = Level(f"{topology.levels[0].name}-group", groups)
    return dataclasses.replace(topology, levels=(top, *topology.levels))


def _batch_modes(op: Op, mode_roles: Mapping[str, str], f0: int) -> tuple[str, ...]:
    return tuple(m for m in op.modes if mode_roles.get(m) == "batch" and op.size[m] % f0 == 0)


def _inner(op: Op, mode_roles: Mapping[str, str]) -> frozenset[str]:
    return frozenset(m for m in op.modes if mode_roles.get(m) == "inner")


def _level0(lp: LevelParts) -> tuple[tuple[str, int], ...]:
    return lp[0] if lp else ()


def _keep(oc: OpCandidates, ok) -> OpCandidates | None:
    kept = [(c, lp) for c, lp in zip(oc.cands, oc.level_parts) if ok(_level0(lp))]
    if not kept:
        return None
    cands, lps = zip(*kept)
    return OpCandidates(oc.key, oc.op, tuple(cands), tuple(lps))


def _replicated_over_nodes(op: Op, topology, key: str, mode_roles: Mapping[str, str]
                           ) -> OpCandidates | None:
    """An op's candidates replicated over the nodes (level 0 whole), the levels below free."""
    cands, lps = level_candidates(structural(op) if not key.startswith(INPUT_PREFIX) else op,
                                  topology, replicate=True, forbidden=_inner(op, mode_roles),
                                  slow_replicate=True)
    return _keep(OpCandidates(key, op, cands, lps), lambda l0: l0 == ())


def node_parallel_candidates(graph: Graph, topology, *, weights: str = "sharded",
                             r: Roles | None = None) -> dict[str, OpCandidates]:
    """Every node's candidates under the node-parallel rule (module docstring), graph inputs
    first as `graph_candidates` orders them. Raises PlanError where the rule cannot hold:
    one level only, or no batch mode the node count divides."""
    if not applies(topology):
        raise PlanError(f"topology {topology.name!r} has one level: node-parallel plans fix "
                        "the slowest of several", fix="use the full search on this machine")
    f0 = topology.fanouts()[0]
    r = r or roles(graph)
    out: dict[str, OpCandidates] = {}
    split_any = False
    for t in graph.inputs:
        key = INPUT_PREFIX + t.name
        mr = input_roles(t, r)
        op = input_op(t)
        batch = _batch_modes(op, mr, f0)
        if batch:
            full = level_candidates(op, topology, replicate=False, forbidden=_inner(op, mr))
            oc = _keep(OpCandidates(key, op, *full), lambda l0: l0 in {((b, f0),) for b in batch})
            split_any = True
        elif t.kind == "weight" and weights == "sharded":
            full = level_candidates(op, topology, replicate=False, forbidden=_inner(op, mr))
            oc = _keep(OpCandidates(key, op, *full), lambda l0: l0 != ())
        else:
            oc = _replicated_over_nodes(op, topology, key, mr)
        if oc is None:
            raise PlanError(f"graph input {t.name!r} has no layout that a node-parallel plan "
                            f"allows on {topology.name!r}", op=key,
                            fix="use the full search (nodes='free')")
        out[key] = oc
    for op in graph.ops:
        mr = r.modes[op.name]
        batch = _batch_modes(op, mr, f0)
        if batch:
            oc = _keep(op_candidates(op, graph, topology, mr),
                       lambda l0: l0 in {((b, f0),) for b in batch})
            split_any = True
        else:
            oc = _replicated_over_nodes(op, topology, op.name, mr)
        if oc is None:
            raise PlanError(f"op {op.name!r} has no candidate that a node-parallel plan "
                            f"allows on {topology.name!r}", op=op.name,
                            fix="use the full search (nodes='free')")
        out[op.name] = oc
    if not split_any:
        raise PlanError(f"no batch dimension of the graph divides into the {f0} nodes of "
                        f"{topology.name!r}", fix=f"use a batch that is a multiple of {f0}, "
                                                 "or the full search (nodes='free')")
    return out
