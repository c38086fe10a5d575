"""The topology YAML of N local CPU ranks (topologies/cpu4.yaml's schema) from measured figures.

`document` gives the topology as a mapping with exact floats (what the fit simulates on);
`render` writes it as the commented YAML file: rank-local figures from `ranks.py`; the link
latency, bandwidth and per-message figures from the dependent-round fit of `rounds.py` where
there is one (two or more ranks), else the independent-batch figures; both sets and every
chain's measured and simulated time in the header, so a reader can compare.

The `achieved:` section (`achieved`) is fitted as `device_yaml.fit_device` fits a device's,
to the kernel calls every rank timed with all ranks running:

    matmul      (FLOPs, rate / peak_flops[dtype]) of every GEMM, binned and pooled (`curve`)
    attention   the same over the causal SDPA calls
    memory      median elementwise and norm rate / mem_bw, at most 1 (mem_bw is the rate of an
                add far above the caches; small blocks in cache may run faster than it)
"""
from __future__ import annotations

import datetime
import os
from typing import Any

import torch

from ...topology import Topology, read_topology
from ...topology.achieved import Achieved
from .device_yaml import curve_yaml, fractions
from .fmt import duration, fraction, si
from .ranks import DTYPES, Measured
from .rounds import ChainTime, LinkFit


def links(m: Measured, fit: LinkFit | None) -> tuple[float, float, float, float]:
    """(latency, message, bw, exchange wait) the topology gets (module docstring)."""
    if fit is None:
        return m.p2p_latency_s, m.message_s, m.p2p_bw, 0.0
    return fit.latency_s, fit.message_s, fit.bw, fit.exchange_wait_s


def achieved(m: Measured) -> Achieved | None:
    """The achieved fractions of the module docstring (None when no kernels were timed)."""
    if not m.kernels:
        return None
    return fractions(m.kernels, m.peak_flops, m.mem_bw, tuple({p.dtype for p in m.kernels}))


def document(m: Measured, latency_s: float, message_s: float, bw: float, wait_s: float,
             name: str) -> dict[str, Any]:
    """The topology as a YAML mapping, figures in base units (exact floats)."""
    return {
        "name": name,
        "device_types": {"cpu": {"peak_flops": dict(m.peak_flops), "mem_bw": m.mem_bw,
                                 "mem_bytes": m.mem_bytes, "launch": m.launch_s,
                                 "message": message_s, "exchange_wait": wait_s,
                                 **_achieved_doc(m)}},
        "nodes": {"count": 1, "devices_per_node": m.world_size, "device_type": "cpu",
                  "name": "rank{id}"},
        "links": [{"kind": "loopback", "pairs": "all", "bw": bw, "latency": latency_s}],
        "levels": [{"name": "rank", "groups": "per_device"}],
    }


def topology(m: Measured, latency_s: float, message_s: float, bw: float,
             wait_s: float = 0.0) -> Topology:
    return read_topology(document(m, latency_s, message_s, bw, wait_s, f"cpu{m.world_size}"),
                         "calibrate")


def _achieved_doc(m: Measured) -> dict[str, Any]:
    a = achieved(m)
    return {} if a is None else {"achieved": a.to_dict()}


def _achieved_yaml(a: Achieved | None) -> str:
    if a is None:
        return ""
    return (f"    achieved:\n"
            f"      matmul: {curve_yaml(a.matmul)}\n"
            f"      attention: {curve_yaml(a.attention)}\n"
            f"      memory: {fraction(a.memory)}\n")


def _body(m: Measured, fit: LinkFit | None, name: str) -> str:
    latency, message, bw, wait = links(m, fit)
    pf = ", ".join(f"{k}: {si(m.peak_flops[k], 'FLOP/s')}" for k in DTYPES)
    how = ("fitted to dependent exchange rounds (see the header)" if fit is not None
           else "independent ping-pong and message batches (one rank: no chains)")
    return (f"name: {name}\n"
            f"source_notes: |\n"
            f"  Measured by `einsummable calibrate` with {m.world_size} gloo ranks at "
            f"{m.threads_per_rank} torch thread(s)\n"
            f"  each, all ranks running at once (the condition the runtime's programs run in).\n"
            f"  Link latency, bandwidth and message: {how}.\n"
            f"device_types:\n"
            f"  cpu:\n"
            f"    peak_flops: {{{pf}}}\n"
            f"    mem_bw: {si(m.mem_bw, 'B/s')}\n"
            f"    mem_bytes: {si(m.mem_bytes, 'B')}\n"
            f"    launch: {duration(m.launch_s)}\n"
            f"    message: {duration(message)}\n"
            f"    exchange_wait: {duration(wait)}\n"
            + _achieved_yaml(achieved(m)) +
            f"nodes: {{count: 1, devices_per_node: {m.world_size}, device_type: cpu, "
            f"name: \"rank{{id}}\"}}\n"
            f"links:\n"
            f"  - {{kind: loopback, pairs: all, bw: {si(bw, 'B/s')}, "
            f"latency: {duration(latency)}}}\n"
            f"levels:\n"
            f"  - {{name: rank, groups: per_device}}\n")


def _chains_header(chains: tuple[ChainTime, ...], fit: LinkFit, trials: int) -> str:
    rows = [(f"#   {'chain':<6} {'hops':>4} {'msgs/hop':>8} {'bytes/hop':>10} "
             f"{'measured':>11} {'IQR/median':>10} {'simulated':>11}")]
    for c, s in zip(chains, fit.simulated_s):
        rows.append(f"#   {c.kind:<6} {c.hops:4d} {c.messages_per_hop:8d} {c.bytes_per_hop:10d} "
                    f"{c.measured_s * 1e3:8.3f} ms {c.spread * 100:9.1f}% "
                    f"{s * 1e3:8.3f} ms")
    bound = (f"; held at a bound: {', '.join(fit.bounded)}" if fit.bounded else "")
    return ("# Link latency, bandwidth, message are FITTED to dependent exchange rounds\n"
            "# and the two-way exchange wait (einsummable/commands/calibrate/rounds.py):\n"
            "# chains of transfers in which each rank's next op reads what it just received\n"
            "# (duplex: both ranks compute, then exchange), run by the dist executor on gloo;\n"
            "# the simulator, on this file, gives each chain its measured median time:\n"
            + "\n".join(rows) + "\n"
            f"# Medians over {trials} trials x every round-robin round, chains interleaved;\n"
            f"# this machine is shared and noisy (spread above); largest fit mismatch "
            f"{fit.max_rel_error * 100:.2f}%{bound}.\n")


def render(m: Measured, chains: tuple[ChainTime, ...], fit: LinkFit | None, name: str,
           command: str, trials: int) -> str:
    """The commented YAML file (module docstring); it is checked to load before it is
    returned."""
    import yaml
    body = _body(m, fit, name)
    read_topology(yaml.safe_load(body), "calibrate")  # the file we write must load
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    head = (f"# {m.world_size} local CPU ranks talking gloo over loopback (tests, the CPU demo).\n"
            f"# MEASURED on this machine ({os.cpu_count()} cores, torch {torch.__version__}) "
            f"at {stamp}\n# by: {command}\n")
    if fit is not None:
        head += _chains_header(chains, fit, trials)
    head += (f"# Independent batches (kept for comparison, not used above): p2p latency "
             f"{duration(m.p2p_latency_s)} (half a 1-element round trip),\n"
             f"# p2p bandwidth {si(m.p2p_bw, 'B/s')}, message {duration(m.message_s)} "
             f"(one more message in a batch).\n")
    return head + body
