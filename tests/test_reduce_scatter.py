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


def test_chunked_fold_runs_exactly():
    b = es.Builder()
    x, w = b.input("x", (512, 256)), b.weight("w", (256, 1024))
    y = b.einsum("ik,kj->ij", x, w)          # k split: partial results of 2 MiB
    z = b.map(arg(0) * 2.0, y)               # every device reads all of y
    g = b.build([z])
    mm, ew = g.ops
    devs = list(range(4))
    choice = {mm.name: place(mm, {"k": 4}, devs), ew.name: place(ew, {}, devs),
              INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {"b": 4}, devs),
              INPUT_PREFIX + "w": place(input_op(g.tensor("w")), {"a": 4}, devs)}
    low = lower(g, choice, synthetic(4))
    torch.manual_seed(0)
    inputs = {"x": torch.randn(512, 256), "w": torch.randn(256, 1024)}
    got = run_local(low, inputs)[z.name]
    want = es.evaluate(g, inputs)[z.name]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
