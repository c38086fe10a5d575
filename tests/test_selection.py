"""The selection stage: the plan returned is the least simulated of the MIP's optimum and the
named strategies legal under its options, and it says so."""
from __future__ import annotations

import json

import pytest

from einsummable.cli import main as cli
from einsummable.optimizer.api import named_plan, optimize
from einsummable.backend.runtime.simulator import simulate
from einsummable.optimizer.report import explain
from einsummable.errors import PlanError
from einsummable.planning.plan import Named, Options, Plan, Solved
from einsummable.selection import choose
from einsummable.selection.choose import choose_plan, pool_labels, simulated_s
from einsummable.topology import load_topology
from tests.helpers import llama_tiny, mlp


@pytest.fixture(scope="module")
def chosen():
    g, _, _ = llama_tiny(2, 8)
    return g, choose_plan(g, "cpu2", options=Options("sharded", True), cache=False)


def test_the_chosen_plan_is_the_least_simulated_of_its_pool(chosen):
    g, plan = chosen
    j = plan.judged
    labels = [c.label for c in j.considered]
    # data parallel needs replicated weights: not a plan of weights="sharded"
    assert sorted(labels) == sorted(pool_labels(plan.options)) and "data-parallel" not in labels
    times = [c.simulated_s for c in j.considered]
    assert times == sorted(times) and j.simulated_s == times[0] and j.measure == "block"
    # the figures are the simulator's and the objective's of the very plans considered
    best = j.considered[0]
    assert simulated_s(plan) == (pytest.approx(best.simulated_s), "block")
    if best.label == "optimized":
        assert isinstance(plan.origin, Solved)
        assert best.objective_s == pytest.approx(
            optimize(g, "cpu2", options=plan.options, cache=False).objective_s)
    elif best.label.startswith("optimized-"):  # a later plan of the MIP's pool
        assert isinstance(plan.origin, Solved) and plan.origin.pool_rank > 1
    else:
        assert plan.origin == Named(best.label)
    for c in j.considered:
        if c.label not in ("optimized", best.label) and not c.label.startswith("optimized-"):
            other = named_plan(g, "cpu2", c.label, options=plan.options)
            assert c.objective_s == pytest.approx(other.objective_s)
            assert c.simulated_s >= j.simulated_s


def test_judged_survives_json_and_the_report_says_what_holds_where(chosen):
    _, plan = chosen
    again = Plan.from_json(plan.to_json())
    assert again.judged == plan.judged and again.to_json() == plan.to_json()
    text = explain(plan, strategies=False)
    assert f"simulated {plan.judged.simulated_s * 1e3:.4f} ms (one block in a stack)" in text
    assert "holds among these plans only" in text
    for c in plan.judged.considered:
        assert c.label in text
    # a plan that was not judged keeps the JSON it had (no "judged" key)
    assert "judged" not in json.loads(optimize(mlp(64, 32, 64), "cpu2", cache=False).to_json())


def test_a_strategy_that_simulates_faster_is_returned(monkeypatch):
    # The simulator's verdict decides, not the objective: make fsdp the fastest.
    g = mlp(64, 32, 64)
    order = {"fsdp": 1.0}
    monkeypatch.setattr(choose, "simulated_s",
                        lambda p, measure=None: (order.get(getattr(p.origin, "strategy",
                                                                   None), 2.0), "program"))
    plan = choose_plan(g, "cpu2", cache=False)
    assert plan.origin == Named("fsdp") and plan.judged.simulated_s == 1.0
    assert [c.label for c in plan.judged.considered][:2] == ["fsdp", "optimized"]


def test_ties_go_to_the_mip_and_free_weights_admit_data_parallel(monkeypatch):
    g = mlp(64, 32, 64)
    monkeypatch.setattr(choose, "simulated_s", lambda p, measure=None: (1.0, "program"))
    plan = choose_plan(g, "cpu2", weights="free", cache=False)
    assert isinstance(plan.origin, Solved)
    assert "data-parallel" in [c.label for c in plan.judged.considered]


def test_the_serial_variant_is_the_mip_under_the_other_overlap_rule():
    g = mlp(64, 32, 64)
    plan = choose_plan(g, "cpu2", cache=False, serial=True, strategies=(), pool=1)
    assert sorted(c.label for c in plan.judged.considered) == ["optimized", "optimized-serial"]
    serial = optimize(g, "cpu2", options=Options(overlap=False), cache=False)
    got = {c.label: c for c in plan.judged.considered}["optimized-serial"]
    assert got.objective_s == pytest.approx(serial.objective_s)


def test_cli_plan_judges_unless_told_not_to(capsys):
    topo = "cpu2"
    assert load_topology(topo).world_size == 2
    args = ["plan", "--model", "llama-tiny", "--topology", topo, "--batch", "1", "--seq", "8",
            "--dtype", "float32", "--no-cache", "--json"]
    assert cli(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["judged"]["simulated_s"] == min(c["simulated_s"]
                                               for c in out["judged"]["considered"])
    assert cli(args + ["--mip-only"]) == 0
    assert json.loads(capsys.readouterr().out)["judged"] is None


def test_one_device_sends_nothing_and_is_chosen_where_it_is_fastest():
    # On two devices of a synthetic machine this MLP's compute is too small to pay for any
    # exchange: with its weights stored once, everything on device 0 is the fastest plan, and
    # it is not among the MIP's candidates (each of which uses every device), so only
    # selection can find it.
    from einsummable.backend.runtime.simulator import simulate
    from einsummable.topology import synthetic
    g, topo = mlp(256, d=512, f=2048), synthetic(2, mem_bytes=2e7)
    one = named_plan(g, topo, "one-device", weights="sharded")
    assert one.origin == Named("one-device")
    assert all(c.devices == ((0,),) for _, c in one.choice)
    sim = simulate(one)
    assert sim.compute_s[1] == 0.0 and not sim.link_bytes
    plan = choose_plan(g, topo, weights="sharded", cache=False)
    assert plan.origin == Named("one-device")
    mip = {c.label: c for c in plan.judged.considered}["optimized"]
    assert plan.judged.simulated_s < mip.simulated_s and one.objective_s < mip.objective_s
    # weights free (the default): both devices' memory holds the weights, so they replicate
    # and splitting the tokens sends nothing either: that plan splits the compute and beats
    # the one device, which is still considered
    free = choose_plan(g, topo, cache=False)
    assert free.options.weights == "free" and free.origin != Named("one-device")
    for w in g.weights:  # one whole block of each weight, on both devices
        cand = free.layout_of_input(w.name)
        assert len(cand.devices) == 1 and sorted(cand.devices[0]) == [0, 1]
    sim = simulate(free)
    assert not sim.link_bytes and min(sim.compute_s) > 0.0
    alone = {c.label: c for c in free.judged.considered}["one-device"]
    assert free.judged.simulated_s < alone.simulated_s


def test_one_device_that_does_not_fit_is_left_out_and_says_why():
    from einsummable.errors import InfeasibleError
    from einsummable.topology import synthetic
    # 6 MB: megatron (3.4 MB a device) and data parallel (5.2) fit, the one device does not
    # (6.3), nor do fsdp and ulysses (7.1: both weights gathered whole ahead of the first
    # matmul, beside their shards)
    g, topo = mlp(256, d=512, f=2048), synthetic(2, mem_bytes=6e6)
    with pytest.raises(InfeasibleError, match="does not fit on device 0: .* MB live"):
        named_plan(g, topo, "one-device")
    plan = choose_plan(g, topo, cache=False)
    assert "one-device" not in [c.label for c in plan.judged.considered]
    assert "one-device" in [label for label, _ in plan.judged.left_out]
    assert "left out: the whole graph does not fit" in explain(plan, strategies=False)
    assert Plan.from_json(plan.to_json()).judged == plan.judged


def test_plans_simulated_in_processes_are_judged_as_here():
    g, _, _ = llama_tiny(2, 8)
    here = choose_plan(g, "cpu2", options=Options("sharded", True), cache=False)
    there = choose_plan(g, "cpu2", options=Options("sharded", True), cache=False, jobs=2)
    assert there.judged == here.judged and there.to_json() == here.to_json()
    with pytest.raises(PlanError, match="jobs"):
        choose_plan(g, "cpu2", cache=False, jobs=0)


def test_a_single_block_benchmark_judges_by_the_program_alone():
    # A benchmark timing one block has no block before it to stream weights behind: with
    # measure="program" every plan is judged by its program's simulated time.
    g, _, _ = llama_tiny(2, 8)
    plan = choose_plan(g, "cpu2", options=Options("sharded", True), cache=False,
                       measure="program", serial=True)
    j = plan.judged
    assert j.measure == "program" and "optimized-serial" in [c.label for c in j.considered]
    assert j.simulated_s == pytest.approx(simulate(plan).time_s)
    assert simulated_s(plan, "program") == (pytest.approx(j.simulated_s), "program")
    with pytest.raises(PlanError, match="measure must be one of"):
        choose_plan(g, "cpu2", cache=False, measure="stack")
    with pytest.raises(PlanError, match="needs a steady-state plan"):
        choose_plan(g, "cpu2", cache=False, measure="block", steady_state=False)
