"""Partial sums read by many devices fold as a reduce-scatter: chunks reduced at different
readers, then multicast. Checked for bytes, time against a ring all-reduce, and numerics."""
import torch

import einsummable as es
from einsummable.planning.timing import exchange_time
from einsummable.planning.exchange import synthesize
from einsummable.frontend.ir import TensorInfo
from einsummable.backend.lowering import lower
from einsummable.planning.placement import INPUT_PREFIX, Piece, input_op, place
from einsummable.backend.runtime.local import run_local
from einsummable.frontend.scalar import arg
from einsummable.topology import synthetic


def test_all_reduce_pattern_spreads_reducers_and_costs_about_a_ring():
    topo = es.load_topology("a100x8")
    info = TensorInfo("t", (8192, 4096), "float16")
    full = ((0, 8192), (0, 4096))
    ex = synthesize(info, [Piece(full, d, d, 8) for d in range(8)],
                    [(full, d) for d in range(8)], "sum", topo)
    assert len({r.device for r in ex.reduces}) == 8
    ring = 2 * 7 / 8 * info.nbytes / topo.link(0, 1).bw
    assert exchange_time(ex, topo) < 1.5 * ring


def _partial_sums_read_by_all(rows: int, k: int, cols: int, n: int):
    """x @ w with k split n ways (partial results), then a map every device reads all of:
    the graph, its choice on n devices, the output, and inputs."""
    b = es.Builder()
    x, w = b.input("x", (rows, k)), b.weight("w", (k, cols))
    y = b.einsum("ik,kj->ij", x, w)
    z = b.map(arg(0) * 2.0, y)
    g = b.build([z])
    mm, ew = g.ops
    devs = list(range(n))
    choice = {mm.name: place(mm, {"k": n}, devs), ew.name: place(ew, {}, devs),
              INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {"b": n}, devs),
              INPUT_PREFIX + "w": place(input_op(g.tensor("w")), {"a": n}, devs)}
    torch.manual_seed(0)
    return g, choice, z.name, {"x": torch.randn(rows, k), "w": torch.randn(k, cols)}


def test_chunked_fold_runs_exactly():
    g, choice, z, inputs = _partial_sums_read_by_all(512, 256, 1024, 4)  # 2 MiB partials
    got = run_local(lower(g, choice, synthetic(4)), inputs)[z]
    torch.testing.assert_close(got, es.evaluate(g, inputs)[z], rtol=1e-5, atol=1e-4)


def test_pipelined_fold_is_kept_where_faster_and_runs_exactly(monkeypatch):
    """Each reducer's chunk (8 MiB here) is cut into parts folded one after another, so a
    reducer folds one while the next arrives; the synthesis keeps that program because the
    replay times it faster, and it computes what the reference does."""
    import einsummable.planning.folds as folds
    from experiments.patterns import pattern

    topo = es.load_topology("a100x8")
    p = pattern("all_reduce", 8, 64 << 20)
    ex = synthesize(p.info, p.produced, p.needs, p.agg, topo)
    assert len(ex.reduces) > 8  # parts, not one fold per reducer
    with monkeypatch.context() as m:
        m.setattr(folds, "FOLD_PARTS", 1)
        whole = synthesize(p.info, p.produced, p.needs, p.agg, topo)
    assert len(whole.reduces) == 8
    assert exchange_time(ex, topo) < 0.95 * exchange_time(whole, topo)

    g, choice, z, inputs = _partial_sums_read_by_all(2048, 64, 2048, 8)  # 16 MiB partials
    low = lower(g, choice, topo)
    assert sum(type(i).__name__ == "Reduce" for prog in low.programs for i in prog.instrs) > 8
    got = run_local(low, inputs)[z]
    torch.testing.assert_close(got, es.evaluate(g, inputs)[z], rtol=1e-5, atol=1e-4)


def test_partial_sums_cross_nodes_on_every_rail():
    """h100x8x2 reduce-scatter: each chunk's partials from the other node fold at the GPU on
    the reducer's rail, so all sixteen NICs carry the crossing, not two GPUs' (0.57 ms
    before, all through GPUs 0 and 8; NCCL's hierarchical ring modelled at 0.24)."""
    from experiments.patterns import pattern

    topo = es.load_topology("h100x8x2")
    p = pattern("reduce_scatter", 16, 64 << 20)
    ex = synthesize(p.info, p.produced, p.needs, p.agg, topo)
    crossing = {(t.hops[i], t.hops[i + 1]) for t in ex.transfers for i in range(len(t.hops) - 1)
                if topo.node_of(t.hops[i]) != topo.node_of(t.hops[i + 1])}
    assert len({a for a, _ in crossing}) == 16
    assert all(a % 8 == b % 8 for a, b in crossing)
