"""Flat programs (`exchange._Synthesis.flat`): every transfer in the round after its source is
ready, a relayed one hop by hop, so a relay receives what it forwards in one p2p batch and
forwards all of it in the next. They deliver exactly the needed regions on random layouts and
world sizes, they are what small exchanges on the DGX-1 mesh take, the lowered programs take
what the replay says, and they run on gloo ranks."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from einsummable.backend import lowering
from einsummable.backend.lowering import lower_exchange
from einsummable.backend.runtime.pool import run_dist
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.planning import exchange as exchange_mod
from einsummable.planning.timing import exchange_time
from einsummable.topology import load_topology
from experiments.patterns import pattern

from helpers import ring4
from test_exchange import assert_delivers, folded_sources, random_case

DGX1 = load_topology("dgx1-v100")
H100X2 = load_topology("h100x8x2")


def _flat_program(info, pieces, needs, agg, topo, direct_folds=False, owners=False):
    """The flat program itself (not the fastest kept): folds level by level, or with
    `direct_folds` every reader folding its needs from the holders, then the copies (with
    `owners`, from the full sources only, no delivered block sent on)."""
    b, sources, remote = folded_sources(info, pieces, needs, topo, flat=True,
                                        direct_folds=direct_folds, owners=owners)
    exchange_mod._copy(b, list(sources), remote)
    return b.build()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2 ** 31), world=st.sampled_from([4, 8]),
       topo=st.sampled_from(["dgx1", "ring4"]), direct=st.booleans(), owners=st.booleans())
def test_flat_programs_deliver_exactly_what_is_needed(seed, world, topo, direct, owners):
    topology = DGX1 if topo == "dgx1" else ring4()
    world = min(world, topology.world_size)
    info, pieces, needs, agg, values, truth = random_case(random.Random(seed), world)
    ex = _flat_program(info, pieces, needs, agg, topology, direct, owners)
    assert_delivers(ex, pieces, needs, agg, values, truth)
    # a relayed value is one transfer per hop, each a round after the one it forwards
    assert all(len(t.hops) == 2 for t in ex.transfers)
    kept = exchange_mod.synthesize(info, pieces, needs, agg, topology)
    assert exchange_time(kept, topology) <= exchange_time(ex, topology) * (1 + 1e-12)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_to_all", "all_gather", "broadcast"])
def test_small_exchanges_on_the_cube_mesh_take_two_batches(kind):
    # 64 KiB among the 8 GPUs of a DGX-1: relayed on arrival, every forward opened a p2p
    # batch (a launch each) and the rounds packed against the links spread a device's sends
    # over five batches (reduce-scatter 0.057 ms, all-to-all 0.040; all-gather 0.020 and
    # broadcast 0.017 relaying delivered blocks on); flat, a device posts its sends and first
    # hops in one batch and its forwards in the next.
    p = pattern(kind, 8, 1 << 16)
    ex = exchange_mod.synthesize(p.info, p.produced, p.needs, p.agg, DGX1)
    assert all(len(t.hops) == 2 for t in ex.transfers) and ex.n_rounds <= 2
    seconds = exchange_time(ex, DGX1)
    assert seconds < 0.02e-3
    low = lower_exchange(p.info, p.produced, p.needs, p.agg, DGX1)
    assert simulate_programs(low, DGX1).time_s == pytest.approx(seconds, rel=0.03)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_reduce", "all_to_all"])
def test_flat_programs_run_on_gloo_ranks(kind, pools, monkeypatch):
    # 4 ranks on a ring: 0 reaches 2 only through a relay, which forwards in its next batch
    topo = ring4()
    p = pattern(kind, 4, 1 << 14, "float32")
    flat = _flat_program(p.info, p.produced, p.needs, p.agg, topo, kind == "all_reduce")
    # some transfer forwards, a round later, what its sender received
    assert any(a.dst == c.src and (a.region, a.slices) == (c.region, c.slices)
               and c.round == a.round + 1 for a in flat.transfers for c in flat.transfers)
    monkeypatch.setattr(lowering, "synthesize", lambda *args, **kw: flat)
    low = lower_exchange(p.info, p.produced, p.needs, p.agg, topo)
    x = torch.randn(p.info.shape)
    got = run_dist(low, {p.info.name: x}, backend="gloo", pools=pools,
                   no_collectives=True)[p.info.name]  # rank 0's need
    rows, cols = p.info.shape
    want = {"reduce_scatter": 4 * x[:rows // 4], "all_reduce": 4 * x,
            "all_to_all": x[:, :cols // 4]}[kind]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
