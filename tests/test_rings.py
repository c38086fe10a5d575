"""Rings over a mesh (`planning/rings.py`) and several paths at once (`planning/paths.py`):
the packing uses every NVLink lane of the DGX-1 cube and nothing on a switch; every ring and
multipath program delivers exactly the needed regions on random layouts and partial sums; a ring all-gather reaches NCCL's modelled ring time, forwarding from
where the parts landed (no copies); a ring reduce-scatter folds a round after arrival so the
folds overlap the transfers; the lowered programs take what the replay says."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from einsummable.backend.lowering import lower_exchange
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.core.program import Assemble, Recv
from einsummable.frontend.ir import TensorInfo
from einsummable.planning import exchange as exchange_mod
from einsummable.planning import paths, rings
from einsummable.planning.placement import Piece
from einsummable.planning.timing import exchange_time, link_bytes
from einsummable.topology import load_topology

from test_exchange import assert_delivers, folded_sources, random_case

DGX1 = load_topology("dgx1-v100")


def _ring_program(info, pieces, needs, topo, multipath=False):
    """The ring program itself (folds and copies round the rings), not the fastest kept;
    with `multipath`, the plain program sending large blocks over several paths instead."""
    b, sources, remote = folded_sources(info, pieces, needs, topo, rings=not multipath,
                                        multipath=multipath)
    b.path_blocks = paths.blocks_sent(sources, remote)
    if multipath or not rings.ring_copy(b, sources, remote):
        exchange_mod._copy(b, list(sources), remote)
    return b.build()


def test_the_cube_mesh_packs_four_rings_over_its_six_lanes():
    packed = rings.mesh_rings(DGX1, range(8))
    assert sorted(r.bw for r in packed) == [25e9, 25e9, 50e9, 50e9]
    # every arc is a direct NVLink and carries no more than its lanes
    load: dict[tuple[int, int], float] = {}
    for r in packed:
        assert sorted(r.devices) == list(range(8))
        for i, a in enumerate(r.devices):
            b = r.devices[(i + 1) % 8]
            assert DGX1.link(a, b).kind == "nvlink"
            load[(a, b)] = load.get((a, b), 0.0) + r.bw
    assert all(v <= DGX1.link(a, b).bw for (a, b), v in load.items())
    # a quad of the cube is a mesh too (its links have one or two lanes); a switch is not
    assert rings.mesh_rings(DGX1, (0, 1, 2, 3))
    assert rings.mesh_rings(load_topology("a100x8"), range(8)) == ()
    assert rings.mesh_rings(load_topology("pcie4-numa"), range(4)) == ()  # shared PCIe only
    assert rings.mesh_rings(DGX1, (0, 5)) == ()  # two devices: sent directly


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2 ** 31), multipath=st.booleans())
def test_ring_programs_deliver_exactly_what_is_needed(seed, multipath, small_chunks):
    info, pieces, needs, agg, values, truth = random_case(random.Random(seed), 8)
    ex = _ring_program(info, pieces, needs, DGX1, multipath)
    assert_delivers(ex, pieces, needs, agg, values, truth)
    # synthesis keeps the fastest of its programs: never slower than the ring one
    kept = exchange_mod.synthesize(info, pieces, needs, agg, DGX1)
    assert exchange_time(kept, DGX1) <= exchange_time(ex, DGX1) * (1 + 1e-12)


@pytest.fixture(scope="module")
def small_chunks():
    mp = pytest.MonkeyPatch()
    mp.setattr(rings, "CHUNK_BYTES", 8)  # blocks of a few elements are cut round every ring
    mp.setattr(paths, "CHUNK_BYTES", 8)  # and over every path
    yield mp
    mp.undo()


def _all_gather(rows: int, cols: int = 4096):
    info = TensorInfo("w", (rows, cols), "float16")
    pieces = tuple(Piece(((rows * d // 8, rows * (d + 1) // 8), (0, cols)), d, 0, 1)
                   for d in range(8))
    return info, pieces, tuple((((0, rows), (0, cols)), d) for d in range(8))


def test_a_ring_gather_on_the_cube_mesh_runs_at_the_lanes_rate():
    # 64 MiB gathered by all 8 GPUs: each must take in 7/8 of it over six 25 GB/s lanes,
    # 0.391 ms; NCCL's four rings are modelled at 0.405 ms (`experiments/collectives.py`).
    # Down packed trees it took 0.470 ms; round the rings, every arc carries its ring's
    # share, relays forward each piece from where it landed, and no reader copies.
    info, pieces, needs = _all_gather(8192)
    ex = exchange_mod.synthesize(info, pieces, needs, None, DGX1)
    seconds = exchange_time(ex, DGX1)
    assert seconds <= 0.405e-3
    # every received part lands in place, forwarded parts too: a device copies its own block
    assert not ex.copied and all(b == info.nbytes // 8 for _, b, _ in ex.copies)
    assert not [k for k in link_bytes(ex, DGX1) if DGX1.link(*k).kind == "qpi"]
    low = lower_exchange(info, pieces, needs, None, DGX1)
    for p in low.programs:
        received = {ins.out for ins in p.instrs if isinstance(ins, Recv)}
        assert not [ins for ins in p.instrs if isinstance(ins, Assemble)
                    and any(part[0] in received for part in ins.parts)]
    assert simulate_programs(low, DGX1).time_s == pytest.approx(seconds, rel=1e-9)


def test_a_ring_reduce_scatter_folds_while_the_next_part_moves():
    # 256 MiB of partial sums on each GPU, reduce-scattered. Folding each piece the round
    # it arrives put every fold between two transfers (2.49 ms); a round later, a device
    # folds one part while the other moves: near the lanes' 1.57 ms (NCCL's model 1.58 ms,
    # which charges its fused folds nothing).
    info = TensorInfo("p", (32768, 4096), "float16")
    full = ((0, 32768), (0, 4096))
    pieces = tuple(Piece(full, d, d, 8) for d in range(8))
    needs = tuple((((4096 * d, 4096 * (d + 1)), (0, 4096)), d) for d in range(8))
    ring = _ring_program(info, pieces, needs, DGX1)
    seconds = exchange_time(ring, DGX1)
    assert seconds < 1.15 * 1.58e-3
    # the same program folding in the round of arrival is slower by a fold per round
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rings, "FOLD_LAG", 0)
        eager = exchange_time(_ring_program(info, pieces, needs, DGX1), DGX1)
    assert eager > 1.3 * seconds
    ex = exchange_mod.synthesize(info, pieces, needs, "sum", DGX1)
    assert exchange_time(ex, DGX1) <= seconds
    low = lower_exchange(info, pieces, needs, "sum", DGX1)
    assert simulate_programs(low, DGX1).time_s == pytest.approx(exchange_time(ex, DGX1),
                                                                 rel=0.03)


def test_an_all_to_all_on_the_cube_mesh_spreads_over_several_paths():
    # 1 GiB all-to-all: each pair's 16 MiB block (strided: a column block of a row block) sent
    # over its one route took 3.75 ms; in chunks over the direct link and every two-hop path,
    # water-filled against the links' loads, the single lanes and fixed relays are relieved.
    # The cut between the two quads (six lanes and the QPI link, 166 GB/s) bounds it: 1.62 ms.
    info = TensorInfo("a", (131072, 4096), "float16")
    rows = lambda d: (16384 * d, 16384 * (d + 1))  # noqa: E731
    pieces = tuple(Piece((rows(d), (0, 4096)), d, 0, 1) for d in range(8))
    needs = tuple((((0, 131072), (512 * d, 512 * (d + 1))), d) for d in range(8))
    b = exchange_mod._synthesis(info, pieces, DGX1, "optimized", False)
    exchange_mod._copy(b, [(p.region, p.device, -1) for p in pieces], list(needs))
    plain = exchange_time(b.build(), DGX1)
    spread = _ring_program(info, pieces, needs, DGX1, multipath=True)
    assert len({t.hops for t in spread.transfers if (t.src, t.dst) == (0, 5)}) >= 2
    assert exchange_time(spread, DGX1) < 0.85 * plain
    kept = exchange_mod.synthesize(info, pieces, needs, None, DGX1)
    assert exchange_time(kept, DGX1) <= exchange_time(spread, DGX1)
