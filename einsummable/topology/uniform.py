"""Uniform machines made in code: n devices in equal nodes, every pair linked."""
from __future__ import annotations

import itertools
from typing import Mapping

from ..errors import TopologyError
from .model import Device, Level, Link, Topology

# Synthetic-topology defaults: A100-like figures (see topologies/a100x8.yaml for sources).
SYNTH_PEAK_FLOPS: Mapping[str, float] = {"float16": 312e12, "bfloat16": 312e12,
                                         "float32": 19.5e12}


SYNTH_MEM_BW: float = 1555e9


SYNTH_MEM_BYTES: float = 40e9


SYNTH_LAUNCH_S: float = 5e-6


SYNTH_INTRA_BW: float = 300e9


SYNTH_INTER_BW: float = 25e9


SYNTH_INTRA_LATENCY_S: float = 3e-6


SYNTH_INTER_LATENCY_S: float = 10e-6


def synthetic(n: int, *, nodes: int = 1, intra_bw: float = SYNTH_INTRA_BW,
              inter_bw: float = SYNTH_INTER_BW,
              intra_latency_s: float = SYNTH_INTRA_LATENCY_S,
              inter_latency_s: float = SYNTH_INTER_LATENCY_S,
              peak_flops: Mapping[str, float] | None = None, mem_bw: float = SYNTH_MEM_BW,
              mem_bytes: float = SYNTH_MEM_BYTES, launch_s: float = SYNTH_LAUNCH_S,
              name: str | None = None, message_s: float = 0.0) -> Topology:
    """n devices in ``nodes`` equal nodes, every pair linked: nvswitch inside a node, ib across
    (outbound traffic of a device shares its NIC). Defaults are A100-like; the intra- and
    inter-node rates are per-device totals (ports), as on NVSwitch and rail NICs."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TopologyError(f"synthetic: n: expected an integer >= 1, got {n!r}",
                            fix="pass the world size, e.g. synthetic(4)")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1 or n % nodes:
        raise TopologyError(f"synthetic: nodes: {nodes!r} does not divide n={n}",
                            fix="choose nodes so that every node holds n // nodes devices")
    per = n // nodes
    rates = dict(SYNTH_PEAK_FLOPS if peak_flops is None else peak_flops)
    devs = tuple(Device(i, f"n{i // per}.dev{i % per}" if nodes > 1 else f"dev{i}", i // per,
                        rates, mem_bw, mem_bytes, launch_s, message_s) for i in range(n))
    links = []
    for a, b in itertools.permutations(range(n), 2):
        if a // per == b // per:
            links.append(Link(a, b, intra_bw, intra_latency_s, "nvswitch",
                              port="nvlink", port_bw=intra_bw))
        else:
            links.append(Link(a, b, inter_bw, inter_latency_s, "ib",
                              f"nic{a // per}.{a % per}", port="nic", port_bw=inter_bw))
    levels = ((Level("node", tuple(tuple(range(k * per, (k + 1) * per))
                                   for k in range(nodes))),) if nodes > 1 else ())
    levels += (Level("gpu", tuple((i,) for i in range(n))),)
    return Topology(name or (f"synthetic{n}" if nodes == 1 else f"synthetic{n}x{nodes}"),
                    devs, tuple(links), levels, "synthetic: A100-like defaults, not a machine")

