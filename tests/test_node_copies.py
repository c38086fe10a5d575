"""One node's exchange on every node (`planning/node_copies.py`): recognised exactly, built
by translation, delivering every need, and taking one copy's time on the whole machine."""
from __future__ import annotations

import dataclasses
import random

import torch
from hypothesis import given, settings, strategies as st

from einsummable.frontend.ir import TensorInfo
from einsummable.planning.exchange import synthesize
from einsummable.planning.node_copies import split_by_node
from einsummable.planning.placement import Piece
from einsummable.planning.timing import exchange_time
from einsummable.topology import load_topology, synthetic

from test_exchange import assert_delivers, random_case

H100X2 = load_topology("h100x8x2")


def _on_every_node(rng, nodes: int, per: int):
    """A random exchange among one node's `per` devices, repeated on each of `nodes` nodes
    over its own rows of a tensor `nodes` times as tall (as a batch split over nodes)."""
    info, pieces, needs, agg, values, truth = random_case(rng, per)
    rows = truth.shape[0]
    n_slices = pieces[0].n_slices
    all_pieces, all_needs, all_values, truths = [], [], {}, []
    for k in range(nodes):
        parts = [torch.randn(truth.shape) for _ in range(n_slices)]  # this node's values
        for p in pieces:
            moved = Piece(((p.region[0][0] + k * rows, p.region[0][1] + k * rows),)
                          + p.region[1:], p.device + k * per, p.slice, p.n_slices)
            all_pieces.append(moved)
            all_values[(moved.region, moved.device, moved.slice)] = \
                parts[p.slice][tuple(slice(a, b) for a, b in p.region)]
        total = parts[0]
        for part in parts[1:]:
            total = total + part if agg == "sum" else torch.maximum(total, part)
        truths.append(total)
        all_needs += [(((q[0][0] + k * rows, q[0][1] + k * rows),) + q[1:], d + k * per)
                      for q, d in needs]
    tall = TensorInfo(info.name, (rows * nodes,) + tuple(info.shape[1:]), info.dtype)
    return tall, all_pieces, all_needs, agg, all_values, torch.cat(truths)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31), nodes=st.sampled_from([2, 3]), per=st.sampled_from([2, 4]))
def test_one_nodes_exchange_on_every_node_delivers_and_takes_one_copys_time(seed, nodes, per):
    topo = synthetic(nodes * per, nodes=nodes)
    info, pieces, needs, agg, values, truth = _on_every_node(random.Random(seed), nodes, per)
    split = split_by_node(pieces, needs, pieces[0].n_slices, topo)
    assert split is not None and len(split.moves) == nodes - 1
    ex = synthesize(info, pieces, needs, agg, topo)
    assert_delivers(ex, pieces, needs, agg, values, truth)
    if ex:
        assert ex.one_copy is not None
        assert ex.nbytes == nodes * ex.one_copy.nbytes
        # the claim that licenses timing one copy: the copies share nothing, so the whole
        # replays in the time of one
        whole = exchange_time(dataclasses.replace(ex, one_copy=None), topo)
        assert abs(exchange_time(ex, topo) - whole) <= 1e-12 + 1e-9 * whole


def test_on_the_two_node_h100_machine_too():
    info, pieces, needs, agg, values, truth = _on_every_node(random.Random(3), 2, 8)
    ex = synthesize(info, pieces, needs, agg, H100X2)
    assert_delivers(ex, pieces, needs, agg, values, truth)
    if ex:
        whole = exchange_time(dataclasses.replace(ex, one_copy=None), H100X2)
        assert abs(exchange_time(ex, H100X2) - whole) <= 1e-9 * whole


def test_a_need_served_from_another_node_is_not_split():
    topo = synthetic(4, nodes=2)
    info, pieces, needs, agg, values, truth = _on_every_node(random.Random(5), 2, 2)
    # node 1's first device also wants node 0's rows: the exchange crosses nodes
    rows = info.shape[0] // 2
    crossing = needs + [(((0, rows),) + needs[0][0][1:], 2)]
    assert split_by_node(pieces, crossing, pieces[0].n_slices, topo) is None
    # and one level only: nothing to split
    assert split_by_node(pieces, needs, pieces[0].n_slices, synthetic(4)) is None
