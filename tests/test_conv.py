"""Convolution and pooling as windowed ops: every decomposition (batch, groups, out and in
channels, output positions; stride, padding, dilation, groups, uneven sizes) equals torch's
own op and the reference; tuples read their output block's window, so a spatial split
fetches exactly the halo; lowered plans run on the local backend equal the reference; the
cost model prices a block by its share of the FLOPs."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st

from einsummable.backend.lowering import lower
from einsummable.backend.runtime.local import run_local
from einsummable.errors import ShapeError
from einsummable.frontend.builder import Builder
from einsummable.frontend.ir import Graph
from einsummable.frontend.reference import evaluate, evaluate_op
from einsummable.frontend.windowed import conv_op, pool_op
from einsummable.frontend.windows import out_extent
from einsummable.planning.cost import compute_cost
from einsummable.planning.exchange import synthesize
from einsummable.planning.placement import (input_needs, input_op, output_layout, place,
                                            random_choice)
from einsummable.planning.spec import Decomposition, decompositions, tuples
from einsummable.topology import synthetic

from helpers import TOPOS, evaluate_by_tuples, inputs_for, rel_err

TOL = 1e-5


@st.composite
def conv_cases(draw):
    """A convolution whose every output's window meets the input (torch's own constraint
    for padding at most the kernel's reach), 1 or 2 spatial dims, uneven sizes."""
    nd = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    c, o, batch = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    spatial = [draw(st.integers(3, 9)) for _ in range(nd)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilation = [draw(st.integers(1, 2)) for _ in range(nd)]
    padding = [draw(st.integers(0, (k - 1) * d)) for k, d in zip(kernel, dilation)]
    for h, k, s, d, p in zip(spatial, kernel, stride, dilation, padding):
        y = out_extent(h, k, s, d, p, p)
        assume(y >= 1 and (y - 1) * s - p < h)
    bias = draw(st.booleans())
    return dict(x=(batch, groups * c, *spatial), w=(groups * o, c, *kernel), bias=bias,
                stride=stride, padding=padding, dilation=dilation, groups=groups)


def _conv(case, name="conv"):
    return conv_op(name, "x", "w", "bias" if case["bias"] else None, "y", case["x"], case["w"],
                   stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
                   groups=case["groups"])


def _tensors(case, seed):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(case["x"], generator=gen), torch.randn(case["w"], generator=gen)]
    if case["bias"]:
        xs.append(torch.randn(case["w"][0], generator=gen))
    return xs


def _torch_conv(case, xs):
    fn = F.conv1d if len(case["x"]) == 3 else F.conv2d
    return fn(xs[0], xs[1], xs[2] if case["bias"] else None, case["stride"], case["padding"],
              case["dilation"], case["groups"])


@settings(max_examples=60)
@given(case=conv_cases(), n=st.sampled_from([2, 3, 4, 6]), seed=st.integers(0, 2 ** 16))
def test_every_conv_decomposition_equals_torch(case, n, seed):
    op = _conv(case)
    xs = _tensors(case, seed)
    want = _torch_conv(case, xs)
    assert rel_err(evaluate_op(op, xs), want) <= TOL
    decs = [d for d in decompositions(op, n, replication=False)]
    assert all(set(d.split_modes()) <= set(op.splittable) for d in decs)
    for dec in random.Random(seed).sample(decs, min(len(decs), 6)):
        got = evaluate_by_tuples(op, dec, xs)
        assert rel_err(got, want) <= TOL, str(dec)


def test_splits_cover_batch_channels_and_positions():
    # Every kind of split the op allows is among its decompositions, and none of the window,
    # tap or input-position modes ever splits.
    case = dict(x=(2, 4, 8, 8), w=(6, 2, 3, 3), bias=True, stride=[1, 1], padding=[1, 1],
                dilation=[1, 1], groups=2)
    op = _conv(case)
    split = {m for d in decompositions(op, 4) for m in d.split_modes()}
    assert split == {"b", "g", "o", "c", "y", "x"}
    assert not split & {"h", "w", "k", "l"}


@pytest.mark.parametrize("k,s,d,p", [(3, 1, 1, 1), (3, 2, 1, 1), (3, 1, 2, 2), (5, 2, 1, 0),
                                     (1, 1, 1, 0), (2, 2, 1, 0)])
def test_tuple_reads_its_window(k, s, d, p):
    # Output rows [y0, y1) read input rows [y0 s - p, (y1 - 1) s + (k - 1) d - p + 1)
    # clipped to the input, and neighbouring blocks overlap by the halo (k - 1) d - s + 1.
    h = 17
    case = dict(x=(1, 2, h), w=(3, 2, k), bias=False, stride=[s], padding=[p], dilation=[d],
                groups=1)
    op = _conv(case)
    y = op.size["x"]
    dec = Decomposition(tuple((m, 3 if m == "x" else 1) for m in op.modes))
    ts = tuples(op, dec)
    for t in ts:
        y0, y1 = t.range_of(op)["x"]
        lo = max(0, y0 * s - p)
        hi = min(h, (y1 - 1) * s + (k - 1) * d - p + 1)
        assert t.in_regions[0] == ((0, 1), (0, 2), (lo, hi))
    overlap = ts[0].in_regions[0][2][1] - ts[1].in_regions[0][2][0]
    assert overlap == (k - 1) * d - s + 1 or (overlap <= 0 and (k - 1) * d - s + 1 <= 0)
    assert sum(t.out_region[2][1] - t.out_region[2][0] for t in ts) == y


def test_spatial_split_exchanges_the_halo_only():
    # Input and conv both split the rows in two: each device holds its rows and receives
    # exactly the halo rows it lacks from its neighbour, nothing else.
    b, c, h, w = 1, 4, 16, 8
    case = dict(x=(b, c, h, w), w=(4, c, 3, 3), bias=False, stride=[1, 1], padding=[1, 1],
                dilation=[1, 1], groups=1)
    op = _conv(case)
    info = Builder().input("x", (b, c, h, w)).info
    iop = input_op(info)
    held = output_layout(iop, place(iop, {iop.modes[2]: 2}, [0, 1]))  # rows [0, 8), [8, 16)
    cand = place(op, {"y": 2}, [0, 1])
    needs = input_needs(op, cand, 0)
    assert [r[2] for r, _ in needs] == [(0, 9), (7, 16)]
    ex = synthesize(info, held, needs, None, synthetic(2))
    row_bytes = b * c * w * 4
    assert ex.nbytes == 2 * row_bytes  # one halo row each way
    assert {(t.src, t.dst) for t in ex.transfers} == {(0, 1), (1, 0)}


def test_split_channels_fold_partial_sums_and_add_bias_once():
    case = dict(x=(2, 6, 7, 5), w=(4, 6, 3, 3), bias=True, stride=[2, 1], padding=[1, 0],
                dilation=[1, 1], groups=1)
    op = _conv(case)
    xs = _tensors(case, 3)
    dec = Decomposition(tuple((m, 3 if m == "c" else 1) for m in op.modes))
    assert len({t.agg_slice for t in tuples(op, dec)}) == 3
    assert rel_err(evaluate_by_tuples(op, dec, xs), _torch_conv(case, xs)) <= TOL


@settings(max_examples=30)
@given(case=conv_cases(), kind=st.sampled_from(["max", "avg", "avg_exclusive"]),
       n=st.sampled_from([2, 3, 4]), seed=st.integers(0, 2 ** 16))
def test_pool_decompositions_equal_torch(case, kind, n, seed):
    shape, kernel = case["x"], case["w"][2:]
    nd = len(shape) - 2
    dil = case["dilation"] if kind == "max" else [1] * nd
    pad = [min(p, k // 2) for p, k in zip(case["padding"], kernel)]  # torch: at most k / 2
    for h, k, s, d, p in zip(shape[2:], kernel, case["stride"], dil, pad):
        y = out_extent(h, k, s, d, p, p)
        assume(y >= 1 and (y - 1) * s - p < h and p <= (k - 1) * d)
    op = pool_op("pool", kind[:3], "x", "y", shape, kernel, stride=case["stride"], padding=pad,
                 dilation=dil, count_include_pad=kind == "avg")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if kind == "max":
        fn = F.max_pool1d if nd == 1 else F.max_pool2d
        want = fn(x, kernel, case["stride"], pad, dil)
    else:
        fn = F.avg_pool1d if nd == 1 else F.avg_pool2d
        want = fn(x, kernel, case["stride"], pad, count_include_pad=kind == "avg")
    assert rel_err(evaluate_op(op, [x]), want) <= TOL
    for dec in decompositions(op, n, replication=False):
        assert rel_err(evaluate_by_tuples(op, dec, [x]), want) <= TOL, str(dec)


def _conv_net(batch=2, chans=4, size=(9, 7)):
    """conv (bias) -> relu -> grouped strided conv, and a max pool and an average pool of the
    relu beside it: three readers of one activation, the first (the head whose needs the
    later readers' come from) through no window."""
    b = Builder()
    x = b.input("x", (batch, chans, *size))
    w1, bias = b.weight("w1", (6, chans, 3, 3)), b.weight("bias", (6,))
    h = b.conv(x, w1, bias, padding=1).relu()
    a = b.pool(h * 2.0, "avg", 2, count_include_pad=False)
    z = b.conv(h, b.weight("w2", (4, 3, 3, 2)), stride=2, padding=(1, 0), groups=2,
               dilation=(1, 2))
    m = b.pool(h, "max", 3, stride=2, padding=1)
    return b.build([z, m, a])


@settings(max_examples=40)
@given(seed=st.integers(0, 2 ** 31), n=st.sampled_from(sorted(TOPOS)),
       mode=st.sampled_from(["optimized", "naive"]))
def test_lowered_conv_plans_equal_reference(seed, n, mode):
    g = _conv_net()
    choice = random_choice(g, n, random.Random(seed), scatter=0.25)
    ins = inputs_for(g, seed)
    got = run_local(lower(g, choice, TOPOS[n], mode=mode), ins)
    want = evaluate(g, ins)
    for name in g.outputs:
        assert rel_err(got[name], want[name]) <= TOL


def test_reference_net_equals_torch():
    g = _conv_net()
    ins = inputs_for(g, 1)
    out = evaluate(g, ins)
    h = F.relu(F.conv2d(ins["x"], ins["w1"], ins["bias"], padding=1))
    want = [F.conv2d(h, ins["w2"], None, 2, (1, 0), (1, 2), 2), F.max_pool2d(h, 3, 2, 1),
            F.avg_pool2d(h * 2.0, 2, count_include_pad=False)]
    for name, w in zip(g.outputs, want):
        assert rel_err(out[name], w) <= TOL


def test_graph_with_windows_round_trips_through_json():
    g = _conv_net()
    back = Graph.from_json(g.to_json())
    assert back == g
    assert "windows" not in g.to_dict()["ops"][1]  # the relu: no key where no window


def test_block_prices_its_share_of_the_flops():
    # A spatial split's blocks do the op's FLOPs between them (the windowed mode is not
    # counted twice), and a split in two costs about half the FLOP time of the whole.
    case = dict(x=(1, 8, 32, 32), w=(8, 8, 3, 3), bias=True, stride=[1, 1], padding=[1, 1],
                dilation=[1, 1], groups=1)
    op = _conv(case)
    assert op.flops == 2 * 8 * 32 * 32 * 8 * 9 + 8 * 32 * 32
    for parts in ({"y": 4}, {"o": 2, "x": 2}, {"c": 4}, {"y": 3}):
        dec = Decomposition(tuple((m, parts.get(m, 1)) for m in op.modes))
        assert math.isclose(sum(op.share(t.ranges) for t in tuples(op, dec)), 1.0)
    b = Builder()
    x = b.input("x", case["x"])
    g = b.build([b.conv(x, b.weight("w", case["w"]), b.weight("bias", (8,)), padding=1)])
    gop = g.ops[0]
    topo = synthetic(2)
    whole = compute_cost(gop, place(gop, {}, [0]), g, topo)
    half = compute_cost(gop, place(gop, {"y": 2}, [0, 1]), g, topo)
    assert math.isclose(half.flop_s, whole.flop_s / 2, rel_tol=1e-9)


def test_bad_windows_are_named_errors():
    with pytest.raises(ShapeError, match="padding"):
        conv_op("c", "x", "w", None, "y", (1, 2, 5, 5), (2, 2, 3, 3), padding=3)
    with pytest.raises(ShapeError, match="groups"):
        conv_op("c", "x", "w", None, "y", (1, 3, 5, 5), (2, 2, 3, 3), groups=2)
    with pytest.raises(ShapeError, match="smaller than the kernel"):
        conv_op("c", "x", "w", None, "y", (1, 2, 2, 2), (2, 2, 3, 3))
    with pytest.raises(ShapeError, match="dilation"):
        pool_op("p", "avg", "x", "y", (1, 2, 6, 6), 2, dilation=2)


def test_optimizer_picks_a_spatial_split_with_halo_at_batch_one():
    # A high-resolution stack at batch 1 on a100x8 (data parallel impossible): the MIP's plan
    # splits the positions and exchanges halos, its objective below the forced channel
    # splits' (whose every layer gathers or reduce-scatters a whole activation), and the
    # simulator agrees with the objective on each plan.
    from einsummable.topology import load_topology
    from experiments.conv_spatial import OPTIMUM, compare, conv_stack
    g = conv_stack(16, 512, 512, 2)
    res = {r.name: r for r in compare(g, load_topology("a100x8"))}
    best = res[OPTIMUM]
    conv = [op.name for op in g.ops if op.fused == "conv"]
    assert all(best.splits[c].split(": ")[1] in ("y/8", "x/8") for c in conv), best.splits
    assert best.objective_s <= res["spatial"].objective_s * (1 + 1e-9)
    for other in ("out-channels", "in-channels", "one-device"):
        assert best.objective_s < res[other].objective_s
        assert best.simulated_s < res[other].simulated_s
    for r in res.values():
        assert abs(r.simulated_s - r.objective_s) <= 0.1 * r.objective_s, r.name


def test_blocks_pad_only_at_the_true_borders():
    # Rows of 10 outputs of a 3-tap window (padding 1) cut in three: the first block pads one
    # row before, the last one row after, the middle none; each then reads exactly its window.
    from einsummable.frontend.windows import Window
    win = Window("h", "y", kernel=3, stride=1, dilation=1, padding=1)
    blocks = [(0, 4), (4, 7), (7, 10)]
    got = [win.pads(out, win.read(out, 10)) for out in blocks]
    assert [(before, after) for _, _, before, after in got] == [(1, 0), (0, 0), (0, 1)]
    assert [take for _, take, _, _ in got] == [5, 5, 4]
    # A block holding more rows than its window (the whole input) skips the rest.
    assert win.pads((4, 7), (0, 10)) == (3, 5, 0, 0)


def test_a_read_through_a_window_heads_no_reread():
    # Later readers take their blocks from the head's needs, which must form a layout; a
    # window's needs overlap (the halo), so a windowed first reader is no head.
    from einsummable.planning.placement import rereads
    g = _conv_net()
    relu = g.ops[1].output
    assert rereads(g)[relu] == g.ops[2].name and g.ops[2].fused is None  # the map heads
    b = Builder()
    h = b.input("x", (1, 2, 6, 6)).relu()
    g2 = b.build([b.conv(h, b.weight("w", (2, 2, 3, 3)), padding=1), h * 2.0])
    assert h.name not in rereads(g2)
