"""Structural validation of a topology's devices, links and levels, however it was made (YAML
or code): every error names the field path and says what to fix."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import networkx as nx

from ..errors import TopologyError
from .routing import first_unreachable, link_graph
from .units import DTYPES, LINK_KINDS


def check_structure(name: Any, devices: tuple, links: tuple, levels: tuple,
                    where: str) -> nx.DiGraph:
    """Raise TopologyError (prefixed by ``where``) at the first broken field; return the link
    graph (`routing.link_graph`), which the checks build anyway, for the topology to keep."""
    def fail(path: str, msg: str, fix: str) -> None:
        raise TopologyError(f"{where}: {path}: {msg}", fix=fix)

    if not isinstance(name, str) or not name:
        fail("name", f"expected a non-empty string, got {name!r}", "give the topology a name")
    if not devices:
        fail("devices", "no devices", "declare at least one device (nodes: or devices:)")
    first: dict[int, int] = {}
    for i, d in enumerate(devices):
        if d.id in first:
            fail(f"devices[{i}].id", f"duplicate device id {d.id} (also devices[{first[d.id]}])",
                 "give every device a distinct id")
        first[d.id] = i
    for i, d in enumerate(devices):
        if d.id != i:
            fail(f"devices[{i}].id", f"expected {i}, got {d.id!r}",
                 "device ids are ranks: list them as 0..n-1 in order")
        missing = [k for k in DTYPES if k not in d.peak_flops]
        if missing:
            fail(f"devices[{i}].peak_flops", f"missing rate for {missing[0]!r}",
                 f"give a rate for each of {', '.join(DTYPES)}")
        for k, v in d.peak_flops.items():
            if k not in DTYPES:
                fail(f"devices[{i}].peak_flops.{k}", "unknown dtype",
                     f"use only {', '.join(DTYPES)}")
            _check_pos(v, f"devices[{i}].peak_flops.{k}", "FLOP/s", fail)
        _check_pos(d.mem_bw, f"devices[{i}].mem_bw", "bytes/s", fail)
        _check_pos(d.mem_bytes, f"devices[{i}].mem_bytes", "bytes", fail)
        _check_nonneg(d.launch_s, f"devices[{i}].launch", "seconds", fail)
        _check_nonneg(d.message_s, f"devices[{i}].message", "seconds", fail)
        _check_nonneg(d.exchange_wait_s, f"devices[{i}].exchange_wait", "seconds", fail)
    n = len(devices)
    pairs: dict[tuple[int, int], int] = {}
    for i, l in enumerate(links):
        for end in ("src", "dst"):
            v = getattr(l, end)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                fail(f"links[{i}].{end}", f"device {v!r} does not exist (devices are 0..{n-1})",
                     "link only declared devices")
        if l.src == l.dst:
            fail(f"links[{i}]", f"links device {l.src} to itself",
                 "drop it: a device needs no link to itself")
        if (l.src, l.dst) in pairs:
            fail(f"links[{i}]", f"second link {l.src}->{l.dst} (first is links"
                 f"[{pairs[(l.src, l.dst)]}])", "keep one link per direction and pair")
        pairs[(l.src, l.dst)] = i
        _check_pos(l.bw, f"links[{i}].bw", "bytes/s", fail)
        _check_nonneg(l.latency_s, f"links[{i}].latency", "seconds", fail)
        if l.kind not in LINK_KINDS:
            fail(f"links[{i}].kind", f"unknown link kind {l.kind!r}",
                 f"use one of {', '.join(LINK_KINDS)}")
        if (l.port is None) != (l.port_bw is None):
            fail(f"links[{i}].port_bw", "port and port_bw go together",
                 "give both (a per-device port and its rate) or neither")
        if l.port_bw is not None:
            _check_pos(l.port_bw, f"links[{i}].port_bw", "bytes/s", fail)
        if isinstance(l.lanes, bool) or not isinstance(l.lanes, int) or l.lanes < 1:
            fail(f"links[{i}].lanes", f"expected a positive integer, got {l.lanes!r}",
                 "lanes counts parallel physical links, at least 1")
    _check_levels(levels, n, fail)
    graph = link_graph(n, links)
    cut = first_unreachable(graph)
    if cut is not None:
        fail("links", f"device {cut[0]} cannot reach device {cut[1]} over any chain of links",
             "add a link rule that connects them (e.g. a pcie or qpi fallback)")
    return graph


def _check_pos(v: Any, path: str, unit: str, fail: Callable) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
        fail(path, f"expected a positive number ({unit}), got {v!r}",
             f"write a positive finite value in {unit} (or with a unit, e.g. as in shipped "
             "topologies)")


def _check_nonneg(v: Any, path: str, unit: str, fail: Callable) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isinf(v):
        fail(path, f"expected a non-negative number ({unit}), got {v!r}",
             f"write a value >= 0 in {unit}")


def _check_levels(levels: tuple, n: int, fail: Callable) -> None:
    if not levels:
        fail("levels", "no levels", "give at least one level, e.g. one group per device")
    everyone = set(range(n))
    prev_group: dict[int, int] | None = None
    names: set[str] = set()
    for li, lv in enumerate(levels):
        if not isinstance(lv.name, str) or not lv.name or lv.name in names:
            fail(f"levels[{li}].name", f"expected a unique non-empty name, got {lv.name!r}",
                 "name each level once (e.g. node, gpu)")
        names.add(lv.name)
        owner: dict[int, int] = {}
        for gi, g in enumerate(lv.groups):
            if not g:
                fail(f"levels[{li}].groups[{gi}]", "empty group", "drop empty groups")
            for d in g:
                if d not in everyone:
                    fail(f"levels[{li}].groups[{gi}]", f"device {d!r} does not exist "
                         f"(devices are 0..{n-1})", "list only declared devices")
                if d in owner:
                    fail(f"levels[{li}].groups[{gi}]", f"device {d} is also in group "
                         f"{owner[d]}: groups must partition the devices",
                         "put every device in exactly one group of each level")
                owner[d] = gi
        if set(owner) != everyone:
            lost = sorted(everyone - set(owner))
            fail(f"levels[{li}].groups", f"devices {lost} are in no group: groups must "
                 "partition the devices", "put every device in exactly one group of each level")
        if prev_group is not None:
            for gi, g in enumerate(lv.groups):
                parents = {prev_group[d] for d in g}
                if len(parents) > 1:
                    fail(f"levels[{li}].groups[{gi}]", f"spans groups {sorted(parents)} of "
                         f"levels[{li-1}]: each level must refine the one above",
                         "split finer levels inside the coarser groups")
        prev_group = owner
    if any(len(g) != 1 for g in levels[-1].groups):
        fail(f"levels[{len(levels)-1}].groups", "the last (fastest) level must hold one "
             "device per group", "end the hierarchy with a per-device level (e.g. gpu)")
