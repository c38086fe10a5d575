"""The Plan's typed options and origin: they survive JSON, bad ones are refused, and every
consumer (the report, `einsummable show`) prices a plan on the options it was solved under."""
from __future__ import annotations

import json
import re

import pytest

from einsummable.cli import main as cli
from einsummable.errors import PlanError
from einsummable.optimizer.api import named_plan, optimize, plan_cost
from einsummable.optimizer.model import build_model, fixed_nodes
from einsummable.optimizer.objective import objective_s
from einsummable.optimizer.report import node_costs, plan_costs
from einsummable.planning.cost import CostModel
from einsummable.planning.plan import Named, Options, Plan, Solved
from einsummable.topology import load_topology

from helpers import mlp

# Not the defaults in any field: a consumer that drops one prices the plan differently.
ODD = Options(weights="sharded", steady_state=True,
              cost=CostModel(flop_efficiency=0.5, mem_efficiency=0.25, exchange_mode="naive"),
              overlap=False)


@pytest.fixture(scope="module")
def plans():
    g = mlp(256, d=512, f=1024)
    topo = load_topology("dgx1-v100")
    solved = optimize(g, topo, options=ODD, cache=False)
    named = named_plan(g, topo, "megatron-tp", weights="sharded", steady_state=True,
                       overlap=False, cost_model=ODD.cost)  # the keywords say the same as ODD
    return g, topo, solved, named


def test_options_and_origin_survive_json(plans):
    _, _, solved, named = plans
    assert solved.options == ODD and named.options == ODD
    default = Options()  # ODD is off the defaults in each field it sets (weights: "free")
    assert all(getattr(ODD, f) != getattr(default, f)
               for f in ("weights", "steady_state", "cost", "overlap"))
    assert isinstance(solved.origin, Solved) and solved.origin.status == "optimal"
    assert named.origin == Named("megatron-tp", ())
    for plan in (solved, named):
        back = Plan.from_json(plan.to_json())
        assert back.options == plan.options and back.origin == plan.origin
        assert back.to_json() == plan.to_json()


def test_bad_options_in_a_plan_file_are_refused(plans):
    _, _, solved, _ = plans
    d = json.loads(solved.to_json())
    for key, value in (("weights", "everywhere"), ("overlap", "yes"), ("typo_key", 1)):
        bad = json.loads(json.dumps(d))
        bad["options"][key] = value
        with pytest.raises(PlanError):
            Plan.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(d))
    bad["options"]["cost"]["exchange_mode"] = "telepathy"
    with pytest.raises(PlanError, match="exchange mode"):
        Plan.from_json(json.dumps(bad))


def test_the_report_prices_a_plan_on_its_own_options(plans):
    g, topo, solved, _ = plans
    mine = plan_costs(solved)
    model = build_model(g, topo, ODD, fixed_nodes(g, topo, ODD, solved.chosen))
    assert mine == node_costs(model, {k: 0 for k in model.nodes})
    # the plain sum of the nodes is the plan's objective (overlap off) ...
    assert sum(c.total_s for c in mine.values()) == pytest.approx(solved.objective_s, rel=1e-12)
    assert objective_s(model, {k: 0 for k in model.nodes}) == solved.objective_s
    # ... and on default options the same choice costs something else, so dropping an
    # option could not pass unseen
    default = plan_cost(g, topo, solved.chosen, steady_state=True)
    assert default != pytest.approx(solved.objective_s, rel=1e-3)


def test_show_prices_on_the_plan_options(plans, tmp_path, capsys):
    g, topo, solved, _ = plans
    model = build_model(g, topo, ODD, fixed_nodes(g, topo, ODD, solved.chosen))
    want = node_costs(model, {k: 0 for k in model.nodes})["up"]
    path = tmp_path / "plan.json"
    path.write_text(solved.to_json())
    assert cli(["show", str(path), "--no-strategies", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    first_row = next(line for line in out["report"].splitlines() if line.startswith("up"))
    compute_ms = float(re.findall(r"\s(\d+\.\d+)", first_row)[0])  # then exch ms, MB in
    assert compute_ms == pytest.approx(want.compute_s * 1e3, abs=1e-4)
    assert "weight exchanges" not in out["report"]  # overlap off: no A + max(C, W) line


def test_keywords_that_contradict_the_options_are_refused():
    g = mlp(64, d=128, f=256)
    with pytest.raises(PlanError, match="contradicts options.overlap"):
        optimize(g, "cpu4", options=ODD, overlap=True, cache=False)
    with pytest.raises(PlanError, match="contradicts cost_model.exchange_mode"):
        optimize(g, "cpu4", cost_model=ODD.cost, exchange_mode="optimized", cache=False)
    # a keyword alone is a shortcut for its field: the cost model's mode is kept
    plan = named_plan(g, "cpu4", "fsdp", cost_model=ODD.cost)
    assert plan.options.cost == ODD.cost


def test_explain_names_modes_by_role_and_ops_by_source_line():
    from einsummable.frontend.capture import trace
    from einsummable.models import preset
    from einsummable.optimizer.api import named_plan
    from einsummable.optimizer.report import explain, splits_in_words, where
    module, (x,) = preset("llama-tiny", batch=4, seq=64, device="meta")
    g = trace(module, (x,))
    plan = named_plan(g, "cpu4", "fsdp")
    words = splits_in_words(plan)
    assert any("batch/" in w for w in words.values())  # FSDP splits the tokens, batch first
    assert not any(re.search(r"\b[a-z]/\d", w) for w in words.values()), words
    rows = explain(plan, strategies=False).splitlines()
    linear = next(r for r in rows if r.startswith(g.ops[-1].name + " "))
    assert linear.endswith(where(plan, g.ops[-1].name)) and where(plan, g.ops[-1].name)
    # the module that ran an op and the user's line (the model's file, not torch's linear.py)
    wo = next(op.name for op in g.ops if op.source and op.source.endswith(" in attention.wo"))
    assert re.fullmatch(r"attention\.wo \(llama\.py:\d+\)", where(plan, wo))
    # Megatron splits attention by heads, and says so
    tp = splits_in_words(named_plan(g, "cpu4", "megatron-tp"))
    attention = next(op.name for op in g.ops if op.fused == "attention")
    assert "heads/" in tp[attention], tp[attention]
    up = next(op.name for op in g.ops if op.source and op.source.endswith(" in feed_forward.w1"))
    assert "ffn/" in tp[up], tp[up]  # and the MLP by its inner width
