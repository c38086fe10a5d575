"""Steady state spelled out: a block's plan stacked k times computes k blocks, lowering hands a
block's output on in its input's layout, and a block's time in a stack is T(2) - T(1)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from einsummable.backend.lowering import lower
from einsummable.backend.runtime.simulator import block_time, simulate, simulate_programs
from einsummable.core.program import Send
from einsummable.errors import PlanError
from einsummable.frontend.builder import Builder
from einsummable.frontend.reference import evaluate
from einsummable.frontend.scalar import arg
from einsummable.optimizer.api import named_plan, optimize
from einsummable.planning.placement import INPUT_PREFIX, input_op, place
from einsummable.planning.stack import stack
from einsummable.topology import synthetic

from helpers import llama_tiny


def test_a_stacked_plan_computes_the_blocks_in_a_row():
    g, ins, _ = llama_tiny()
    plan = named_plan(g, synthetic(2), "megatron-tp", steady_state=True)
    g2, choice2 = stack(g, plan.chosen, 2)
    assert len(g2.ops) == 2 * len(g.ops) + 1  # and the view that hands x on
    assert set(choice2) == {op.name for op in g2.ops} | {INPUT_PREFIX + t.name
                                                         for t in g2.inputs}
    feed = {**ins, **{f"b1.{t.name}": ins[t.name] for t in g.weights}}
    once = evaluate(g, ins)[g.outputs[0]]
    twice = evaluate(g, {**ins, "x": once})[g.outputs[0]]
    torch.testing.assert_close(evaluate(g2, feed)[g2.outputs[0]], twice)


def _doubling(layout_x: dict, layout_y: dict):
    """y = 2x on two devices, x and y laid out as given."""
    b = Builder()
    x = b.input("x", (8, 6))
    y = b.map(arg(0) * 2.0, x)
    g = b.build([y])
    op = g.ops[0]
    choice = {INPUT_PREFIX + "x": place(input_op(g.tensor("x")), layout_x, [0, 1]),
              op.name: place(op, layout_y, [0, 1])}
    return g, choice


def test_steady_delivery_hands_the_output_on_in_the_input_layout():
    topo = synthetic(2)
    same, other = _doubling({"a": 2}, {"a": 2}), _doubling({"a": 2}, {"b": 2})
    sends = lambda low: sum(isinstance(i, Send) for p in low.programs for i in p.instrs)  # noqa
    assert sends(lower(*same, topo, deliver="steady")) == 0  # y is where x was: nothing moves
    # x's rows go to the column split of y either way; steady state sends y's columns back
    # into rows, in place leaves them
    assert sends(lower(*other, topo, deliver="steady")) > sends(lower(*other, topo,
                                                                       deliver="in_place"))
    with pytest.raises(PlanError, match="delivery"):
        lower(*same, topo, deliver="somewhere")


def _gather_then_work():
    """h = x @ w with w stored as two halves (gathered by the op, as FSDP does), then a
    chain of elementwise ops long enough to hide the next block's gather behind them."""
    b = Builder()
    x = b.input("x", (512, 512))
    h = b.einsum("td,de->te", x, b.weight("w", (512, 512)))
    for _ in range(6):
        h = b.map(arg(0) * 0.5 + 1.0, h)
    return b.build([h])


def test_block_time_is_the_marginal_block_and_drops_the_cold_start():
    topo = synthetic(2, intra_bw=2e9)  # a slow link: the weight's gather takes a while
    g, _, _ = llama_tiny()
    # data parallel with weights free: no message at all, so a block in a stack takes what
    # one block alone takes
    dp = named_plan(g, topo, "data-parallel", steady_state=True)
    assert block_time(dp) == pytest.approx(simulate(dp).time_s, rel=1e-9)
    # fsdp gathers the weight: alone, the matmul waits for it; in a stack it arrives while
    # the previous block's elementwise tail runs
    fsdp = named_plan(_gather_then_work(), topo, "fsdp", weights="sharded", steady_state=True)
    assert block_time(fsdp) < 0.9 * simulate(fsdp).time_s
    with pytest.raises(PlanError, match="steady_state"):
        block_time(optimize(g, topo, steady_state=False, cache=False))


def test_simulating_a_plan_prices_the_output_it_was_optimized_for():
    topo = synthetic(2)
    g, choice = _doubling({"a": 2}, {"b": 2})
    base = dataclasses.replace(named_plan(g, topo, "data-parallel", steady_state=True),
                               choice=tuple(choice.items()))
    steady = simulate(base).time_s  # steady_state: y crosses back into x's layout
    in_place = simulate_programs(lower(base, deliver="in_place"), topo).time_s
    assert steady > in_place
