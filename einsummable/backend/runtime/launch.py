"""Where a torchrun rank stands, and whether the launch matches the plan.

torchrun (one agent per node, `--nnodes N --nproc-per-node G`) numbers ranks node by node:
the rank on node n (its GROUP_RANK) with local index l (LOCAL_RANK) is RANK = n * G + l, and
WORLD_SIZE = N * G. A plan's program p runs on rank p, and the plan placed device p on a node
of its topology: the launch matches the plan when N * G is the plan's world size and, where
the plan names its topology (a Plan JSON; a lowered bundle does not), every rank's node and
local index are its device's node and index inside that node, so that the links the plan
priced are the links the ranks talk over. A GPU rank drives GPU LOCAL_RANK of its node, never
GPU RANK (which does not exist past the first node).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ...errors import PlanError
from ...topology import Topology

# What torchrun sets in every rank's environment, by the field each fills.
ENV = {"rank": "RANK", "local_rank": "LOCAL_RANK", "world": "WORLD_SIZE",
       "local_world": "LOCAL_WORLD_SIZE", "node": "GROUP_RANK"}


@dataclass(frozen=True)
class Launch:
    """One rank's place in a torchrun launch."""
    rank: int
    local_rank: int
    world: int
    local_world: int  # ranks per node (--nproc-per-node)
    node: int         # the node's rank (--node-rank)

    @property
    def nnodes(self) -> int:
        return self.world // self.local_world


def from_env(env: Mapping[str, str] | None = None) -> Launch:
    """The rank's Launch from torchrun's environment; a missing or bad variable is a named
    error, not a KeyError."""
    env = os.environ if env is None else env
    missing = [v for v in ENV.values() if v not in env]
    if missing:
        raise PlanError(f"not started by torchrun: {', '.join(missing)} not set",
                        fix="launch with torchrun --nnodes N --nproc-per-node G "
                            "-m einsummable.runtime.dist plan.json")
    try:
        values = {field: int(env[var]) for field, var in ENV.items()}
    except ValueError:
        raise PlanError(f"torchrun's variables are not integers: "
                        f"{ {v: env[v] for v in ENV.values()} }",
                        fix="launch with torchrun, which sets them") from None
    return Launch(**values)


def check_launch(launch: Launch, world_size: int, topology: Topology | None) -> None:
    """Raise PlanError unless the launch runs the plan's programs on the plan's devices (the
    module docstring states the rule)."""
    if launch.world != world_size:
        raise PlanError(
            f"the plan is for {world_size} ranks but torchrun started {launch.world} "
            f"({launch.nnodes} nodes x {launch.local_world} per node)",
            fix=f"--nnodes x --nproc-per-node must be {world_size}"
                + (f": --nnodes {topology.num_nodes} --nproc-per-node "
                   f"{world_size // topology.num_nodes}" if topology is not None else ""))
    if topology is None:
        return
    node = topology.node_of(launch.rank)
    peers = topology.devices_in_node(node)
    nodes = sorted({d.node for d in topology.devices})
    if (nodes.index(node), peers.index(launch.rank)) != (launch.node, launch.local_rank) \
            or len(peers) != launch.local_world:
        raise PlanError(
            f"rank {launch.rank} is rank {launch.local_rank} of {launch.local_world} on node "
            f"{launch.node} of {launch.nnodes}, but the plan put device {launch.rank} in node "
            f"{nodes.index(node)} of {len(nodes)} ({len(peers)} devices) of topology "
            f"'{topology.name}'",
            fix=f"launch --nnodes {len(nodes)} --nproc-per-node {len(peers)}, or plan for the "
                "topology you launch on")
