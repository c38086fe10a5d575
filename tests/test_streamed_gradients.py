"""A training step's parameters handed on to the next step's layout (`Graph.carried`), priced
by the optimizer and lowered, and its gradients sent as soon as they are computed
(`handoff.streamed_gradients`, `backend/early.py`), streaming behind the backward in the
objective (W) as in the program."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from einsummable.backend.early import defer_reads
from einsummable.backend.lowering import IN_PLACE, lower
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate, simulate_programs
from einsummable.core.program import Alloc, Compute, Recv, Reduce, Send, Slice
from einsummable.errors import EinsummableError
from einsummable.frontend.handoff import streamed_gradients
from einsummable.frontend.reference import evaluate
from einsummable.optimizer.api import named_plan
from einsummable.optimizer.model import build_model
from einsummable.optimizer.objective import split
from einsummable.planning.placement import INPUT_PREFIX
from einsummable.planning.plan import Options
from einsummable.topology import load_topology
from experiments.training_plan import training_graph
from helpers import inputs_for, rel_err


@pytest.fixture(scope="module")
def train():
    return training_graph("llama-tiny", 4, 64, "bfloat16", "adamw")


def _choice(model, chosen):
    return {k: oc.cands.index(chosen[k]) for k, oc in model.nodes.items()}


def test_carried_pairs_round_trip_and_are_checked(train) -> None:
    g = train.graph
    assert g.carried == train.updates and len(g.carried) == 27
    # in the plan cache's key; absent where there are none, so other graphs keep theirs
    assert g.to_dict()["carried"] == [list(p) for p in g.carried]
    assert "carried" not in dataclasses.replace(g, carried=()).to_dict()
    x, y = g.carried[0]
    with pytest.raises(EinsummableError, match="not an output"):
        dataclasses.replace(g, outputs=tuple(o for o in g.outputs if o != y))
    with pytest.raises(EinsummableError, match="named twice"):
        dataclasses.replace(g, carried=g.carried + ((x, g.carried[1][1]),))
    wrong = next(p for p in g.carried if g.tensor(p[0]).shape != g.tensor(x).shape)
    with pytest.raises(EinsummableError, match="cannot stand for"):
        dataclasses.replace(g, carried=((x, wrong[1]),))


def test_the_hand_off_of_a_parameter_stored_otherwise_is_priced_and_lowered(train) -> None:
    """Data parallel stores every parameter whole on every device; a plan whose update runs
    split must gather the new parameters back: the carried edge costs that, and the program
    (in place) sends them, where the same graph without carried pairs sends nothing there."""
    plan = named_plan(train.graph, "a100x8", "data-parallel", options=Options("free", False))
    chosen = dict(plan.chosen)
    name = "feed_forward.w1.weight"
    new = dict(train.updates)[name]
    op = plan.graph.producer(new).name
    model = build_model(plan.graph, plan.topology, plan.options)
    split_update = next(c for c in model.nodes[op].cands if len(c.used_devices) == 8
                        and all(len(d) == 1 for d in c.devices))
    chosen[op] = split_update
    choice = _choice(model, chosen)
    (edge,) = [e for e in model.edges if e.kind == "carried" and e.dst == INPUT_PREFIX + name]
    assert edge.cost(choice[edge.src], choice[edge.dst]).seconds > 0
    assert chosen[INPUT_PREFIX + name].used_devices == tuple(range(8))

    def sent(graph) -> int:
        low = lower(graph, chosen, plan.topology, deliver=IN_PLACE)
        return sum(isinstance(i, Send) for p in low.programs for i in p.instrs)
    assert sent(plan.graph) > sent(dataclasses.replace(plan.graph, carried=()))


def test_gradients_stream_in_the_objective_and_leave_before_the_backward_ends(train) -> None:
    plan = named_plan(train.graph, "a100x8", "fsdp", options=Options("sharded", False))
    g = plan.graph
    streamed = streamed_gradients(g)
    # every weight gradient's first reader is its AdamW moment update
    assert len(streamed) == 9 and all(g.op(r).output in {y for _, y in g.carried}
                                      for r in streamed.values())
    model = build_model(g, plan.topology, plan.options)
    choice = _choice(model, dict(plan.chosen))
    grads = [e for e in model.edges if e.kind == "gradient"]
    assert {e.tensor for e in grads} == set(streamed)
    # where the devices fold on their compute stream, the gradients stay on the path
    cpu = named_plan(g, "cpu2", "fsdp", options=Options("sharded", False))
    assert not [e for e in build_model(g, cpu.topology, cpu.options).edges
                if e.kind == "gradient"]
    streamed_s = sum(e.cost(choice[e.src], choice[e.dst]).seconds for e in grads)
    assert streamed_s > 0
    as_activations = dataclasses.replace(model, edges=tuple(
        dataclasses.replace(e, kind="data") if e.kind == "gradient" else e for e in model.edges))
    s, a = split(model, choice), split(as_activations, choice)
    assert s.weights_s > a.weights_s and s.activations_s < a.activations_s
    # In the program, rank 0 sends its share of a gradient before its last backward kernel.
    low = lower(plan, deliver=IN_PLACE)
    instrs = low.programs[0].instrs
    backward = {op.name for op in g.ops if op.output not in {y for _, y in g.carried}}
    last_backward = max(i for i, x in enumerate(instrs)
                        if isinstance(x, Compute) and x.op in backward)
    tensors = set(streamed)
    first_grad_send = min(i for i, x in enumerate(instrs) if isinstance(x, Send)
                          and i < last_backward and _sends_one_of(instrs, i, tensors, low))
    assert first_grad_send < last_backward


def _sends_one_of(instrs, i: int, tensors: set[str], low) -> bool:
    """Whether the Send at i sends a block a Compute wrote for one of `tensors`."""
    makers = {x.out: x.op for x in instrs if isinstance(x, Compute)}
    op = makers.get(instrs[i].src)
    return op is not None and low.graph.op(op).output in tensors


def test_what_reads_an_arrival_is_deferred_and_what_sends_a_held_block_is_not() -> None:
    """Without a side stream (left) and with one (the fold goes now, on that stream, and so
    does the send of its result; a relay's forward of a received block still waits)."""
    # rank 0: holds buffer 1, sends it, receives 2, folds 1 and 2 into 3, sends 3 on, and
    # forwards a block 4 it receives; rank 1: only views its own block.
    progs = [[Send(1, 1, 0), Recv(2, 1, 1, (4,), "float32"), Reduce(3, "sum", (1, 2)),
              Send(3, 1, 2), Alloc(5, (4,), "float32"), Recv(4, 1, 3, (4,), "float32"),
              Send(4, 1, 4)],
             [Slice(7, 6, ((0, 2),))]]
    later = defer_reads(progs, [0, 0], [False, False])
    assert progs[0] == [Send(1, 1, 0), Recv(2, 1, 1, (4,), "float32"),
                        Alloc(5, (4,), "float32"), Recv(4, 1, 3, (4,), "float32")]
    assert later[0] == [Reduce(3, "sum", (1, 2)), Send(3, 1, 2), Send(4, 1, 4)]
    assert progs[1] == [Slice(7, 6, ((0, 2),))] and later[1] == []
    progs = [[Send(1, 1, 0), Recv(2, 1, 1, (4,), "float32"), Reduce(3, "sum", (1, 2)),
              Send(3, 1, 2), Recv(4, 1, 3, (4,), "float32"), Send(4, 1, 4),
              Slice(8, 3, ((0, 2),))]]
    later = defer_reads(progs, [0], [True])
    # the messages that go now are the side stream's (their batches launch there)
    assert progs[0] == [Send(1, 1, 0, side=True), Recv(2, 1, 1, (4,), "float32", side=True),
                        Reduce(3, "sum", (1, 2), queue=1), Send(3, 1, 2, side=True),
                        Recv(4, 1, 3, (4,), "float32", side=True)]
    assert later[0] == [Send(4, 1, 4), Slice(8, 3, ((0, 2),))]


def test_a_streamed_plan_simulates_faster_than_its_gradients_exchanged_at_the_update(
        train) -> None:
    plan = named_plan(train.graph, "a100x8", "fsdp", options=Options("sharded", False))
    early, late = (simulate_programs(lower(plan, deliver=IN_PLACE, stream=s), plan.topology,
                                     cost_model=plan.options.cost).time_s for s in (True, False))
    assert early == pytest.approx(simulate(plan).time_s, rel=1e-12)
    assert early < late


@pytest.mark.parametrize("topology,strategy,side", [
    ("a100x8", "fsdp", True), ("pcie4-numa", "fsdp", True), ("pcie4-numa", "fsdp", False),
    ("pcie4-numa", "data-parallel", False), ("dgx1-v100", "fsdp", False)])
def test_streamed_programs_compute_the_step_as_the_reference(topology, strategy, side) -> None:
    """Every output of a training step (loss, new parameters, new AdamW state) run on the
    local executor as lowered with its gradients streamed: the folds on the side stream, or
    (devices without one) deferred to the update, relays' forwards with them (pcie4-numa
    relays between its NUMA halves)."""
    train32 = training_graph("llama-tiny", 2, 16, "float32", "adamw")
    g = train32.graph
    topo = load_topology(topology)
    if not side:
        topo = dataclasses.replace(topo, devices=tuple(
            dataclasses.replace(d, prefetch_stream=False) for d in topo.devices))
    plan = named_plan(g, topo, strategy, options=Options("sharded", False))
    low = lower(plan)
    folds = [i for p in low.programs for i in p.instrs if isinstance(i, Reduce) and i.queue]
    assert bool(folds) == side
    ins = inputs_for(g, 5)
    ins.update({k: v.abs() for k, v in ins.items() if k.endswith("exp_avg_sq")})  # a variance
    ins.update({k: torch.tensor([v]) for k, v in train32.scalar_values(3).items()})
    want = evaluate(g, ins)
    got = run_local(low, ins)
    for name in g.outputs:
        # float32 partial sums folded in another order than the reference's one sum
        assert rel_err(got[name].float(), want[name].float()) <= 1e-4, name
