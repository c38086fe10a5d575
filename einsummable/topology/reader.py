"""Topologies from YAML: a shipped name ("a100x8"), a path, or a parsed mapping.

YAML schema (see topologies/*.yaml for commented examples)::

    name: str
    source_notes: str                      # where the figures come from
    device_types:                          # named device specs
      NAME: {peak_flops: {float16: 312 TFLOP/s, bfloat16: ..., float32: ...},
             mem_bw: 1555 GB/s, mem_bytes: 40 GB, launch: 5 us}
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

import itertools
import math
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import TopologyError
from .checks import check_structure
from .model import Device, Level, Link, Topology
from .units import _KINDS, DTYPES, LINK_KINDS, parse_quantity

PAIR_SELECTORS: tuple[str, ...] = ("all", "within_node", "across_nodes", "rails", "unlinked")


SHARED_TEMPLATE_VARS: tuple[str, ...] = (
    "src", "dst", "src_node", "dst_node", "src_local", "dst_local")


DEVICE_NAME_VARS: tuple[str, ...] = ("id", "node", "local", "type")


SHIPPED_DIR: Path = Path(__file__).resolve().parents[2] / "topologies"


_TOP_KEYS = ("name", "source_notes", "device_types", "nodes", "devices", "links", "levels")


_SPEC_KEYS = ("peak_flops", "mem_bw", "mem_bytes", "launch", "message")


_NODES_KEYS = ("count", "devices_per_node", "device_type", "name")


_DEVICE_KEYS = ("id", "name", "node", "type") + _SPEC_KEYS


_RULE_KEYS = ("kind", "pairs", "src", "dst", "bw", "total_bw", "latency", "shared", "lanes",
              "oneway", "replace", "port", "port_bw")


_LEVEL_KEYS = ("name", "groups")


class _Builder:
    """Turns a parsed YAML document into a Topology; every error names its field path."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, path: str, msg: str, fix: str) -> None:
        raise TopologyError(f"{self.origin}: {path}: {msg}", fix=fix)

    # -- small typed readers --
    def mapping(self, v: Any, path: str, keys: tuple[str, ...]) -> dict:
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {type(v).__name__} {v!r}",
                      f"write a mapping with keys {', '.join(keys)}")
        for k in v:
            if k not in keys:
                self.fail(f"{path}.{k}" if path else str(k), "unknown key",
                          f"allowed keys here: {', '.join(keys)}")
        return v

    def require(self, d: dict, key: str, path: str) -> Any:
        if key not in d:
            self.fail(f"{path}.{key}" if path else key, "missing", f"add '{key}:'")
        return d[key]

    def qty(self, v: Any, path: str, kind: str, *, positive: bool = True) -> float:
        try:
            x = parse_quantity(v, kind)
        except ValueError as e:
            self.fail(path, str(e), f"write e.g. {_KINDS[kind][1]}")
        ok = (x > 0 if positive else x >= 0) and math.isfinite(x)
        if not ok:
            what = "positive" if positive else "non-negative"
            self.fail(path, f"expected a {what} {_KINDS[kind][0]} ({_KINDS[kind][2]}), "
                      f"got {v!r}", f"write a {what} value, e.g. {_KINDS[kind][1]}")
        return x

    def integer(self, v: Any, path: str, *, minimum: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(path, f"expected an integer >= {minimum}, got {v!r}",
                      f"write a whole number >= {minimum}")
        return v

    def text(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not v:
            self.fail(path, f"expected a non-empty string, got {v!r}", "write some text")
        return v

    def boolean(self, v: Any, path: str) -> bool:
        if not isinstance(v, bool):
            self.fail(path, f"expected true or false, got {v!r}", "write true or false")
        return v

    # -- sections --
    def build(self, data: Any) -> Topology:
        top = self.mapping(data, "", _TOP_KEYS)
        name = self.text(self.require(top, "name", ""), "name")
        notes = top.get("source_notes", "")
        if not isinstance(notes, str):
            self.fail("source_notes", f"expected a string, got {notes!r}", "write text")
        types = self.device_types(top.get("device_types", {}))
        devices = self.devices(top, types)
        links = self.links(self.require(top, "links", ""), devices)
        levels = self.levels(top.get("levels"), devices)
        check_structure(name, devices, links, levels, where=self.origin)
        return Topology(name, devices, links, levels, notes)

    def spec(self, d: dict, path: str) -> dict:
        pf = self.require(d, "peak_flops", path)
        pf = self.mapping(pf, f"{path}.peak_flops", DTYPES)
        for k in DTYPES:
            if k not in pf:
                self.fail(f"{path}.peak_flops", f"missing rate for {k!r}",
                          f"give a rate for each of {', '.join(DTYPES)}, e.g. "
                          f"{k}: 100 TFLOP/s")
        return {"peak_flops": {k: self.qty(pf[k], f"{path}.peak_flops.{k}", "flops")
                               for k in DTYPES},
                "mem_bw": self.qty(self.require(d, "mem_bw", path), f"{path}.mem_bw",
                                   "bandwidth"),
                "mem_bytes": self.qty(self.require(d, "mem_bytes", path), f"{path}.mem_bytes",
                                      "bytes"),
                "launch_s": self.qty(self.require(d, "launch", path), f"{path}.launch", "time",
                                     positive=False),
                "message_s": self.qty(d.get("message", 0), f"{path}.message", "time",
                                      positive=False)}

    def device_types(self, v: Any) -> dict[str, dict]:
        if not isinstance(v, dict):
            self.fail("device_types", f"expected a mapping of name -> spec, got {v!r}",
                      "write device_types: {NAME: {peak_flops: ..., mem_bw: ..., ...}}")
        return {str(k): self.spec(self.mapping(s, f"device_types.{k}", _SPEC_KEYS),
                                  f"device_types.{k}") for k, s in v.items()}

    def type_ref(self, t: Any, path: str, types: dict[str, dict]) -> dict:
        if t not in types:
            self.fail(path, f"unknown device type {t!r}",
                      f"declare it under device_types (known: {sorted(types) or 'none'})")
        return types[t]

    def devices(self, top: dict, types: dict[str, dict]) -> tuple[Device, ...]:
        if ("nodes" in top) == ("devices" in top):
            self.fail("nodes", "give exactly one of 'nodes' (compact) or 'devices' (explicit)",
                      "use nodes: {count, devices_per_node, device_type} for uniform machines")
        if "nodes" in top:
            nd = self.mapping(top["nodes"], "nodes", _NODES_KEYS)
            count = self.integer(nd.get("count", 1), "nodes.count", minimum=1)
            per = self.integer(self.require(nd, "devices_per_node", "nodes"),
                               "nodes.devices_per_node", minimum=1)
            tname = self.require(nd, "device_type", "nodes")
            spec = self.type_ref(tname, "nodes.device_type", types)
            default_tpl = "n{node}.{type}:{local}" if count > 1 else "{type}:{local}"
            tpl = nd.get("name", default_tpl)
            out = []
            for node, local in itertools.product(range(count), range(per)):
                i = node * per + local
                label = self.template(tpl, "nodes.name", DEVICE_NAME_VARS,
                                      id=i, node=node, local=local, type=tname)
                out.append(Device(i, label, node, **spec))
            return tuple(out)
        lst = top["devices"]
        if not isinstance(lst, list) or not lst:
            self.fail("devices", f"expected a non-empty list, got {lst!r}",
                      "list the devices as {id, node, name, type}")
        out = []
        seen: dict[int, int] = {}
        for i, e in enumerate(lst):
            p = f"devices[{i}]"
            e = self.mapping(e, p, _DEVICE_KEYS)
            did = self.integer(self.require(e, "id", p), f"{p}.id", minimum=0)
            if did in seen:
                self.fail(f"{p}.id", f"duplicate device id {did} (also devices[{seen[did]}])",
                          "give every device a distinct id")
            seen[did] = i
            node = self.integer(e.get("node", 0), f"{p}.node", minimum=0)
            if "type" in e:
                extra = [k for k in _SPEC_KEYS if k in e]
                if extra:
                    self.fail(f"{p}.{extra[0]}", "given together with 'type'",
                              "either reference a device type or spell the spec inline")
                spec = self.type_ref(e["type"], f"{p}.type", types)
            else:
                spec = self.spec(e, p)
            label = e.get("name", f"dev{did}")
            out.append(Device(did, self.text(label, f"{p}.name"), node, **spec))
        gaps = sorted(set(range(len(out))) - set(seen))
        if gaps:
            self.fail(f"devices[{seen[max(seen)]}].id", f"device ids must be 0..{len(out)-1} "
                      f"(ranks), but {gaps[0]} is missing", "number the devices 0..n-1")
        return tuple(sorted(out, key=lambda d: d.id))

    def template(self, tpl: Any, path: str, allowed: tuple[str, ...], **values: Any) -> str:
        if not isinstance(tpl, str):
            self.fail(path, f"expected a string, got {tpl!r}", "write a string")
        try:
            return tpl.format(**values)
        except (KeyError, IndexError, ValueError) as e:
            self.fail(path, f"bad template {tpl!r} ({e!s})",
                      f"use only {{{'}, {'.join(allowed)}}} placeholders")
        raise AssertionError("unreachable")

    def links(self, rules: Any, devices: tuple[Device, ...]) -> tuple[Link, ...]:
        if not isinstance(rules, list):
            self.fail("links", f"expected a list of link rules, got {rules!r}",
                      "write links: [{kind, pairs, bw, latency}, ...]")
        per: dict[int, list[int]] = {}
        for d in devices:
            per.setdefault(d.node, []).append(d.id)
        local = {d: idx for ids in per.values() for idx, d in enumerate(ids)}
        made: dict[tuple[int, int], tuple[Link, int]] = {}
        for ri, rule in enumerate(rules):
            p = f"links[{ri}]"
            r = self.mapping(rule, p, _RULE_KEYS)
            kind = self.require(r, "kind", p)
            if kind not in LINK_KINDS:
                self.fail(f"{p}.kind", f"unknown link kind {kind!r}",
                          f"use one of {', '.join(LINK_KINDS)}")
            if ("bw" in r) == ("total_bw" in r):
                self.fail(f"{p}.bw", "give exactly one of bw (per lane) or total_bw",
                          "write bw: 25 GB/s (per direction, per lane)")
            per_lane = "bw" in r
            bw = self.qty(r["bw"] if per_lane else r["total_bw"],
                          f"{p}.{'bw' if per_lane else 'total_bw'}", "bandwidth")
            lat = self.qty(self.require(r, "latency", p), f"{p}.latency", "time",
                           positive=False)
            default_lanes = self.integer(r.get("lanes", 1), f"{p}.lanes", minimum=1)
            oneway = self.boolean(r.get("oneway", False), f"{p}.oneway")
            replace = self.boolean(r.get("replace", False), f"{p}.replace")
            shared_tpl = r.get("shared")
            if ("port" in r) != ("port_bw" in r):
                self.fail(f"{p}.{'port_bw' if 'port' in r else 'port'}",
                          "give port and port_bw together",
                          "write port: nvlink, port_bw: 300 GB/s (per device, per direction)")
            port = self.text(r["port"], f"{p}.port") if "port" in r else None
            port_bw = self.qty(r["port_bw"], f"{p}.port_bw", "bandwidth") if port else None
            pairs = self.pairs(r, p, devices, local, made, default_lanes)
            for (a, b, lanes), pp in pairs:
                for s, t in ((a, b),) if oneway else ((a, b), (b, a)):
                    shared = None if shared_tpl is None else self.template(
                        shared_tpl, f"{p}.shared", SHARED_TEMPLATE_VARS, src=s, dst=t,
                        src_node=devices[s].node, dst_node=devices[t].node,
                        src_local=local[s], dst_local=local[t])
                    if (s, t) in made and not replace:
                        self.fail(pp, f"device pair {s}->{t} already has a link from "
                                  f"links[{made[(s, t)][1]}]",
                                  "set replace: true on this rule to override it, or drop "
                                  "the pair")
                    total = bw * lanes if per_lane else bw
                    made[(s, t)] = (Link(s, t, total, lat, kind, shared, lanes, port, port_bw),
                                    ri)
        return tuple(l for _, (l, _) in sorted(made.items()))

    def pairs(self, r: dict, p: str, devices: tuple[Device, ...], local: dict[int, int],
              made: dict, default_lanes: int) -> list[tuple[tuple[int, int, int], str]]:
        n = len(devices)
        has_pairs, has_sd = "pairs" in r, ("src" in r or "dst" in r)
        if has_pairs == has_sd:
            self.fail(f"{p}.pairs", "give exactly one of 'pairs' or 'src'/'dst'",
                      f"write pairs: [[0, 1], ...] or one of {', '.join(PAIR_SELECTORS)}")
        if has_sd:
            sel: Any = [[self.require(r, "src", p), self.require(r, "dst", p)]]
        else:
            sel = r["pairs"]
        everything = [(a, b) for a in range(n) for b in range(a + 1, n)]
        node, loc = (lambda d: devices[d].node), (lambda d: local[d])
        chosen: dict[str, Callable[[int, int], bool]] = {
            "all": lambda a, b: True,
            "within_node": lambda a, b: node(a) == node(b),
            "across_nodes": lambda a, b: node(a) != node(b),
            "rails": lambda a, b: node(a) != node(b) and loc(a) == loc(b),
            "unlinked": lambda a, b: (a, b) not in made and (b, a) not in made,
        }
        if isinstance(sel, str):
            if sel not in chosen:
                self.fail(f"{p}.pairs", f"unknown pair selector {sel!r}",
                          f"use a list of [a, b] pairs or one of {', '.join(PAIR_SELECTORS)}")
            keep = chosen[sel]
            return [((a, b, default_lanes), f"{p}.pairs") for a, b in everything if keep(a, b)]
        if not isinstance(sel, list) or not sel:
            self.fail(f"{p}.pairs", f"expected a non-empty list of [a, b] or [a, b, lanes], "
                      f"got {sel!r}", f"or use one of {', '.join(PAIR_SELECTORS)}")
        out = []
        for pi, pr in enumerate(sel):
            pp = f"{p}.pairs[{pi}]" if has_pairs else p
            if not isinstance(pr, list) or len(pr) not in (2, 3):
                self.fail(pp, f"expected [a, b] or [a, b, lanes], got {pr!r}",
                          "write a pair of device ids, optionally with a lane count")
            for d in pr[:2]:
                if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < n:
                    self.fail(pp, f"device {d!r} does not exist (devices are 0..{n-1})",
                              "link only declared devices")
            if pr[0] == pr[1]:
                self.fail(pp, f"links device {pr[0]} to itself",
                          "drop it: a device needs no link to itself")
            lanes = self.integer(pr[2], f"{pp}[2]", minimum=1) if len(pr) == 3 else default_lanes
            out.append(((pr[0], pr[1], lanes), pp))
        return out

    def levels(self, v: Any, devices: tuple[Device, ...]) -> tuple[Level, ...]:
        nodes = sorted({d.node for d in devices})
        per_node = tuple(tuple(d.id for d in devices if d.node == k) for k in nodes)
        per_device = tuple((d.id,) for d in devices)
        if v is None:  # default: node level only when there is more than one node
            lv = [Level("gpu", per_device)]
            return tuple(([Level("node", per_node)] if len(nodes) > 1 else []) + lv)
        if not isinstance(v, list) or not v:
            self.fail("levels", f"expected a non-empty list, got {v!r}",
                      "write levels: [{name: node, groups: per_node}, {name: gpu, groups: "
                      "per_device}]")
        out = []
        for li, e in enumerate(v):
            p = f"levels[{li}]"
            e = self.mapping(e, p, _LEVEL_KEYS)
            name = self.text(self.require(e, "name", p), f"{p}.name")
            g = self.require(e, "groups", p)
            if g == "per_node":
                groups = per_node
            elif g == "per_device":
                groups = per_device
            elif isinstance(g, list) and all(isinstance(x, list) for x in g):
                groups = tuple(tuple(x) for x in g)
            else:
                self.fail(f"{p}.groups", f"expected per_node, per_device or a list of device "
                          f"lists, got {g!r}", "write groups: [[0, 1], [2, 3]]")
            out.append(Level(name, groups))
        return tuple(out)


def load_topology(name_or_path: "str | Path | Topology") -> Topology:
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
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TopologyError(f"{origin}: not valid YAML: {e}",
                            fix="fix the YAML syntax at the marked line") from None
    return read_topology(data, origin)


def shipped_topologies() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml")))



def read_topology(data: Any, origin: str = "<dict>") -> Topology:
    """A topology from a parsed YAML document (or `Topology.to_dict`'s explicit form); every
    error names `origin` and the field path."""
    return _Builder(origin).build(data)
