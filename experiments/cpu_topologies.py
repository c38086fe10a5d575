"""The CPU topology a measured config runs its gloo ranks on, by world size."""
from __future__ import annotations

from einsummable.errors import EinsummableError
from einsummable.topology import SHIPPED_DIR, Topology, load_topology, read_topology


def cpu_topology(name: str, world: int, by_world: dict | None = None) -> Topology:
    """The topology a config names for `world` ranks (`topology_by_world`, e.g. the
    calibrated cpu2), else the shipped CPU topology `name` resized to `world` ranks (same
    per-rank figures)."""
    if by_world and world in by_world:
        topo = load_topology(by_world[world])
        if topo.world_size != world:
            raise EinsummableError(f"topology_by_world names {by_world[world]!r} for {world} "
                                   f"ranks, but it has {topo.world_size}",
                                   fix="name a topology of that many devices")
        return topo
    import yaml
    data = yaml.safe_load((SHIPPED_DIR / f"{name}.yaml").read_text())
    data["nodes"] = {**data["nodes"], "devices_per_node": world}
    data["name"] = f"{name}@{world}"
    return read_topology(data, f"{name} resized to {world}")
