"""Topology: shipped YAMLs, routes, round trips, validation messages, units."""
from __future__ import annotations

import math
import pickle
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from einsummable.errors import EinsummableError, TopologyError
from einsummable.topology import (
    DTYPES, ROUTE_REFERENCE_BYTES, Device, Level, Link, Topology, bisection_bw, canonical_dtype,
    load_topology, parse_quantity, read_topology, shipped_topologies, synthetic, to_yaml)
from einsummable.topology.routing import link_graph, shortest_routes

GB = 1e9
SHIPPED = ("a100x8", "dgx1-v100", "pcie4-numa", "h100x8x2", "cpu4")
WORLD = {"a100x8": 8, "dgx1-v100": 8, "pcie4-numa": 4, "h100x8x2": 16, "cpu4": 4}
# The DGX-1V NVLink lane matrix (nvidia-smi topo -m): pair -> lanes.
DGX1_LANES = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
              (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
              (5, 7): 1, (6, 7): 2}
NVLINK2_LANE_BW = 25 * GB
LANES_PER_V100 = 6


# ---- shipped topologies ----

def test_all_shipped_load_with_right_world_sizes():
    assert set(SHIPPED) <= set(shipped_topologies())
    for name in SHIPPED:
        t = load_topology(name)
        assert t.world_size == WORLD[name]
        assert t.name == name
        assert t.source_notes.strip()
        for a in range(t.world_size):
            for b in range(t.world_size):
                if a != b:
                    assert t.transfer_time(a, b, 1e6) > 0
                    assert t.route(a, b)[0].src == a and t.route(a, b)[-1].dst == b


def test_load_by_path_and_passthrough(tmp_path):
    src = Path(__file__).resolve().parent.parent / "topologies" / "a100x8.yaml"
    p = tmp_path / "copy.yaml"
    p.write_text(src.read_text())
    t = load_topology(p)
    assert t == load_topology("a100x8") == load_topology(str(p))
    assert load_topology(t) is t


def test_a100x8_figures():
    t = load_topology("a100x8")
    assert t.peak("float16") == t.peak("bf16") == 312e12
    assert t.peak("fp32") == 19.5e12
    assert t.devices[0].mem_bw == 1555 * GB and t.min_mem_bytes == 40 * GB
    assert all(t.has_direct(a, b) for a in range(8) for b in range(8) if a != b)
    assert all(l.bw == 300 * GB and l.kind == "nvswitch" for l in t.links)
    assert len(t.levels) == 1 and t.fanouts() == (8,)


def test_dgx1_has_six_nvlink_lanes_per_gpu():
    t = load_topology("dgx1-v100")
    lanes = [0] * 8
    for l in t.links:
        if l.kind == "nvlink":
            lanes[l.src] += l.lanes
            a, b = sorted((l.src, l.dst))
            assert DGX1_LANES[(a, b)] == l.lanes
            assert l.bw == l.lanes * NVLINK2_LANE_BW
    assert lanes == [LANES_PER_V100] * 8
    nv_pairs = {tuple(sorted((l.src, l.dst))) for l in t.links if l.kind == "nvlink"}
    assert nv_pairs == set(DGX1_LANES)


def test_dgx1_missing_pairs_relay_over_nvlink():
    t = load_topology("dgx1-v100")
    missing = [(a, b) for a in range(8) for b in range(a + 1, 8) if (a, b) not in DGX1_LANES]
    assert missing == [(0, 5), (0, 6), (0, 7), (1, 4), (1, 6), (1, 7), (2, 4), (2, 5),
                       (2, 7), (3, 4), (3, 5), (3, 6)]
    for a, b in missing:
        for s, d in ((a, b), (b, a)):
            fallback = t.link(s, d)
            assert fallback is not None and fallback.kind == "qpi"  # fallback exists...
            r = t.route(s, d)
            assert len(r) == 2 and all(l.kind == "nvlink" for l in r)  # ...but relay wins
            assert t.transfer_time(s, d, 1e8) < fallback.time(1e8)
    assert t.hops(0, 7) == (0, 4, 7) and t.relays(0, 7) == (4,)
    assert t.path_bw(0, 7) == 50 * GB
    # Directly linked pairs stay direct, even single-lane ones.
    for a, b in DGX1_LANES:
        assert t.route(a, b) == (t.link(a, b),)


def test_routes_are_deterministic_and_cached_per_instance():
    t1, t2 = load_topology("dgx1-v100"), load_topology("dgx1-v100")
    assert [t1.hops(a, b) for a in range(8) for b in range(8)] == \
        [t2.hops(a, b) for a in range(8) for b in range(8)]
    assert t1.route(0, 5) is t1.route(0, 5)
    assert t1 == t2 and hash(t1) == hash(t2)


def test_pcie4_numa_sharing():
    t = load_topology("pcie4-numa")
    assert t.link(0, 1).kind == "pcie" and t.link(0, 1).bw == 32 * GB
    assert t.link(0, 2).kind == "qpi"
    up = {t.link(s, d).shared for s in (0, 1) for d in (2, 3)}
    down = {t.link(s, d).shared for s in (2, 3) for d in (0, 1)}
    assert len(up) == 1 and len(down) == 1 and up != down
    assert t.path_bw(0, 3) == 20 * GB
    assert t.route(0, 3) == (t.link(0, 3),)  # no faster relay exists


def test_h100x8x2_levels_and_nics():
    t = load_topology("h100x8x2")
    assert [lv.name for lv in t.levels] == ["node", "gpu"]
    assert t.levels[0].groups == (tuple(range(8)), tuple(range(8, 16)))
    assert t.fanouts() == (2, 8) and t.num_nodes == 2
    assert t.node_of(3) == 0 and t.node_of(11) == 1
    assert t.devices_in_node(1) == tuple(range(8, 16))
    assert t.pair_level(0, 9) == 0 and t.pair_level(0, 1) == 1
    assert t.level_bw("node") == 50 * GB and t.level_bw("gpu") == 450 * GB
    assert t.peak("bfloat16") == 989e12 and t.peak("float32") == 67e12
    assert t.devices[0].mem_bw == 3.35e12 and t.devices[0].mem_bytes == 80 * GB
    # GPU i of node 0 -> any GPU of node 1 leaves through NIC i.
    for i in range(8):
        nics = {t.link(i, 8 + j).shared for j in range(8)}
        assert nics == {f"nic0.{i}:out"}
    assert t.route(0, 9) == (t.link(0, 9),)
    assert t.resources_on_route(0, 9) == ("nic0.0:out",)


def test_cpu4_is_calibrated_loopback():
    t = load_topology("cpu4")
    assert "calibrate" in t.source_notes
    assert {l.kind for l in t.links} == {"loopback"}
    assert t.devices[2].name == "rank2" and t.world_size == 4
    # Measured figures: only plausible ranges (they change with the machine).
    assert 1e7 < t.link(0, 1).bw < 1e12 and 0 < t.link(0, 1).latency_s < 1e-2
    assert t.link(0, 1).bw == t.link(3, 2).bw


# ---- round trip, synthetic, helpers ----

@pytest.mark.parametrize("name", SHIPPED)
def test_yaml_round_trip(name):
    t = load_topology(name)
    text = to_yaml(t)
    back = read_topology(yaml.safe_load(text))
    assert back == t
    assert to_yaml(back) == text


def test_round_trip_keeps_odd_lane_counts():
    t = Topology("odd", (_dev(0), _dev(1)),
                 (Link(0, 1, 0.7e9 * 3, 1e-6, "nvlink", None, 3),
                  Link(1, 0, 1e9, 2e-6, "pcie", "sw")),
                 (Level("gpu", ((0,), (1,))),))
    assert read_topology(yaml.safe_load(to_yaml(t))) == t


def test_pickle_drops_cache():
    t = load_topology("dgx1-v100")
    t.route(0, 5)
    back = pickle.loads(pickle.dumps(t))
    assert back == t and back.hops(0, 5) == t.hops(0, 5)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
def test_synthetic_world_sizes(n):
    t = synthetic(n)
    assert t.world_size == n and t.fanouts() == (n,)
    assert all(t.has_direct(a, b) for a in range(n) for b in range(n) if a != b)
    assert t.transfer_time(0, 0, 1e9) == 0.0 and t.route(0, 0) == ()


def test_synthetic_two_nodes():
    t = synthetic(8, nodes=2, intra_bw=100 * GB, inter_bw=10 * GB)
    assert t.fanouts() == (2, 4) and t.path_bw(0, 5) == 10 * GB and t.path_bw(0, 1) == 100 * GB
    assert t.transfer_time(0, 4, 10 * GB) == pytest.approx(1.0 + t.path_latency(0, 4))
    with pytest.raises(TopologyError, match="nodes"):
        synthetic(6, nodes=4)
    with pytest.raises(TopologyError, match="n: expected"):
        synthetic(0)


def test_peak_dtype_aliases_and_bisection():
    t = load_topology("a100x8")
    assert canonical_dtype("half") == "float16" and canonical_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(TopologyError, match="fix:"):
        t.peak("int8")
    assert bisection_bw(t) == 16 * 300 * GB  # 4 x 4 devices across the cut
    assert bisection_bw(synthetic(1)) == math.inf


def test_bad_device_argument():
    t = synthetic(2)
    with pytest.raises(TopologyError, match="device 5 does not exist"):
        t.route(0, 5)
    with pytest.raises(TopologyError, match="no level named"):
        t.level_bw("node")


def test_unknown_shipped_name_lists_choices():
    with pytest.raises(TopologyError) as e:
        load_topology("a100x9")
    assert "a100x8" in str(e.value) and "fix:" in str(e.value)
    with pytest.raises(TopologyError, match="file not found"):
        load_topology("no/such/file.yaml")


def test_direct_construction_is_validated():
    with pytest.raises(TopologyError, match=r"devices\[1\].id: duplicate device id 0"):
        Topology("x", (_dev(0), _dev(0)), (), (Level("gpu", ((0,), (1,))),))
    with pytest.raises(TopologyError, match=r"links\[0\].dst: device 7 does not exist"):
        Topology("x", (_dev(0), _dev(1)), (Link(0, 7, 1e9, 0, "pcie"),),
                 (Level("gpu", ((0,), (1,))),))
    with pytest.raises(TopologyError, match="cannot reach"):
        Topology("x", (_dev(0), _dev(1)), (Link(0, 1, 1e9, 0, "pcie"),),
                 (Level("gpu", ((0,), (1,))),))
    assert issubclass(TopologyError, EinsummableError)


def _dev(i: int) -> Device:
    return Device(i, f"d{i}", 0, {k: 1e12 for k in DTYPES}, 1e11, 1e9, 1e-6)


# ---- units ----

@pytest.mark.parametrize("text,kind,value", [
    ("300 GB/s", "bandwidth", 300e9), ("400 Gb/s", "bandwidth", 50e9),
    ("3.35 TB/s", "bandwidth", 3.35e12), ("1 GiB/s", "bandwidth", 2.0 ** 30),
    ("312 TFLOP/s", "flops", 312e12), ("19.5 TFLOPS", "flops", 19.5e12),
    ("40 GiB", "bytes", 40 * 2.0 ** 30), ("40 GB", "bytes", 40e9), ("512 B", "bytes", 512.0),
    ("5 us", "time", 5e-6), ("5µs", "time", 5e-6), ("2 ms", "time", 2e-3), ("1.5e-6", "time",
                                                                            1.5e-6),
    (7, "time", 7.0), (2.5e9, "bandwidth", 2.5e9),
])
def test_parse_quantity(text, kind, value):
    assert parse_quantity(text, kind) == value


@pytest.mark.parametrize("text,kind", [("fast", "bandwidth"), ("5 us", "bandwidth"),
                                       ("40 GB/s", "bytes"), (True, "time"), ([1], "flops")])
def test_parse_quantity_rejects(text, kind):
    with pytest.raises(ValueError, match="expected"):
        parse_quantity(text, kind)


# ---- validation messages: each names the field path and a fix ----

GOOD = textwrap.dedent("""\
    name: tiny
    device_types:
      g: {peak_flops: {float16: 1 TFLOP/s, bfloat16: 1 TFLOP/s, float32: 1 TFLOP/s},
          mem_bw: 100 GB/s, mem_bytes: 1 GB, launch: 5 us}
    nodes: {count: 1, devices_per_node: 4, device_type: g}
    links:
      - {kind: nvswitch, pairs: all, bw: 10 GB/s, latency: 1 us}
    """)


def _load(tmp_path: Path, text: str) -> Topology:
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return load_topology(p)


def test_good_yaml_loads(tmp_path):
    t = _load(tmp_path, GOOD)
    assert t.world_size == 4 and len(t.links) == 12 and t.devices[1].name == "g:1"


def _edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


BROKEN = [
    (_edit("bw: 10 GB/s", "bw: fast"), "links[0].bw", "expected a bandwidth"),
    (_edit("bw: 10 GB/s", "bw: -3 GB/s"), "links[0].bw", "positive"),
    (_edit("latency: 1 us", "latency: 1 GB"), "links[0].latency", "unknown unit"),
    (_edit("kind: nvswitch", "kind: warp"), "links[0].kind", "unknown link kind"),
    (_edit("pairs: all", "pairs: [[0, 1], [1, 9]]"), "links[0].pairs[1]",
     "device 9 does not exist"),
    (_edit("pairs: all", "pairs: [[2, 2]]"), "links[0].pairs[0]", "itself"),
    (_edit("pairs: all", "pairs: everything"), "links[0].pairs", "unknown pair selector"),
    (_edit("pairs: all", "pairs: [[0, 1, 0]]"), "links[0].pairs[0][2]", "integer >= 1"),
    (_edit("pairs: all", "pairs: all, colour: red"), "links[0].colour", "unknown key"),
    (_edit("pairs: all", "pairs: [[0, 1], [1, 2]]"), "links", "cannot reach"),
    (GOOD + "  - {kind: pcie, pairs: [[0, 1]], bw: 1 GB/s, latency: 1 us}\n",
     "links[1].pairs[0]", "already has a link from links[0]"),
    (_edit("pairs: all,", "pairs: all, shared: 'x{bogus}',"), "links[0].shared",
     "bad template"),
    (_edit("mem_bytes: 1 GB", "mem_bytes: -1 GB"), "device_types.g.mem_bytes", "positive"),
    (_edit("bfloat16: 1 TFLOP/s, ", ""), "device_types.g.peak_flops.bfloat16", "missing"),
    (_edit("float32: 1 TFLOP/s", "float32: 1 TFLOP/s, int4: 9"), "device_types.g.peak_flops.int4",
     "unknown key"),
    (_edit("launch: 5 us", "launch: 5 us, color: red"), "device_types.g.color", "unknown key"),
    (_edit("device_type: g", "device_type: h"), "nodes.device_type", "unknown device type"),
    (_edit("devices_per_node: 4", "devices_per_node: 0"), "nodes.devices_per_node",
     "integer >= 1"),
    (_edit("name: tiny", "name: tiny\nflavour: x"), "flavour", "unknown key"),
    (_edit("name: tiny\n", ""), "name", "missing"),
    (_edit("devices_per_node: 4, ", ""), "nodes.devices_per_node", "missing"),
    (_edit("nodes: {", "devices: [{id: 0, type: g}]\nnodes: {"), "nodes", "exactly one of"),
    (_edit("nodes: {count: 1, devices_per_node: 4, device_type: g}",
           "devices: [{id: 0, type: g}, {id: 1, type: g, mem_bw: 1 GB/s}]"),
     "devices[1].mem_bw", "given together with 'type'"),
    (_edit("bw: 10 GB/s", "bw: 10 GB/s, total_bw: 20 GB/s"), "links[0].bw", "exactly one of"),
    (_edit("pairs: all", "pairs: all, src: 0, dst: 1"), "links[0].pairs", "exactly one of"),
    (_edit("pairs: all", "src: 0"), "links[0].dst", "missing"),
    (_edit("pairs: all", "pairs: all, port: nvlink"), "links[0].port_bw", "together"),
    (_edit("pairs: all", "pairs: all, oneway: 1"), "links[0].oneway", "true or false"),
    (_edit("pairs: all", "pairs: all, lanes: '2'"), "links[0].lanes", "expected an integer"),
    (GOOD + "  - {kind: pcie, pairs: [[0, 1]], bw: 1 GB/s, latency: 1 parsec, replace: true}\n",
     "links[1].latency", "unknown unit"),
    ("- 1\n", "(document)", "expected a mapping"),
    (GOOD + "levels:\n  - {name: gpu, groups: [[0], [1], [2]]}\n", "levels[0].groups",
     "partition"),
    (GOOD + "levels:\n  - {name: gpu, groups: [[0], [1], [2], [3], [1]]}\n",
     "levels[0].groups[4]", "partition"),
    (GOOD + "levels:\n  - {name: pair, groups: [[0, 1], [2, 3]]}\n", "levels[0].groups",
     "one device per group"),
    (GOOD + "levels:\n  - {name: a, groups: [[0, 1], [2, 3]]}\n"
     "  - {name: b, groups: [[0, 2], [1, 3]]}\n  - {name: c, groups: per_device}\n",
     "levels[1].groups[0]", "refine"),
]


@pytest.mark.parametrize("text,path,what", BROKEN, ids=[b[1] + ":" + b[2] for b in BROKEN])
def test_validation_names_field_and_fix(tmp_path, text, path, what):
    with pytest.raises(TopologyError) as e:
        _load(tmp_path, text)
    msg = str(e.value)
    assert f"x.yaml: {path}:" in msg, msg
    assert what in msg, msg
    assert "\n  fix: " in msg, msg


def test_explicit_devices_validation(tmp_path):
    explicit = textwrap.dedent("""\
        name: e
        device_types:
          g: {peak_flops: {float16: 1, bfloat16: 1, float32: 1}, mem_bw: 1, mem_bytes: 1,
              launch: 0}
        devices:
          - {id: 0, type: g}
          - {id: 0, type: g}
        links:
          - {kind: pcie, src: 0, dst: 1, bw: 1 GB/s, latency: 1 us}
        """)
    with pytest.raises(TopologyError, match=r"devices\[1\].id: duplicate device id 0"):
        _load(tmp_path, explicit)
    ok = _load(tmp_path, explicit.replace("- {id: 0, type: g}", "- {id: 1, type: g}", 1))
    assert ok.world_size == 2 and [d.id for d in ok.devices] == [0, 1]  # sorted by id
    with pytest.raises(TopologyError, match=r"devices\[0\].id: device ids must be 0..1"):
        _load(tmp_path, explicit.replace("- {id: 0, type: g}", "- {id: 2, type: g}", 1))


def test_replace_and_unlinked_rules(tmp_path):
    text = _edit("pairs: all", "pairs: [[0, 1], [1, 2], [2, 3]]") + (
        '  - {kind: pcie, pairs: unlinked, bw: 1 GB/s, latency: 10 us, shared: "host{src}"}\n'
        "  - {kind: nvlink, pairs: [[0, 1, 2]], bw: 25 GB/s, latency: 1 us, replace: true}\n")
    t = _load(tmp_path, text)
    assert t.link(0, 1).kind == "nvlink" and t.link(0, 1).bw == 50 * GB
    assert t.link(1, 0).lanes == 2
    assert t.link(0, 3).kind == "pcie" and t.link(3, 0).shared == "host3"
    # 0 -> 3 over the 10 GB/s chain beats the 1 GB/s host link.
    assert t.hops(0, 3) == (0, 1, 2, 3)


def test_invalid_yaml_syntax(tmp_path):
    with pytest.raises(TopologyError, match="not valid YAML"):
        _load(tmp_path, "name: [unclosed\n")


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: m\u00e4chine\n".encode("latin-1"))
    with pytest.raises(TopologyError, match=r"latin1.yaml: not UTF-8 text \(byte 0xe4 on line 1"):
        load_topology(path)


# ---- schema errors name nested field paths ----

NESTED = [
    (GOOD + "  - {kind: pcie, pairs: [[0, 1]], bw: 1 GB/s, latency: 5 furlongs, replace: true}\n",
     "links[1].latency", "unknown unit 'furlongs'", "'5 us'"),
    (_edit("  g: {", "  X: {peak_flops: {float16: 1, bfloat16: 1, float32: 1}, mem_bw: 1,\n"
           "      mem_bytes: 1, launch: 0, colour: red}\n  g: {"),
     "device_types.X.colour", "unknown key", "peak_flops, mem_bw, mem_bytes, launch, message"),
    (_edit("devices_per_node: 4, ", ""), "nodes.devices_per_node", "missing",
     "add 'devices_per_node:'"),
]


@pytest.mark.parametrize("text,path,what,fix", NESTED, ids=[n[1] for n in NESTED])
def test_schema_errors_name_nested_field_paths(text, path, what, fix):
    with pytest.raises(TopologyError) as e:
        read_topology(yaml.safe_load(text), "nested.yaml")
    head, _, hint = str(e.value).partition("\n  fix: ")
    assert head.startswith(f"nested.yaml: {path}: "), head
    assert what in head, head
    assert fix in hint, hint


def test_disconnected_links_are_rejected_naming_both_devices(tmp_path):
    with pytest.raises(TopologyError) as e:  # two islands: {0, 1} and {2, 3}
        _load(tmp_path, _edit("pairs: all", "pairs: [[0, 1], [2, 3]]"))
    assert "links: device 0 cannot reach device 2" in str(e.value)
    with pytest.raises(TopologyError) as e:  # 1 cannot get back to 0 over a one-way link
        Topology("x", (_dev(0), _dev(1)), (Link(0, 1, 1e9, 0, "pcie"),),
                 (Level("gpu", ((0,), (1,))),))
    assert "device 1 cannot reach device 0" in str(e.value) and "fix:" in str(e.value)


# ---- routes: networkx against brute force; memoised answers ----

PS_PER_S = 1e12  # routes compare hop times in integer picoseconds
# Rates and latencies that tie often; 1e15 B/s makes a 1-byte hop free (0 ps) at latency 0.
TIE_BWS = (1e9, 2e9, 4e9, 1e15)
TIE_LATENCIES = (0.0, 1e-6, 2e-6)
ROUTE_SIZES = (None, 1, 1e3, 1e6, 1e9)


def _brute_force_hops(t: Topology, src: int, dst: int, nbytes: float) -> tuple[int, ...]:
    """Every simple path, ordered by (picoseconds, hops, device sequence)."""
    best = None

    def walk(path: tuple[int, ...], ps: int) -> None:
        nonlocal best
        if path[-1] == dst:
            key = (ps, len(path), path)
            best = key if best is None or key < best else best
            return
        for l in t.links:
            if l.src == path[-1] and l.dst not in path:
                walk(path + (l.dst,), ps + round(l.time(nbytes) * PS_PER_S))
    walk((src,), 0)
    return best[2]


@st.composite
def _small_topologies(draw) -> Topology:
    n = draw(st.integers(2, 5))
    ring = draw(st.permutations(range(n)))  # keeps every device reachable
    others = [(a, b) for a in range(n) for b in range(n) if a != b]
    # a coin per pair (not a set of pairs, which shrinks towards sparse graphs with few ties)
    coins = draw(st.lists(st.booleans(), min_size=len(others), max_size=len(others)))
    pairs = sorted({p for p, c in zip(others, coins) if c} |
                   {(ring[i], ring[(i + 1) % n]) for i in range(n)})
    links = tuple(Link(a, b, draw(st.sampled_from(TIE_BWS)), draw(st.sampled_from(TIE_LATENCIES)),
                       "pcie") for a, b in pairs)
    return Topology("h", tuple(_dev(i) for i in range(n)), links,
                    (Level("gpu", tuple((i,) for i in range(n))),))


@settings(max_examples=150)
@given(_small_topologies(), st.sampled_from(ROUTE_SIZES))
def test_routes_are_the_brute_force_best_paths(t, nbytes):
    size = ROUTE_REFERENCE_BYTES if nbytes is None else nbytes
    for a in range(t.world_size):
        for b in range(t.world_size):
            if a != b:
                assert t.hops(a, b, nbytes) == _brute_force_hops(t, a, b, size)


@pytest.mark.parametrize("name", SHIPPED)
def test_memoised_answers_equal_fresh_ones(name):
    t = load_topology(name)
    n = t.world_size
    fresh_routes = {a: shortest_routes(link_graph(n, t.links), a, ROUTE_REFERENCE_BYTES)
                    for a in range(n)}
    for memo in (t, t, pickle.loads(pickle.dumps(t))):  # cold memos, warm memos, rebuilt
        for a in range(n):
            for b in range(n):
                direct = [l for l in t.links if (l.src, l.dst) == (a, b)]
                assert memo.link(a, b) == (direct[0] if direct else None)
                assert memo.has_direct(a, b) == bool(direct)
                want = (a,) + tuple(l.dst for l in fresh_routes[a][b]) if a != b else (a,)
                assert memo.hops(a, b) == want
        for i, lv in enumerate(t.levels):
            for d in range(n):
                want = next(gi for gi, g in enumerate(lv.groups) if d in g)
                assert memo.group_of(i, d) == memo.group_of(lv.name, d) == want
