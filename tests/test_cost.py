"""The cost model: named compute terms, and edge prices that are the exchange synthesiser's."""
from __future__ import annotations

import itertools
import math

import pytest

from einsummable.frontend.builder import Builder
from einsummable.planning.cost import CostModel, compute_cost, consumer_needs, finished_needs
from einsummable.optimizer.pricing import EdgePricer, edge_cost
from einsummable.planning.timing import exchange_time, link_bytes
from einsummable.planning.exchange import synthesize
from einsummable.planning.placement import output_layout, place
from einsummable.topology import load_topology, synthetic


def _matmul(m=512, k=1024, n=256, dtype="float16"):
    b = Builder(dtype)
    x = b.input("x", (m, k))
    w = b.weight("w", (k, n))
    y = b.einsum("mk,kn->mn", x, w)
    z = y.relu()
    return b.build([z])


# A device with round figures: 1 TFLOP/s in fp16, 100 GB/s of memory, 1 us a kernel.
def _round_device_topology(n=2):
    return synthetic(n, peak_flops={"float16": 1e12, "bfloat16": 1e12, "float32": 0.5e12},
                     mem_bw=1e11, launch_s=1e-6)


def test_compute_terms_are_named_and_roofline():
    # 512x1024 @ 1024x256 in fp16: 2*512*1024*256 = 268435456 FLOP, and it reads and writes
    # 2 bytes x (512*1024 + 1024*256 + 512*256) = 1835008 bytes.
    g = _matmul()
    topo = _round_device_topology()
    op = g.ops[0]
    c = compute_cost(op, place(op, {}, [0]), g, topo)
    assert c.flop_s == pytest.approx(268.435456e-6, rel=1e-12)
    assert c.memory_s == pytest.approx(18.35008e-6, rel=1e-12)
    assert c.launch_s == 1e-6 and c.kernels == 1
    assert c.total_s == pytest.approx(268.435456e-6 + 1e-6, rel=1e-12)  # compute-bound
    # Half the sustained FLOP rate doubles the FLOP time, a quarter of the memory rate
    # quadruples the memory time.
    slow = compute_cost(op, place(op, {}, [0]), g, topo,
                        CostModel(flop_efficiency=0.5, mem_efficiency=0.25))
    assert slow.flop_s == pytest.approx(2 * 268.435456e-6, rel=1e-12)
    assert slow.memory_s == pytest.approx(4 * 18.35008e-6, rel=1e-12)


@pytest.mark.parametrize("tokens,bound", [(8, "memory"), (16, "compute")])
def test_roofline_turns_compute_bound_as_tokens_grow(tokens, bound):
    # tokens x 1024 @ 1024 x 1024 in fp16 on 1 TFLOP/s and 100 GB/s: the 2 MiB weight is read
    # whatever the tokens; FLOPs grow with them. 8 tokens: 16.777216 us of FLOPs against
    # 2 x (8192 + 1048576 + 8192) B = 21.2992 us of memory; 16 tokens: 33.554432 us
    # against 21.62688 us.
    g = _matmul(m=tokens, k=1024, n=1024)
    op = g.ops[0]
    c = compute_cost(op, place(op, {}, [0]), g, _round_device_topology())
    want_flop = {8: 16.777216e-6, 16: 33.554432e-6}[tokens]
    want_mem = {8: 21.2992e-6, 16: 21.62688e-6}[tokens]
    assert c.flop_s == pytest.approx(want_flop, rel=1e-12)
    assert c.memory_s == pytest.approx(want_mem, rel=1e-12)
    limit = want_mem if bound == "memory" else want_flop
    assert c.total_s == pytest.approx(limit + 1e-6, rel=1e-12)


def test_split_halves_the_work_and_replication_does_not():
    g = _matmul()
    topo = _round_device_topology()
    op = g.ops[0]
    whole = compute_cost(op, place(op, {}, [0]), g, topo)
    split = compute_cost(op, place(op, {"m": 2}, [0, 1]), g, topo)
    repl = compute_cost(op, place(op, {}, [0, 1]), g, topo)
    assert split.flop_s == pytest.approx(whole.flop_s / 2)
    # each device reads half of x, all of w and writes half of the output
    assert split.memory_s == pytest.approx(2 * (256 * 1024 + 1024 * 256 + 256 * 256) / 1e11)
    assert split.total_s == pytest.approx(whole.flop_s / 2 + 1e-6)
    assert repl.total_s == pytest.approx(whole.total_s)
    # the two halves on one device: all the FLOPs there, in two kernels
    both = compute_cost(op, place(op, {"m": 2}, [0, 0]), g, topo)
    assert both.kernels == 2 and both.flop_s == pytest.approx(whole.flop_s)
    assert both.total_s == pytest.approx(whole.total_s + 1e-6)


def test_views_are_free():
    b = Builder("float32")
    x = b.input("x", (4, 6))
    y = x.reshape(2, 2, 6)
    g = b.build([y])
    op = g.ops[0]
    assert op.is_view
    assert compute_cost(op, place(op, {}, [0]), g, synthetic(2)).total_s == 0.0


@pytest.mark.parametrize("topo_name", ["a100x8", "dgx1-v100", "pcie4-numa"])
def test_edge_price_is_the_synthesised_exchange(topo_name):
    topo = load_topology(topo_name)
    n = topo.world_size
    g = _matmul(m=64, k=128, n=32)
    mm, relu = g.ops
    devs = list(range(n))
    info = g.tensor(mm.output)
    pricer = EdgePricer(topo)
    for pc in (place(mm, {"k": n}, devs), place(mm, {"m": n}, devs), place(mm, {"n": 2, "k": n // 2}, devs)):
        for cc in (place(relu, {"a": n}, devs), place(relu, {"b": 2}, devs[:2]),
                   place(relu, {"b": 2}, devs), place(relu, {}, devs)):
            got = edge_cost(info, mm, pc, relu, cc, pricer)
            ex = synthesize(info, output_layout(mm, pc), consumer_needs(relu, cc, mm.output),
                            mm.agg, topo)
            assert got.seconds == exchange_time(ex, topo)
            assert got.nbytes == ex.nbytes == sum(
                t.nbytes for t in ex.transfers)
            assert sum(link_bytes(ex, topo).values()) >= got.nbytes


def test_same_layout_is_free_and_partials_are_not():
    topo = synthetic(4)
    g = _matmul(m=64, k=128, n=32)
    mm, relu = g.ops
    info = g.tensor(mm.output)
    pricer = EdgePricer(topo)
    devs = [0, 1, 2, 3]
    same = edge_cost(info, mm, place(mm, {"m": 4}, devs), relu, place(relu, {"a": 4}, devs), pricer)
    assert same.seconds == 0.0 and same.nbytes == 0
    partial = edge_cost(info, mm, place(mm, {"k": 4}, devs), relu, place(relu, {"a": 4}, devs),
                        pricer)
    assert partial.seconds > 0 and partial.nbytes > 0
    # folding a partial output where it lies costs an exchange too
    lay = output_layout(mm, place(mm, {"k": 4}, devs))
    assert pricer.price(info, lay, finished_needs(lay), "sum").seconds > 0


def test_parallel_prefetch_matches_serial(monkeypatch):
    topo = synthetic(4)
    g = _matmul(m=64, k=128, n=32)
    mm, relu = g.ops
    info = g.tensor(mm.output)
    devs = [0, 1, 2, 3]
    from einsummable.planning.spec import decompositions
    keys = []
    for d1 in decompositions(mm, 4):
        for d2 in decompositions(relu, 4):
            pc, cc = place(mm, d1.part, devs), place(relu, d2.part, devs)
            keys.append(EdgePricer.key(info, output_layout(mm, pc),
                                       consumer_needs(relu, cc, mm.output), mm.agg))
    serial = EdgePricer(topo, workers=1)
    serial.prefetch(keys)
    par = EdgePricer(topo, workers=2)
    monkeypatch.setattr("einsummable.optimizer.pricing.PARALLEL_MIN_PAIRS", 1)
    par.prefetch(keys)
    assert all(serial.known(k) == par.known(k) is not None for k in keys)
    assert not math.isnan(sum(v.seconds for v in serial._memo.values()))


def _random_layouts(g, n: int, rng) -> tuple[list, list]:
    """Every layout of the matmul's output and every needs of the relu reading it, on
    shuffled devices (replicas and partial sums among them)."""
    from einsummable.planning.spec import decompositions
    mm, relu = g.ops
    lays, needs = [], []
    for d in decompositions(mm, n, replication=True):
        devs = list(range(n))
        rng.shuffle(devs)
        lays.append(output_layout(mm, place(mm, d.part, devs[:d.n_tuples * (n // d.n_tuples)])))
    for d in decompositions(relu, n, replication=True):
        devs = list(range(n))
        rng.shuffle(devs)
        needs.append(consumer_needs(relu, place(relu, d.part, devs), mm.output))
    return lays, needs


def test_matrix_bounds_equal_the_bound_of_each_cell():
    # the optimizer bounds a whole edge matrix at once (`bound.matrix_bounds`); every cell
    # must get exactly what `exchange_lower_bound` states for it: real layouts (replicas,
    # partial sums) and random boxes that overlap (the cell-by-cell fallback)
    import random
    from hypothesis import given, settings, strategies as st
    from einsummable.planning.bound import exchange_lower_bound, matrix_bounds
    from einsummable.planning.placement import Piece
    topos = [synthetic(4), synthetic(8, nodes=2), load_topology("dgx1-v100"), load_topology("cpu4")]
    g = _matmul(m=64, k=128, n=32)
    for topo in topos:
        lays, needs = _random_layouts(g, topo.world_size, random.Random(topo.world_size))
        got = matrix_bounds(lays, needs, 2, topo)
        assert got == tuple(tuple(exchange_lower_bound("float16", l, q, topo) for q in needs)
                            for l in lays), topo.name

    @st.composite
    def cells(draw):
        topo = draw(st.sampled_from(topos))
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
        dev = st.integers(0, topo.world_size - 1)
        def box():
            return tuple(tuple(sorted(draw(st.tuples(st.integers(0, m - 1), st.integers(1, m)))))
                         for m in shape)
        def layout():
            k = draw(st.integers(1, 2))
            return tuple(dict.fromkeys(Piece(box(), draw(dev), draw(st.integers(0, k - 1)), k)
                                       for _ in range(draw(st.integers(0, 5)))))
        lays = [layout() for _ in range(draw(st.integers(1, 3)))]
        needs = [tuple(dict.fromkeys((box(), draw(dev)) for _ in range(draw(st.integers(0, 5)))))
                 for _ in range(draw(st.integers(1, 3)))]
        return topo, [l for l in lays if all(b[0] < b[1] for p in l for b in p.region)], \
            [q for q in needs if all(b[0] < b[1] for r, _ in q for b in r)]

    # overlapping boxes held by one device and a need meeting both: its own copy is their
    # union's share of it, not the sum of the two overlaps
    one = synthetic(4)
    lay = (Piece(((0, 4),), 0, 0, 1), Piece(((2, 6),), 0, 0, 1), Piece(((0, 6),), 1, 0, 1))
    need = (((1, 5),), 0), (((0, 6),), 2)
    assert matrix_bounds([lay], [need], 4, one) == \
        ((exchange_lower_bound("float32", lay, need, one),),)

    @settings(max_examples=200, deadline=None, database=None)
    @given(cells())
    def check(c):
        topo, lays, needs = c
        got = matrix_bounds(lays, needs, 4, topo)
        assert got == tuple(tuple(exchange_lower_bound("float32", l, q, topo) for q in needs)
                            for l in lays)
    check()


@pytest.mark.parametrize("topo", [synthetic(4), synthetic(8, nodes=2), load_topology("dgx1-v100"),
                                  load_topology("pcie4-numa"), load_topology("cpu4")],
                         ids=lambda t: t.name)
def test_lazy_bounds_never_exceed_the_exact_price(topo):
    # The optimizer solves on these bounds for unpriced cells; optimality needs bound <= price
    # for the seconds, the local (stitching) part and the copies' device work, partial sums
    # and replicas included.
    import random
    from einsummable.optimizer.pricing import EdgeMatrix
    g = _matmul(m=256, k=512, n=128)
    mm = g.ops[0]
    info = g.tensor(mm.output)
    lays, needs = _random_layouts(g, topo.world_size, random.Random(0))
    pricer = EdgePricer(topo, workers=1)
    m = EdgeMatrix(pricer, info, lays, needs, mm.agg)
    tight = 0
    for r in range(len(lays)):
        for s in range(len(needs)):
            lo = m.estimate(r, s)
            ex = m.exact(r, s)
            assert lo.seconds <= ex.seconds * (1 + 1e-12) + 1e-18
            assert lo.local_s <= ex.local_s * (1 + 1e-12) + 1e-18
            assert lo.copy_s <= ex.copy_s * (1 + 1e-12) + 1e-18  # the copies' device work
            assert lo.seconds - lo.local_s <= (ex.seconds - ex.local_s) * (1 + 1e-12) + 1e-18
            assert lo.in_batch_s <= ex.in_batch_s * (1 + 1e-12) + 1e-18  # weights in one batch
            tight += ex.seconds > 0 and lo.seconds >= 0.5 * ex.seconds
            assert m.estimate(r, s) == ex  # once priced, the estimate is the price
    assert tight > 0  # the bound is informative, not 0 everywhere


def test_weights_in_one_batch_pay_latency_and_messages_once():
    # Where the transport charges per message, lowering sends every weight in one batch; a
    # weight edge then adds only its bytes' time (and folds, stitching) to that batch.
    from einsummable.frontend.ir import TensorInfo
    from einsummable.planning.placement import Piece
    info = TensorInfo("w", (256, 256), "float32")
    full = ((0, 256), (0, 256))
    pieces = [Piece(((64 * d, 64 * (d + 1)), (0, 256)), d, 0, 1) for d in range(4)]
    needs = [(full, d) for d in range(4)]
    gloo = synthetic(4, message_s=1e-3)
    ex = synthesize(info, pieces, needs, None, gloo)
    price = EdgePricer(gloo, workers=1).price(info, pieces, needs, None)
    fixed = ex.n_rounds * (gloo.links[0].latency_s + 2 * 3 * 1e-3)  # 3 peers each way a round
    assert price.batched_s == pytest.approx(exchange_time(ex, gloo, batched=True))
    assert price.seconds - price.batched_s == pytest.approx(fixed)
    nccl = synthetic(4)  # no per-message price: weights stream per op, nothing is batched
    assert EdgePricer(nccl, workers=1).price(info, pieces, needs, None).batched_s is None


def _grid_boxes(draw, shape, st):
    """The blocks of a random grid over `shape` (disjoint), each kept or not."""
    cuts = [sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=3))) | {0, n})
            if n > 1 else [0, n] for n in shape]
    boxes = [tuple(zip(lo, hi)) for lo, hi in zip(
        itertools.product(*[c[:-1] for c in cuts]), itertools.product(*[c[1:] for c in cuts]))]
    return tuple(b for b in boxes if draw(st.booleans()))


def test_uncovered_volume_counts_the_points_outside():
    # The disjoint fast path and the general cutting agree with counting points one by one,
    # on grids (disjoint blocks, as layouts give) and on boxes that overlap.
    import numpy as np
    from hypothesis import given, settings, strategies as st
    from einsummable.planning.bound import _cut_away, uncovered_volume

    @st.composite
    def case(draw):
        shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
        def box():
            return tuple(tuple(sorted(draw(st.tuples(st.integers(0, n), st.integers(0, n)))))
                         for n in shape)
        held = _grid_boxes(draw, shape, st) if draw(st.booleans()) else \
            tuple(box() for _ in range(draw(st.integers(0, 4))))
        needed = _grid_boxes(draw, shape, st) if draw(st.booleans()) else \
            tuple(box() for _ in range(draw(st.integers(1, 4))))
        return shape, needed, held

    @settings(max_examples=300, deadline=None)
    @given(case())
    def check(c):
        shape, needed, held = c
        want, have = np.zeros(shape, bool), np.zeros(shape, bool)
        for q in needed:
            want[tuple(slice(a, b) for a, b in q)] = True
        for h in held:
            have[tuple(slice(a, b) for a, b in h)] = True
        points = int((want & ~have).sum())
        assert uncovered_volume(needed, held) == points
        assert _cut_away(needed, held) == points
    check()


def test_the_boxes_of_a_0d_tensor_are_one_element():
    # a loss is 0-d: its one block is the box (), of volume 1; held, nothing is missing
    from einsummable.planning.bound import _CutBoxes
    boxes = _CutBoxes((((),), ()), (((),),))
    assert boxes.missing().tolist() == [[0.0], [1.0]]
