"""A validated document (`schema.Document`) expanded into devices, directed links and levels:
device names from templates, pair selectors, lanes, shared-resource templates, `replace` and
`oneway`, per_node / per_device groups. Every error names the origin and the field path."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import TopologyError
from .model import Device, Level, Link
from .schema import (PAIR_SELECTORS, DeviceSpec, Document, ExplicitDevice, LinkRule,
                     Nodes)

SHARED_TEMPLATE_VARS: tuple[str, ...] = (
    "src", "dst", "src_node", "dst_node", "src_local", "dst_local")


DEVICE_NAME_VARS: tuple[str, ...] = ("id", "node", "local", "type")


# (device pair, lanes), and the field path to blame for a problem with that pair
_Pair = tuple[tuple[int, int, int], str]


def expand(doc: Document, origin: str) -> tuple[tuple[Device, ...], tuple[Link, ...],
                                                 tuple[Level, ...]]:
    """The devices, links (sorted by (src, dst)) and levels the document describes."""
    ex = _Expander(origin)
    if doc.nodes is not None:
        devices = ex.uniform_devices(doc.nodes, doc.device_types)
    else:
        devices = ex.explicit_devices(doc.devices or [], doc.device_types)
    return devices, ex.links(doc.links, devices), _levels(doc, devices)


class _Expander:
    """The expansion steps, with the origin their errors name."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, path: str, msg: str, fix: str) -> NoReturn:
        raise TopologyError(f"{self.origin}: {path}: {msg}", fix=fix)

    def device_type(self, name: str, path: str, types: dict[str, DeviceSpec]) -> DeviceSpec:
        if name not in types:
            self.fail(path, f"unknown device type {name!r}",
                      f"declare it under device_types (known: {sorted(types) or 'none'})")
        return types[name]

    def template(self, tpl: str, path: str, allowed: tuple[str, ...], **values: Any) -> str:
        try:
            return tpl.format(**values)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
            self.fail(path, f"bad template {tpl!r} ({e!s})",
                      f"use only {{{'}, {'.join(allowed)}}} placeholders")

    # -- devices --
    def uniform_devices(self, nodes: Nodes, types: dict[str, DeviceSpec]
                        ) -> tuple[Device, ...]:
        spec = self.device_type(nodes.device_type, "nodes.device_type", types).device_args()
        default = "n{node}.{type}:{local}" if nodes.count > 1 else "{type}:{local}"
        tpl = default if nodes.name is None else nodes.name
        per = nodes.devices_per_node
        return tuple(
            Device(node * per + local, self.template(
                tpl, "nodes.name", DEVICE_NAME_VARS, id=node * per + local, node=node,
                local=local, type=nodes.device_type), node, **spec)
            for node, local in itertools.product(range(nodes.count), range(per)))

    def explicit_devices(self, listed: list[ExplicitDevice], types: dict[str, DeviceSpec]
                         ) -> tuple[Device, ...]:
        out = []
        seen: dict[int, int] = {}
        for i, e in enumerate(listed):
            if e.id in seen:
                self.fail(f"devices[{i}].id", f"duplicate device id {e.id} (also "
                          f"devices[{seen[e.id]}])", "give every device a distinct id")
            seen[e.id] = i
            spec = e.spec() if e.type is None else self.device_type(e.type, f"devices[{i}].type",
                                                                    types)
            name = f"dev{e.id}" if e.name is None else e.name
            out.append(Device(e.id, name, e.node, **spec.device_args()))
        gaps = sorted(set(range(len(out))) - set(seen))
        if gaps:
            self.fail(f"devices[{seen[max(seen)]}].id", f"device ids must be 0..{len(out)-1} "
                      f"(ranks), but {gaps[0]} is missing", "number the devices 0..n-1")
        return tuple(sorted(out, key=lambda d: d.id))

    # -- links --
    def links(self, rules: list[LinkRule], devices: tuple[Device, ...]) -> tuple[Link, ...]:
        """Rules apply in order; a later rule may override a pair only with replace: true."""
        local = _local_indices(devices)
        made: dict[tuple[int, int], tuple[Link, int]] = {}  # (src, dst) -> (link, rule index)
        for ri, rule in enumerate(rules):
            p = f"links[{ri}]"
            for (a, b, lanes), where in self.pairs(rule, p, devices, local, made):
                for s, t in ((a, b),) if rule.oneway else ((a, b), (b, a)):
                    shared = None if rule.shared is None else self.template(
                        rule.shared, f"{p}.shared", SHARED_TEMPLATE_VARS, src=s, dst=t,
                        src_node=devices[s].node, dst_node=devices[t].node,
                        src_local=local[s], dst_local=local[t])
                    if (s, t) in made and not rule.replace:
                        self.fail(where, f"device pair {s}->{t} already has a link from "
                                  f"links[{made[(s, t)][1]}]", "set replace: true on this rule "
                                  "to override it, or drop the pair")
                    bw = rule.total_bw if rule.bw is None else rule.bw * lanes  # bw is per lane
                    made[(s, t)] = (Link(s, t, bw, rule.latency, rule.kind, shared, lanes,
                                         rule.port, rule.port_bw), ri)
        return tuple(link for _, (link, _) in sorted(made.items()))

    def pairs(self, rule: LinkRule, p: str, devices: tuple[Device, ...],
              local: dict[int, int], made: dict) -> list[_Pair]:
        """The rule's (a, b, lanes) pairs, a < b for selectors, each with its field path."""
        n = len(devices)
        if rule.pairs is None:
            listed = [((rule.src, rule.dst, None), (f"{p}.src", f"{p}.dst"), p)]
        elif isinstance(rule.pairs, str):
            keep = _selector(rule.pairs, devices, local, made)
            return [((a, b, rule.lanes), f"{p}.pairs")
                    for a, b in itertools.combinations(range(n), 2) if keep(a, b)]
        else:
            listed = [(pr, (f"{p}.pairs[{i}]",) * 2, f"{p}.pairs[{i}]")
                      for i, pr in enumerate(rule.pairs)]
        out = []
        for (a, b, lanes), ends, where in listed:
            for d, end in zip((a, b), ends):
                if d >= n:
                    self.fail(end, f"device {d} does not exist (devices are 0..{n-1})",
                              "link only declared devices")
            out.append(((a, b, rule.lanes if lanes is None else lanes), where))
        return out


def _selector(name: str, devices: tuple[Device, ...], local: dict[int, int],
              made: dict) -> Callable[[int, int], bool]:
    """Which pairs a selector takes ("unlinked": no link either way from earlier rules)."""
    node = lambda d: devices[d].node
    chosen: dict[str, Callable[[int, int], bool]] = {
        "all": lambda a, b: True,
        "within_node": lambda a, b: node(a) == node(b),
        "across_nodes": lambda a, b: node(a) != node(b),
        "rails": lambda a, b: node(a) != node(b) and local[a] == local[b],
        "unlinked": lambda a, b: (a, b) not in made and (b, a) not in made,
    }
    assert set(chosen) == set(PAIR_SELECTORS)  # the schema admits exactly these
    return chosen[name]


def _local_indices(devices: tuple[Device, ...]) -> dict[int, int]:
    """Device -> its index within its node, in device order."""
    per: dict[int, list[int]] = {}
    for d in devices:
        per.setdefault(d.node, []).append(d.id)
    return {d: i for ids in per.values() for i, d in enumerate(ids)}


def _levels(doc: Document, devices: tuple[Device, ...]) -> tuple[Level, ...]:
    nodes = sorted({d.node for d in devices})
    named = {"per_node": tuple(tuple(d.id for d in devices if d.node == k) for k in nodes),
             "per_device": tuple((d.id,) for d in devices)}
    if doc.levels is None:  # default: a node level only when there is more than one node
        node = [Level("node", named["per_node"])] if len(nodes) > 1 else []
        return tuple(node + [Level("gpu", named["per_device"])])
    return tuple(Level(lv.name, named[lv.groups] if isinstance(lv.groups, str) else lv.groups)
                 for lv in doc.levels)
