"""Copies over packed trees (`planning/trees.py`): every program delivers exactly the needed
regions, on random layouts, partial sums and world sizes; the trees spread a gather over every
NVLink of the DGX-1 mesh; the programs run as the replay prices them; and a rank's sends to one
peer go one at a time (the line per peer that lets relays pipeline chunks)."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from einsummable.backend import lowering
from einsummable.backend.lowering import lower_exchange
from einsummable.core.geometry import contains
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.frontend.ir import TensorInfo
from einsummable.planning import exchange as exchange_mod
from einsummable.planning import trees
from einsummable.planning.folds import reduce_partials
from einsummable.planning.placement import Piece
from einsummable.planning.timing import exchange_time, link_bytes
from einsummable.topology import load_topology

from helpers import TOPOS
from test_exchange import assert_delivers, random_case


def _tree_program(info, pieces, needs, agg, topo, copy=trees.tree_copy):
    """The packed-tree program itself (not the faster of it and the plain one); with
    `copy=trees.scatter_copy` the scatter-then-gather program (None where it builds none)."""
    b = exchange_mod._synthesis(info, pieces, topo, "optimized", False)
    n_slices = pieces[0].n_slices
    if n_slices > 1:
        b.trees = True  # folds up packed trees too
        sources = reduce_partials(b, pieces, needs, n_slices)
    else:
        sources = [(p.region, p.device, -1) for p in pieces]
    remote = [(q, d) for q, d in needs
              if not any(dev == d and contains(r, q) for r, dev, _ in sources)]
    if copy(b, sources, remote) is False:
        return None
    return b.build()


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.sampled_from(sorted(TOPOS)),
       scatter=st.booleans())
def test_tree_programs_deliver_exactly_what_is_needed(seed, n, scatter, monkeypatch_module):
    # Chunks of a few elements, so that blocks are cut and relayed chunk by chunk.
    topo = TOPOS[n]
    info, pieces, needs, agg, values, truth = random_case(random.Random(seed), n)
    ex = _tree_program(info, pieces, needs, agg, topo,
                       trees.scatter_copy if scatter else trees.tree_copy)
    if ex is None:
        return
    assert_delivers(ex, pieces, needs, agg, values, truth)
    # where synthesis weighs the packed-tree program (a block with several remote readers)
    # the program it keeps is never slower
    if pieces[0].n_slices == 1 and trees.worth_trees(
            [(p.region, p.device, -1) for p in pieces],
            [(q, d) for q, d in needs
             if not any(p.device == d and contains(p.region, q) for p in pieces)]):
        kept = exchange_mod.synthesize(info, pieces, needs, agg, topo)
        assert exchange_time(kept, topo) <= exchange_time(ex, topo) * (1 + 1e-12)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    mp.setattr(trees, "CHUNK_BYTES", 8)
    yield mp
    mp.undo()


def _all_gather(world: int, rows: int, cols: int = 4096):
    info = TensorInfo("w", (rows, cols), "float16")
    pieces = tuple(Piece(((rows * d // world, rows * (d + 1) // world), (0, cols)), d, 0, 1)
                   for d in range(world))
    return info, pieces, tuple((((0, rows), (0, cols)), d) for d in range(world))


def test_a_gather_on_the_cube_mesh_spreads_over_every_nvlink():
    # 64 MiB gathered by all 8 GPUs of a DGX-1: each device must take in 7/8 of it over its
    # six NVLink lanes (150 GB/s): 0.391 ms at least. Sent from each holder to each reader,
    # relayed where the mesh has no link, it took 1.68 ms; down packed trees the lanes carry
    # even loads and relays forward 1 MiB chunks as they come.
    topo = load_topology("dgx1-v100")
    info, pieces, needs = _all_gather(8, 8192)
    ex = _tree_program(info, pieces, needs, None, topo)
    seconds = exchange_time(ex, topo)
    assert seconds < 0.55e-3
    nvlinks = {k: v for k, v in link_bytes(ex, topo).items() if topo.link(*k).kind == "nvlink"}
    per_lane = [v / (topo.link(*k).bw / 25e9) for k, v in nvlinks.items()]
    assert len(nvlinks) == 32 and max(per_lane) <= 1.1 * sum(per_lane) / len(per_lane)
    assert not [k for k in link_bytes(ex, topo) if topo.link(*k).kind == "qpi"]
    assert max(t.nbytes for t in ex.transfers) <= 1 << 20  # 1 MiB chunks
    # synthesis keeps it or a faster program (round the rings, `test_rings.py`), and the
    # lowered programs take what the replay says
    kept = exchange_mod.synthesize(info, pieces, needs, None, topo)
    assert exchange_time(kept, topo) <= seconds
    low = lower_exchange(info, pieces, needs, None, topo)
    assert simulate_programs(low, topo).time_s == pytest.approx(exchange_time(kept, topo),
                                                                 rel=1e-9)


def test_a_broadcast_leaves_its_root_once_per_chunk_on_a_switch():
    # On NVSwitch a root sending to 7 readers would put 7 copies through its one port; down
    # trees each chunk leaves the root once or twice and the readers pass it on.
    topo = load_topology("a100x8")
    info = TensorInfo("w", (4096, 4096), "float16")
    root = (Piece(((0, 4096), (0, 4096)), 0, 0, 1),)
    needs = tuple((((0, 4096), (0, 4096)), d) for d in range(8))
    ex = exchange_mod.synthesize(info, root, needs, None, topo)
    out_of_root = sum(v for (a, _), v in link_bytes(ex, topo).items() if a == 0)
    assert out_of_root < 3 * info.nbytes
    direct = 7 * info.nbytes / 300e9
    assert exchange_time(ex, topo) < 0.5 * direct


def test_a_ranks_sends_to_one_peer_go_one_at_a_time():
    # Two 8 MiB blocks from 0 to 1 over one 25 GB/s lane, each forwarded to 3 over another:
    # the first arrives after its own 0.34 ms (not after both, as two flows sharing the lane
    # would), so 1 forwards it while the second is on its way: 3 block times, not 4.
    topo = load_topology("dgx1-v100")
    info = TensorInfo("w", (2048, 4096), "float16")
    half = lambda i: ((1024 * i, 1024 * (i + 1)), (0, 4096))  # noqa: E731
    pieces = (Piece(((0, 2048), (0, 4096)), 0, 0, 1),)
    ex = exchange_mod._synthesis(info, pieces, topo, "optimized", False)
    for i in range(2):
        r = ex.send(0, 1, half(i), -1, hops=(0, 1), within=((0, 2048), (0, 4096)))
        ex.send(1, 3, half(i), r, hops=(1, 3))
    ex.stitch(((0, 2048), (0, 4096)), 3, [(half(0), True), (half(1), True)])
    program = ex.build()
    block = info.nbytes / 2 / 25e9
    seconds = exchange_time(program, topo)
    assert 3 * block < seconds < 3.2 * block


def test_partial_sums_on_the_cube_mesh_fold_up_packed_trees():
    # 64 MiB of partial sums on each of 8 DGX-1 GPUs, reduce-scattered: each chunk's partials
    # fold up a tree toward its reader, every member adding its own before passing one value
    # on, so no lane carries a chunk twice (sent straight to the reader, relayed where the mesh
    # has no link, it took 2.38 ms).
    topo = load_topology("dgx1-v100")
    info = TensorInfo("p", (8192, 4096), "float16")
    full = ((0, 8192), (0, 4096))
    pieces = tuple(Piece(full, d, d, 8) for d in range(8))
    needs = tuple((((1024 * d, 1024 * (d + 1)), (0, 4096)), d) for d in range(8))
    ex = _tree_program(info, pieces, needs, "sum", topo)
    seconds = exchange_time(ex, topo)
    assert seconds < 1.0e-3
    assert any(r.n_inputs > 2 for r in ex.reduces)  # folded on the way, not only at readers
    # synthesis keeps it or a faster program (round the rings, `test_rings.py`); lowered,
    # the tree program takes what the replay says, within the replay's tolerance
    # (`test_replay.py`: its reduces are priced alone, the simulator's beside the flows)
    assert exchange_time(exchange_mod.synthesize(info, pieces, needs, "sum", topo), topo) \
        <= seconds
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lowering, "synthesize", lambda *args, **kw: ex)
        low = lower_exchange(info, pieces, needs, "sum", topo)
    assert simulate_programs(low, topo).time_s == pytest.approx(seconds, rel=0.03)


def test_a_broadcast_on_a_switch_scatters_then_gathers():
    """64 MiB from one GPU to all 8 of an NVSwitch box: the root sends each chunk to one
    reader, which sends it to the six others, so the root's port carries the block once and
    a reader copies only what it forwards (packed trees relaying most of the block took 0.405
    ms, the NCCL model 0.245); the lowered programs take what the replay says."""
    topo = load_topology("a100x8")
    info = TensorInfo("w", (8192, 4096), "float16")
    root = (Piece(((0, 8192), (0, 4096)), 0, 0, 1),)
    needs = tuple((((0, 8192), (0, 4096)), d) for d in range(8))
    ex = exchange_mod.synthesize(info, root, needs, None, topo)
    relays = {t.src for t in ex.transfers} - {0}
    assert relays == set(range(1, 8))
    assert sum(v for (a, _), v in link_bytes(ex, topo).items() if a == 0) == info.nbytes
    seconds = exchange_time(ex, topo)
    assert seconds < 1.2 * info.nbytes / 300e9  # the root's port carries the block once
    low = lower_exchange(info, root, needs, None, topo)
    assert simulate_programs(low, topo).time_s == pytest.approx(seconds, rel=1e-9)
