"""The collective-pattern bench (`experiments/patterns.py`): the patterns are the exchanges
they name, the bound is the bytes a device or node must take in over its capacity, and the
runner gives one einsummable and one NCCL-model row per pattern and size."""
from __future__ import annotations

import pytest

from einsummable.core.geometry import volume
from einsummable.topology import load_topology, synthetic
from experiments import collectives, patterns

MIB = 1 << 20


@pytest.mark.parametrize("kind", patterns.PATTERNS)
def test_each_pattern_reads_and_holds_what_it_names(kind):
    p = patterns.pattern(kind, 4, 4 * MIB)
    rows, cols = p.info.shape
    assert p.info.nbytes == 4 * MIB and cols == patterns.COLUMNS
    devices = sorted({d for _, d in p.needs})
    assert devices == [0, 1, 2, 3]
    held = sum(volume(x.region) for x in p.produced)
    needed = sum(volume(q) for q, _ in p.needs)
    whole = rows * cols
    expect = {"all_gather": (whole, 4 * whole), "reduce_scatter": (4 * whole, whole),
              "all_reduce": (4 * whole, 4 * whole), "broadcast": (whole, 4 * whole),
              "all_to_all": (whole, whole)}[kind]
    assert (held, needed) == expect
    assert (p.agg == "sum") == (kind in ("reduce_scatter", "all_reduce"))
    with pytest.raises(ValueError, match="unknown pattern"):
        patterns.pattern("scatter", 4, MIB)


def test_the_bound_is_a_device_port_or_a_node_nics():
    s = 64 * MIB
    a100 = load_topology("a100x8")
    # one NVSwitch port of 300 GB/s into each GPU: an all-reduce takes in 2 * 7/8 of it
    assert patterns.bandwidth_bound("all_reduce", s, a100) == pytest.approx(
        2 * 7 / 8 * s / 300e9)
    assert patterns.bandwidth_bound("all_gather", s, a100) == pytest.approx(7 / 8 * s / 300e9)
    # two nodes: the node's NICs bound the all-reduce when they are slower than the ports
    two = synthetic(8, nodes=2)
    node = patterns.bandwidth_bound("all_reduce", s, two)
    assert node >= patterns.bandwidth_bound("all_reduce", s, synthetic(4))


def test_the_runner_gives_einsummable_beside_the_nccl_model():
    cfg = {"name": "patterns-tiny", "topologies": ["a100x8"], "patterns": ["all_gather"],
           "sizes": [16 * MIB]}
    rows, extra, table = patterns.runner(cfg)
    assert [r.system for r in rows] == ["einsummable", "nccl-model"]
    mine, nccl = rows
    assert mine.floor_s == nccl.floor_s > 0
    a100 = load_topology("a100x8")
    assert nccl.time_s == pytest.approx(collectives.collective_time(
        "all_gather", 16 * MIB, collectives.fabric(a100), collectives.PEAK,
        collectives.kernel_of(a100)))
    # on the switch every device sends its block straight to the others: no slower than
    # NCCL's ring, within a launch and a latency of the bound
    assert mine.time_s <= nccl.time_s and mine.time_s <= 1.2 * mine.floor_s
    assert extra["patterns"]["a100x8"]["rows"] == 1
    assert "all_gather" in table


def test_an_all_to_all_on_the_cube_is_bound_by_the_cut_between_its_quads():
    # Half the pairs of a DGX-1 all-to-all cross between {0..3} and {4..7}: 16 x S/64 bytes
    # each way over six 25 GB/s lanes and the 16 GB/s QPI link, where a GPU's own ingress
    # (six lanes and its PCIe port) would allow four times less.
    dgx1 = load_topology("dgx1-v100")
    s = 1 << 30
    cut = patterns.cut_bound("all_to_all", s, dgx1)
    assert cut == pytest.approx(16 * s / 64 / 166e9)
    assert patterns.bandwidth_bound("all_to_all", s, dgx1) == cut
    # the NCCL model's all-to-all cannot beat it either
    nccl = collectives.collective_time("all_to_all", s, collectives.fabric(dgx1),
                                       collectives.PEAK)
    assert cut < nccl < 1.02 * cut
    # on a switch no cut is narrower than a GPU's own port
    a100 = load_topology("a100x8")
    assert patterns.cut_bound("all_to_all", s, a100) <= \
        patterns.bandwidth_bound("all_to_all", s, a100)


def test_gloo_patterns_are_measured_correct_against_gloos_collectives():
    # Every pattern on 2 gloo ranks, one 64 KiB size, one timed round: both systems' answers
    # are checked against the pattern's expected values before timing.
    from experiments import gloo_patterns
    job = gloo_patterns.Job(2, patterns.PATTERNS, (1 << 16,), warmup=0, repeats=1)
    got = gloo_patterns.measure_patterns(job, timeout_s=240)
    assert len(got) == len(patterns.PATTERNS)
    for r in got.values():
        assert r["correct"] == {"einsummable": True, "gloo": True}, r["pattern"]
        assert r["einsummable"]["median_s"] > 0 and r["gloo"]["median_s"] > 0


def test_the_nccl_model_pays_its_kernel_and_its_fused_reductions():
    # One launch per collective, as einsummable's programs pay one per p2p batch; a reduction
    # reads two inputs and writes the sum at the memory rate, overlapped with the sends.
    dgx1 = load_topology("dgx1-v100")
    fab = collectives.fabric(dgx1)
    kernel = collectives.kernel_of(dgx1)
    assert kernel.launch_s == 5e-6
    s = 64 * MIB
    bare = collectives.collective_time("reduce_scatter", s, fab, collectives.PEAK)
    # V100: the lanes are slower than the fold's memory traffic, so only the launch shows
    assert collectives.collective_time("reduce_scatter", s, fab, collectives.PEAK, kernel) \
        == pytest.approx(bare + 5e-6)
    # where memory is the slower, the fused folds set the pace; a gather folds nothing
    slow = collectives.Kernel(5e-6, 100e9)
    assert collectives.collective_time("reduce_scatter", s, fab, collectives.PEAK, slow) == \
        pytest.approx(5e-6 + 3 * 7 / 8 * s / 100e9)
    assert collectives.collective_time("all_gather", s, fab, collectives.PEAK, slow) == \
        pytest.approx(collectives.collective_time("all_gather", s, fab, collectives.PEAK)
                      + 5e-6)


def test_the_nccl_all_to_all_packs_its_strided_blocks_first():
    # A device's column blocks for the others are strided in its rows; NCCL sends contiguous
    # buffers, so the NCCL model pays one pack copy (7/8 of the device's 1/8, read and
    # written) beside its collective, as einsummable's senders pack them.
    a100 = load_topology("a100x8")
    s = 64 * MIB
    kernel = collectives.kernel_of(a100)
    row = patterns.run_pattern("all_to_all", s, a100)
    bare = collectives.collective_time("all_to_all", s, collectives.fabric(a100),
                                       collectives.PEAK, kernel)
    assert row.nccl_s == pytest.approx(bare + kernel.launch_s
                                       + 2 * 7 / 8 * s / 8 / kernel.memory_bw)
    assert patterns.run_pattern("all_gather", s, a100).nccl_s == pytest.approx(
        collectives.collective_time("all_gather", s, collectives.fabric(a100),
                                    collectives.PEAK, kernel))
