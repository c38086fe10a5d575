"""The machine: devices, links, levels and routes, read from YAML or made in code.

    load_topology("a100x8")          # a shipped file, or a path to one
    synthetic(8, nodes=2)            # a uniform machine made in code
"""
from .model import ROUTE_REFERENCE_BYTES, Device, Level, Link, Topology
from .reader import SHIPPED_DIR, load_topology, read_topology, shipped_topologies
from .routing import bisection_bw
from .uniform import synthetic
from .units import DTYPES, LINK_KINDS, canonical_dtype, parse_quantity
from .writer import to_yaml

__all__ = ["DTYPES", "LINK_KINDS", "ROUTE_REFERENCE_BYTES", "SHIPPED_DIR", "Device", "Level",
           "Link", "Topology", "bisection_bw", "canonical_dtype", "load_topology",
           "parse_quantity", "read_topology", "shipped_topologies", "synthetic", "to_yaml"]
