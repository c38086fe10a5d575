"""A topology as YAML: the explicit form (every device and directed link spelled out), which
`reader.read_topology` loads back to an equal topology."""
from __future__ import annotations

from typing import Any

import yaml

_FLOW_DICT_MAX_KEYS: int = 4  # peak_flops-sized mappings print on one line


class _FlowDumper(yaml.SafeDumper):
    """Block style at the top, flow style for small leaf mappings and lists (readable)."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(x, dict) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _is_flat(v: Any) -> bool:
    """A scalar, a list of scalars or of lists of scalars, or a small mapping of scalars."""
    if isinstance(v, dict):
        return len(v) <= _FLOW_DICT_MAX_KEYS and all(not isinstance(x, (dict, list))
                                                     for x in v.values())
    if isinstance(v, list):
        return all(not isinstance(x, (dict, list)) or
                   (isinstance(x, list) and all(not isinstance(y, (dict, list)) for y in x))
                   for x in v)
    return True


def _represent_dict(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    flow = all(_is_flat(v) for v in data.values()) and not any(
        isinstance(v, str) and "\n" in v for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)



_FlowDumper.add_representer(list, _represent_list)
_FlowDumper.add_representer(dict, _represent_dict)
_FlowDumper.add_representer(str, _represent_str)


def to_yaml(topology) -> str:
    return yaml.dump(topology.to_dict(), Dumper=_FlowDumper, sort_keys=False, width=100)
