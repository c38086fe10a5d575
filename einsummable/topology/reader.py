"""Topologies from YAML: a shipped name ("a100x8"), a path, or a parsed mapping.

The document is validated by the pydantic models of `schema.py`, expanded into devices and
links by `expand.py`, and checked as a whole by `checks.py`; every error names the file, the
field path (`links[2].bw`) and what to fix.

YAML schema (see topologies/*.yaml for commented examples)::

    name: str
    source_notes: str                      # where the figures come from
    device_types:                          # named device specs
      NAME: {peak_flops: {float16: 312 TFLOP/s, bfloat16: ..., float32: ...},
             mem_bw: 1555 GB/s, mem_bytes: 40 GB, launch: 5 us,
             message: 40 us,               # optional: host time per point-to-point message
             exchange_wait: 500 us,        # optional: host time lost per two-way exchange wait
             prefetch_stream: true}        # optional: weight prefetch beside the kernels
    nodes: {count: 2, devices_per_node: 8, device_type: NAME, name: "{type}:{local}"}
      # ... or instead an explicit list:
    devices: [{id: 0, node: 0, name: gpu0, type: NAME}, ...]   # or inline spec keys
    links:                                 # rules, applied in order
      - kind: nvswitch | nvlink | pcie | qpi | ib | loopback
        pairs: all | within_node | across_nodes | rails | unlinked | [[a, b], [a, b, lanes]]
        bw: 300 GB/s                       # per direction, per lane (lanes default 1)
        total_bw: ...                      # alternative to bw: the whole link, lanes ignored
        latency: 3 us
        shared: "nic{src_node}.{src_local}"   # optional contended resource (template)
        port: nvlink                       # optional per-device port this link uses ...
        port_bw: 300 GB/s                  # ... and its total rate per direction per device
        oneway: false                      # true: only a->b, not b->a
        replace: false                     # true: override links set by earlier rules
    levels: [{name: node, groups: per_node | per_device | [[0, 1], ...]}, ...]  # optional

Ports. A link may name a per-device port: its bytes then also load the source device's egress
port and the destination device's ingress port of that name, each limited to ``port_bw`` (all
links of one port at one device together). This is how one GPU's NVSwitch/NVLink/NIC bandwidth
is a total, not a per-peer figure: an A100 sends 300 GB/s in all, however many peers it feeds.

Quantities accept unit strings ("300 GB/s", "400 Gb/s", "312 TFLOP/s", "40 GiB", "5 us") or
plain numbers in base units (B/s, FLOP/s, bytes, seconds).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import TopologyError
from .checks import check_structure
from .expand import expand
from .model import Topology
from .schema import parse_document

SHIPPED_DIR: Path = Path(__file__).resolve().parents[2] / "topologies"


def load_topology(name_or_path: str | Path | Topology) -> Topology:
    """A shipped name ("a100x8") or a path to a YAML file."""
    if isinstance(name_or_path, Topology):
        return name_or_path
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or text.endswith(
        (".yaml", ".yml"))
    if looks_like_path:
        path = Path(text)
        origin = text
    else:
        path = SHIPPED_DIR / f"{text}.yaml"
        origin = f"topologies/{text}.yaml"
        if not path.is_file():
            raise TopologyError(f"no shipped topology named {text!r}",
                                fix=f"use one of {', '.join(shipped_topologies())} or a path "
                                "to a YAML file")
    if not path.is_file():
        raise TopologyError(f"{origin}: file not found",
                            fix="check the path, or use a shipped name: "
                            + ", ".join(shipped_topologies()))
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TopologyError(f"{origin}: cannot be read: {e.strerror or e}",
                            fix="check the file's permissions, or use a shipped name") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise TopologyError(f"{origin}: not UTF-8 text (byte 0x{raw[e.start]:02x} on line "
                            f"{line})", fix="save the file as UTF-8; a topology is YAML "
                            "text, not a binary file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(f"{origin}: not valid YAML: {e}",
                            fix="fix the YAML syntax at the marked line") from None
    return read_topology(data, origin)


def shipped_topologies() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml")))


def read_topology(data: Any, origin: str = "<dict>") -> Topology:
    """A topology from a parsed YAML document (or `Topology.to_dict`'s explicit form); every
    error names `origin` and the field path."""
    doc = parse_document(data, origin)
    devices, links, levels = expand(doc, origin)
    # checked here too (not only by Topology itself) so that errors name the file
    check_structure(doc.name, devices, links, levels, where=origin)
    return Topology(doc.name, devices, links, levels, doc.source_notes)
