"""The simulated training-step baselines (`experiments/training_simulated.py`) and the
training bench's simulated table: the formulas on a small block on a100x8, the table on
pcie4-numa (its four devices solve in seconds)."""
from __future__ import annotations

import pytest

from einsummable.topology import load_topology
from experiments import einsummable_system as es_sys
from experiments.collectives import ACHIEVED, collective_time, fabric
from experiments.simulated import simulate_baseline
from experiments.training_bench import run
from experiments.training_plan import training_graph
from experiments.training_simulated import (
    SYSTEMS,
    phases,
    replicated_update_s,
    sharded_update_s,
    simulate_training,
)
from experiments.workloads import Workload

TINY = Workload("tiny", "llama-tiny", batch=4, seq=64, dtype="bfloat16")


@pytest.fixture(scope="module")
def setting():
    topo = load_topology("a100x8")
    train = training_graph(TINY.model, TINY.batch, TINY.seq, "bfloat16", "adamw")
    return topo, train, es_sys.graph_for(TINY)


def test_phases_add_up_to_the_simulators_compute(setting) -> None:
    topo, train, _ = setting
    plan = es_sys.named_plan(train.graph, topo, "fsdp")
    ph = phases(train, plan.chosen, topo)
    assert min(ph.forward_s, ph.backward_s, ph.update_s) > 0
    total = ph.forward_s + ph.backward_s + ph.update_s
    assert total == pytest.approx(max(es_sys.simulate(plan).compute_s), rel=1e-9)
    # DDP runs the whole update on every device; FSDP a shard of it (the named fsdp layout
    # splits token modes only and would replicate it: the simulated baseline shards it)
    assert sharded_update_s(train, topo) <= replicated_update_s(train, topo)
    fsdp = simulate_training("fsdp", train, es_sys.graph_for(TINY), topo)
    assert fsdp.compute_s == pytest.approx(ph.forward_s + ph.backward_s
                                           + sharded_update_s(train, topo), rel=1e-9)


def phases_of(train, topo):
    return phases(train, es_sys.named_plan(train.graph, topo, "data-parallel").chosen, topo)


def test_each_baseline_follows_its_formula(setting) -> None:
    topo, train, fwd = setting
    times = {s: simulate_training(s, train, fwd, topo) for s in SYSTEMS}
    for s, t in times.items():
        assert t.time_s >= t.compute_s > 0, s
        assert 0 < t.at_peak_s <= t.time_s, s
        assert t.layout_s > 0 and "program of this layout" in t.note, s
    # Megatron TP: compute, then the forward's all-reduces and their backward duals, waited for
    tp = simulate_baseline("pytorch-tp", fwd, topo, "sharded", True, ACHIEVED)
    assert times["pytorch-tp"].comm_s == pytest.approx(2 * tp.comm_s)
    assert times["pytorch-tp"].time_s == pytest.approx(times["pytorch-tp"].compute_s
                                                       + 2 * tp.comm_s)
    # DDP: the gradients' all-reduce runs behind the backward, never less than itself
    params = sum(w.nbytes for w in fwd.weights)
    ar = collective_time("all_reduce", params, fabric(topo), ACHIEVED)
    assert times["ddp"].gather_s == pytest.approx(ar)
    assert times["ddp"].time_s >= ar + times["ddp"].compute_s - phases_of(train, topo).backward_s
    # FSDP: both gathers and the reduce-scatter are hidden at best, never skipped
    assert times["fsdp"].time_s >= times["fsdp"].gather_s > 0
    with pytest.raises(ValueError, match="no simulated training baseline"):
        simulate_training("zero-9", train, fwd, topo)


def test_the_simulated_table_has_a_headline_over_the_best_baseline() -> None:
    cfg = {"name": "training-test", "systems": ["einsummable", *SYSTEMS],
           "simulated_topology": "pcie4-numa", "optimizer": "sgd",
           "simulated_workloads": [TINY.to_dict()]}
    rows, extra, table = run(cfg)
    assert {r.system for r in rows} == {"einsummable", *SYSTEMS}
    assert all(r.ok for r in rows), [r.unavailable for r in rows]
    ours = next(r for r in rows if r.system == "einsummable")
    best = min((r for r in rows if r.system != "einsummable"), key=lambda r: r.time_s)
    assert ours.model_s > 0 and extra["simulated_plans"]["tiny"]["status"]
    assert f"einsummable / best baseline of its row {ours.time_s / best.time_s:.3f}" in table
