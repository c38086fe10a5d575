"""The simulated baselines: the NCCL collective model on hand-built topologies (figures worked
out by hand in the comments), the baselines built on it (FSDP with prefetch, vLLM's TP, the
long-context schemes), and the plan summaries that stand beside them in the harness's tables."""
from __future__ import annotations

import pytest

from einsummable.frontend.fuse import fuse
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.planning.cost import memory_bound_share
from einsummable.planning.kernel_time import contention_share
from einsummable.topology import Device, Level, Link, Topology, load_topology, synthetic
from experiments import collectives, simulated
from experiments.einsummable_system import named_plan
from experiments.plan_summary import describe, op_splits

GB = 1e9
RATES = {"float16": 1e12, "bfloat16": 1e12, "float32": 1e12}


def _machine(n: int, links: list[Link], name: str = "hand") -> Topology:
    devs = tuple(Device(i, f"d{i}", 0, RATES, 1e12, 1e12, 0.0) for i in range(n))
    return Topology(name, devs, tuple(links), (Level("gpu", tuple((i,) for i in range(n))),))


def _both(a: int, b: int, bw: float, lanes: int = 1, **kw) -> list[Link]:
    return [Link(a, b, bw, 1e-6, "nvlink", lanes=lanes, **kw),
            Link(b, a, bw, 1e-6, "nvlink", lanes=lanes, **kw)]


def _pcie(a: int, b: int) -> list[Link]:
    return [Link(a, b, 1 * GB, 10e-6, "pcie", shared="host"),
            Link(b, a, 1 * GB, 10e-6, "pcie", shared="host")]


def test_square_of_links_gives_two_rings_one_each_way():
    # 0-1-2-3-0 at 10 GB/s a direction, diagonals over a shared PCIe host: the only rings over
    # dedicated links are the square both ways, 10 GB/s each: bus 20 GB/s.
    sq = _machine(4, [*_both(0, 1, 10 * GB), *_both(1, 2, 10 * GB), *_both(2, 3, 10 * GB),
                      *_both(3, 0, 10 * GB), *_pcie(0, 2), *_pcie(1, 3)])
    fab = collectives.fabric(sq)
    assert sorted(r.devices for r in fab.rings) == [(0, 1, 2, 3), (0, 3, 2, 1)]
    assert fab.bus_bw == 20 * GB and fab.latency_s == 1e-6 and not fab.fully_connected
    # all-reduce of 4 MB at peak: 2 x 3/4 x 4 MB / 20 GB/s = 300 us, + 2 x 3 hops x 1 us.
    t = collectives.collective_time("all_reduce", 4e6, fab, collectives.PEAK)
    assert t == pytest.approx(306e-6, rel=1e-12)
    # at the published NVLink fraction the bandwidth term stretches by 300/215.
    t = collectives.collective_time("all_reduce", 4e6, fab)
    assert t == pytest.approx(300e-6 * 300 / 215 + 6e-6, rel=1e-12)
    # all-gather of 4 MB: 3/4 x 4 MB / 20 GB/s = 150 us + 3 us. An all-to-all would take a
    # quarter of that at the bus rate, but the cut between {0, 1} and {2, 3} binds: 4 pairs
    # across it move 4 x 4 MB / 16 over two 10 GB/s links and the shared PCIe host (1 GB/s).
    assert collectives.collective_time("all_gather", 4e6, fab, collectives.PEAK) == \
        pytest.approx(153e-6, rel=1e-12)
    assert fab.cut_pair_bw == pytest.approx(21 * GB / 4)
    assert collectives.collective_time("all_to_all", 4e6, fab, collectives.PEAK) == \
        pytest.approx(4 * 4e6 / 16 / (21 * GB) + 3e-6, rel=1e-12)
    # nccl-tests' bus bandwidth of that all-reduce: 4 MB / 306 us x 1.5.
    assert collectives.bus_bandwidth("all_reduce", 4e6, fab, collectives.PEAK) == \
        pytest.approx(4e6 / 306e-6 * 1.5, rel=1e-12)


def test_lanes_add_up_and_ports_cap_the_rings():
    # A triangle of doubled links (2 lanes x 10 GB/s = 20 GB/s a direction): a ring each way
    # at 20 GB/s, bus 40 GB/s.
    tri = _machine(3, [*_both(0, 1, 20 * GB, 2), *_both(1, 2, 20 * GB, 2),
                       *_both(2, 0, 20 * GB, 2)])
    fab = collectives.fabric(tri)
    assert [r.bw for r in fab.rings] == [20 * GB, 20 * GB] and fab.bus_bw == 40 * GB
    # The same with a 30 GB/s port per device: the second ring gets the 10 GB/s left.
    port = {"port": "nvlink", "port_bw": 30 * GB}
    capped = _machine(3, [*_both(0, 1, 20 * GB, 2, **port), *_both(1, 2, 20 * GB, 2, **port),
                          *_both(2, 0, 20 * GB, 2, **port)])
    fab = collectives.fabric(capped)
    assert [r.bw for r in fab.rings] == [20 * GB, 10 * GB] and fab.bus_bw == 30 * GB
    assert fab.fully_connected and fab.ingress_bw == 30 * GB


def test_a_switch_is_one_ring_at_the_port_rate():
    # synthetic(4): every pair through a 100 GB/s port, 3 us. 8 MB all-reduce at peak:
    # 2 x 3/4 x 8 MB / 100 GB/s = 120 us + 6 hops x 3 us = 138 us.
    fab = collectives.fabric(synthetic(4, intra_bw=100e9))
    assert len(fab.rings) == 1 and fab.bus_bw == 100e9
    assert collectives.collective_time("all_reduce", 8e6, fab, collectives.PEAK) == \
        pytest.approx(138e-6, rel=1e-12)


def test_no_dedicated_ring_falls_back_to_one_ring_over_routes():
    pcie = _machine(3, [*_pcie(0, 1), *_pcie(1, 2), *_pcie(0, 2)])
    fab = collectives.fabric(pcie)
    assert fab.rings == () and fab.bus_bw == 1 * GB and fab.latency_s == 10e-6
    # 3 MB all-gather: 2/3 x 3 MB / 1 GB/s = 2 ms + 2 x 10 us.
    assert collectives.collective_time("all_gather", 3e6, fab, collectives.PEAK) == \
        pytest.approx(2.02e-3, rel=1e-12)


def test_across_nodes_the_faster_of_flat_ring_and_hierarchy():
    # 2 nodes x 4: 100 GB/s switch inside (1 us), one 10 GB/s NIC per device across (5 us).
    topo = synthetic(8, nodes=2, intra_bw=100e9, inter_bw=10e9, intra_latency_s=1e-6,
                     inter_latency_s=5e-6)
    fab = collectives.fabric(topo)
    assert fab.nodes == ((0, 1, 2, 3), (4, 5, 6, 7)) and fab.nic_bw == 10e9
    peak = collectives.PEAK
    # flat ring, 8 MB: min(100, 4 NICs x 10) = 40 GB/s: 2 x 7/8 x 8 MB / 40 GB/s = 350 us,
    # + 14 hops x 5 us = 420 us.
    assert collectives._flat("all_reduce", 8e6, fab, peak) == pytest.approx(420e-6, rel=1e-12)
    # hierarchical: 2 x 3/4 x 8 MB / 100 GB/s = 120 us inside; 2 x 1/2 x 2 MB / 10 GB/s =
    # 200 us across; latency 2 x 3 x 1 + 2 x 1 x 5 = 16 us: 336 us, the faster.
    assert collectives.collective_time("all_reduce", 8e6, fab, peak) == \
        pytest.approx(336e-6, rel=1e-12)
    # The network phase runs at the published network fraction, the NVLink one at its own.
    achieved = 120e-6 * 300 / 215 + 200e-6 / 0.905 + 16e-6
    assert collectives.collective_time("all_reduce", 8e6, fab) == pytest.approx(achieved,
                                                                                 rel=1e-12)


def test_vllm_custom_all_reduce_where_it_applies():
    fab = collectives.fabric(synthetic(8))  # NVSwitch: fully connected, 300 GB/s in a device
    bw = collectives.NVLINK_P2P_FRACTION * 300e9
    # 128 KiB on 8 devices: one-shot, each rank reads 7 whole buffers, one 3 us sync.
    t, algo = collectives.vllm_all_reduce(128 * 1024, fab)
    assert algo == "one-shot" and t == pytest.approx(7 * 128 * 1024 / bw + 3e-6, rel=1e-12)
    # 1 MiB: two-shot (reduce-scatter then all-gather by peer reads), two syncs.
    t, algo = collectives.vllm_all_reduce(1 << 20, fab)
    assert algo == "two-shot" and t == pytest.approx(2 * 7 / 8 * (1 << 20) / bw + 6e-6,
                                                     rel=1e-12)
    # 8 MiB and over: NCCL.
    assert collectives.vllm_all_reduce(8 << 20, fab)[1] == "nccl"
    # Two devices: one-shot at any size under the buffer.
    assert collectives.vllm_all_reduce(4 << 20, collectives.fabric(synthetic(2)))[1] == \
        "one-shot"
    # The DGX-1 cube mesh is not fully connected: NCCL; across nodes: NCCL.
    assert collectives.vllm_all_reduce(1 << 20, collectives.fabric(
        load_topology("dgx1-v100")))[1] == "nccl"
    assert collectives.vllm_all_reduce(1 << 20, collectives.fabric(
        synthetic(8, nodes=2)))[1] == "nccl"


def test_dgx1_rings_spend_every_nvlink_lane():
    # Six 25 GB/s lanes per GPU: the rings add up to 150 GB/s, never over a link's lanes.
    topo = load_topology("dgx1-v100")
    fab = collectives.fabric(topo)
    assert fab.bus_bw == pytest.approx(150e9) and not fab.fully_connected
    used: dict = {}
    for r in fab.rings:
        for i, a in enumerate(r.devices):
            b = r.devices[(i + 1) % len(r.devices)]
            assert topo.link(a, b).kind == "nvlink"
            used[(a, b)] = used.get((a, b), 0.0) + r.bw
    assert all(bw <= topo.link(a, b).bw + 1e-3 for (a, b), bw in used.items())


def test_bad_input_is_a_clear_error():
    topo = synthetic(4)
    with pytest.raises(ValueError, match="distinct"):
        collectives.fabric(topo, (0, 0, 1))
    with pytest.raises(ValueError, match="not in topology"):
        collectives.fabric(topo, (0, 9))
    fab = collectives.fabric(topo)
    with pytest.raises(ValueError, match="unknown collective"):
        collectives.collective_time("scatter", 1e6, fab)
    with pytest.raises(ValueError, match="negative"):
        collectives.collective_time("all_reduce", -1, fab)
    with pytest.raises(ValueError, match="achieved fraction"):
        collectives.Rates(1.2, 1.0, 1.0)
    assert collectives.collective_time("all_reduce", 1e6, collectives.fabric(topo, (2,))) == 0.0


@pytest.fixture(scope="module")
def long_block():
    # One sequence, many tokens: the shape where sequence-parallel attention matters.
    # Fused, as capture gives it; the spelled-out chain must give the same collectives.
    g = llama_block_graph(preset_config("llama-7b"), 1, 8192, "float16")
    return fuse(g), g


def test_attention_boundary_is_queries_keys_values_in_one_out(long_block):
    fused, chain = long_block
    assert len(simulated.attention_ops(fused)) == len(simulated.attention_ops(chain)) == 1
    for g in long_block:
        ins, keys, outs = simulated.attention_boundary(g)
        assert len(ins) == 3 and len(keys) == 2 and len(outs) == 1
        assert set(keys) < set(ins)  # the queries are not indexed by the key sequence
        assert [g.tensor(t).nbytes for t in ins] == [g.tensor(t).nbytes for t in
                                                     simulated.attention_boundary(fused)[0]]


# LLaMA-7B block, 1 x 8192 tokens, fp16: the weights (two norms of 4096, four 4096x4096
# projections, three 4096x11008 FFN matrices) and the 8192x4096 activations in bytes.
WEIGHT_BYTES = 2 * (2 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008)  # 404766720
ACTIVATION_BYTES = 2 * 8192 * 4096                                   # 64 MiB


def _ring_collective_s(kind, nbytes, n=8, bw=300e9 * collectives.NVLINK_BUSBW_FRACTION,
                       latency=3e-6):
    """NCCL's ring collectives on n devices at bus bandwidth bw, by hand (a100x8: one ring at
    the 300 GB/s NVSwitch port, at the published achieved fraction)."""
    moved = {"all_gather": (n - 1) / n, "ring_pass": (n - 1) / n,
             "all_to_all": (n - 1) / n ** 2, "all_reduce": 2 * (n - 1) / n}[kind]
    hops = 2 * (n - 1) if kind == "all_reduce" else n - 1
    return moved * nbytes / bw + hops * latency


def test_ulysses_and_ring_attention_are_priced_from_their_collectives(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    gathers = sum(_ring_collective_s("all_gather", w.nbytes) for w in long_block.weights)
    assert sum(w.nbytes for w in long_block.weights) == WEIGHT_BYTES
    assert len(long_block.weights) == 9
    # Ulysses: every weight all-gathered once (ZeRO-3) and prefetched behind compute, and four
    # all-to-alls of 64 MiB on the critical path (queries, keys, values in; the output back).
    uly = simulated.simulate_baseline("ulysses", long_block, topo)
    assert sorted(c.kind for c in uly.collectives) == ["all_gather"] * 9 + ["all_to_all"] * 4
    assert uly.gather_s == pytest.approx(gathers, rel=1e-9)
    assert uly.comm_s == pytest.approx(4 * _ring_collective_s("all_to_all", ACTIVATION_BYTES),
                                       rel=1e-9)
    # The gathers take κ of the compute while they run (contention: a100x8's s = 0.159 for
    # compute-bound kernels, the memory rate their bytes take for memory-bound ones).
    mu = memory_bound_share(long_block, topo)
    kappa = simulated.gather_share(topo, mu, uly.collectives, uly.gather_s)
    rate = 2 * 7 / 8 * WEIGHT_BYTES / uly.gather_s
    assert kappa == pytest.approx((1 - mu) * 0.159 + mu * rate / topo.devices[0].mem_bw)
    assert uly.time_s == pytest.approx(max(uly.compute_s + kappa * uly.gather_s, uly.gather_s)
                                       + uly.comm_s)
    share = contention_share(topo, mu)  # the ring passes, at the ports' rates
    # Ring attention: keys and values pass round the ring behind each device's attention,
    # which takes at least 4 s^2 d FLOP / 8 devices at 312 TFLOP/s = 440.5 us. At the links'
    # full rate the passes (2 x 7/8 x 64 MiB / 300 GB/s + 14 x 3 us = 433.5 us) hide behind
    # it, costing only their contention; at the achieved NCCL rate (588.2 us) the excess
    # shows.
    attention = simulated.attention_compute(long_block, topo)
    assert 4 * 8192 ** 2 * 4096 / (8 * 312e12) <= attention <= 1.05 * 4 * 8192 ** 2 * 4096 / (
        8 * 312e12)
    assert 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES, bw=300e9) < attention
    peak = simulated.simulate_baseline("ring-attention", long_block, topo,
                                       rates=collectives.PEAK)
    peak_passes = 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES, bw=300e9)
    assert peak.comm_s == pytest.approx(share * peak_passes, rel=1e-9)
    passes = 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES)
    ring = simulated.simulate_baseline("ring-attention", long_block, topo)
    assert sorted(c.kind for c in ring.collectives) == ["all_gather"] * 9 + ["ring_pass"] * 2
    assert ring.gather_s == pytest.approx(gathers, rel=1e-9)
    assert ring.comm_s == pytest.approx(passes - attention + share * attention, rel=1e-9)
    assert passes > attention
    # At a sixth of the bandwidth the passes outlast the attention: the excess shows.
    slow = synthetic(8, intra_bw=50e9)
    slow_ring = simulated.simulate_baseline("ring-attention", long_block, slow)
    slow_bw = 50e9 * collectives.NVLINK_BUSBW_FRACTION
    attention = simulated.attention_compute(long_block, slow)
    exposed = 2 * _ring_collective_s("ring_pass", ACTIVATION_BYTES, bw=slow_bw) - attention
    assert exposed > 0
    assert slow_ring.comm_s == pytest.approx(exposed, rel=1e-9)


def test_fsdp_gathers_one_flat_parameter_prefetched_behind_compute(long_block):
    fused = long_block[0]
    topo = load_topology("a100x8")
    gather = _ring_collective_s("all_gather", WEIGHT_BYTES)
    steady = simulated.simulate_baseline("data-parallel", fused, topo, steady_state=True)
    # One sequence on 8 devices: the sequence is split, so the attention is context-parallel
    # (ring attention round all 8, as the ring-attention baseline runs it).
    assert [(c.kind, c.nbytes, c.weight) for c in steady.collectives] == \
        [("all_gather", WEIGHT_BYTES, True)] + [("ring_pass", ACTIVATION_BYTES, False)] * 2
    assert all(c.group == tuple(range(8)) for c in steady.collectives[1:])
    ring = simulated.simulate_baseline("ring-attention", fused, topo)
    assert steady.gather_s == pytest.approx(gather, rel=1e-9)
    assert steady.comm_s == pytest.approx(ring.comm_s, rel=1e-12) and steady.comm_s > 0
    assert "context-parallel" in steady.note
    # In a stack the next block's gather runs behind this block's compute, taking its share
    # of the compute's rate while it runs...
    kappa = simulated.gather_share(topo, memory_bound_share(fused, topo), steady.collectives,
                                   gather)
    assert 0.159 * 0.5 < kappa < 0.5
    assert steady.time_s == pytest.approx(
        max(steady.compute_s + kappa * gather, gather) + steady.comm_s, rel=1e-12)
    assert "prefetch" in steady.note
    # ...a block alone has nothing to hide its own gather behind.
    alone = simulated.simulate_baseline("data-parallel", fused, topo, steady_state=False)
    assert alone.time_s == pytest.approx(alone.compute_s + gather + alone.comm_s, rel=1e-12)
    # Replicated weights: no weight collective, the context passes stay.
    free = simulated.simulate_baseline("data-parallel", fused, topo, weights="replicated")
    assert [c.kind for c in free.collectives] == ["ring_pass"] * 2
    assert free.time_s == pytest.approx(free.compute_s + free.comm_s, rel=1e-12)


def test_data_parallel_with_fewer_sequences_than_devices_passes_keys_in_pairs():
    # Batch 4 on 8 devices: each sequence is split in two, so each pair of devices sharing a
    # sequence passes its keys and values (a quarter of each tensor) round the pair. On the
    # DGX-1 mesh the pairs go on doubled NVLinks (50 GB/s), as a tuned deployment puts them.
    g = fuse(llama_block_graph(preset_config("llama-7b"), 4, 2048, "float16"))
    for name, lanes in (("a100x8", None), ("dgx1-v100", 2)):
        topo = load_topology(name)
        base = simulated.simulate_baseline("data-parallel", g, topo)
        passes = [c for c in base.collectives if c.kind == "ring_pass"]
        assert len(passes) == 2
        # 4 x 2048 tokens hold as many bytes as 8192; a pair holds one of the 4 sequences
        assert all(c.nbytes == ACTIVATION_BYTES // 4 for c in passes)
        assert all(len(c.group) == 2 for c in passes)
        if lanes:
            a, b = passes[0].group
            assert topo.link(a, b).bw == lanes * 25e9
        assert base.comm_s > 0
    # no sequence split, no passes
    whole = fuse(llama_block_graph(preset_config("llama-7b"), 8, 256, "float16"))
    assert not [c for c in simulated.simulate_baseline("data-parallel", whole,
                                                       load_topology("a100x8")).collectives
                if c.kind == "ring_pass"]


def test_vllm_tp_is_megatron_tp_with_its_own_all_reduce(long_block):
    fused = long_block[0]
    topo = load_topology("a100x8")
    tp = simulated.simulate_baseline("pytorch-tp", fused, topo)
    vllm = simulated.simulate_baseline("vllm-tp", fused, topo)
    # Two all-reduces of 64 MiB (after attention, after the MLP): over vLLM's 8 MiB buffer,
    # so NCCL's, and the same time as PyTorch's.
    assert [c.kind for c in vllm.collectives] == ["all_reduce", "all_reduce"]
    assert [c.nbytes for c in vllm.collectives] == [ACTIVATION_BYTES] * 2
    assert vllm.time_s == pytest.approx(tp.time_s, rel=1e-12)
    assert vllm.note.startswith("simulated") and "nccl 2x" in vllm.note
    # A short sequence (16 tokens: 128 KiB all-reduces) takes vLLM's one-shot kernel.
    short = fuse(llama_block_graph(preset_config("llama-7b"), 1, 16, "float16"))
    v_short = simulated.simulate_baseline("vllm-tp", short, topo)
    t_short = simulated.simulate_baseline("pytorch-tp", short, topo)
    assert "one-shot 2x" in v_short.note
    one_shot = 7 * 16 * 4096 * 2 / (collectives.NVLINK_P2P_FRACTION * 300e9) + 3e-6
    assert v_short.comm_s == pytest.approx(2 * one_shot, rel=1e-9)
    assert v_short.time_s < t_short.time_s


def test_baselines_carry_their_time_at_link_peak(long_block):
    topo = load_topology("a100x8")
    tp = simulated.simulate_baseline("pytorch-tp", long_block[0], topo)
    peak = simulated.simulate_baseline("pytorch-tp", long_block[0], topo,
                                       rates=collectives.PEAK)
    assert tp.at_peak_s == pytest.approx(peak.time_s, rel=1e-12) and tp.at_peak_s < tp.time_s
    with pytest.raises(ValueError, match="no simulated baseline"):
        simulated.simulate_baseline("megatron", long_block[0], topo)


def test_plan_summary_names_what_each_strategy_splits(long_block):
    long_block = long_block[0]
    topo = load_topology("a100x8")
    uly = op_splits(named_plan(long_block, topo, "ulysses"))
    attention = [k for k, s in uly.items() if s.endswith("(attention)")]
    assert attention and all(uly[k].startswith("feature") for k in attention)  # heads
    assert all(s.startswith("seq 8192/8") for k, s in uly.items() if k not in attention)
    tp = describe(named_plan(long_block, topo, "megatron-tp"))
    assert "feature 32/8" in tp and "feature 11008/8" in tp  # heads, then the FFN width
