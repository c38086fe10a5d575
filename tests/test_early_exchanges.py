"""Exchanges that leave before their reader's turn (`backend/early.py`): the next op's inputs
sent before an op's kernels, a streamed gradient's messages, folds and stitches on the side
stream, and constants made once per plan, in the programs and in the simulator."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from einsummable.backend.lowering import IN_PLACE, lower
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.core.program import Compute, Const, Recv, Reduce, Send, p2p_batches
from einsummable.frontend.reference import evaluate
from einsummable.models import preset
from einsummable.models.llama_ir import llama_block_graph
from einsummable.optimizer.api import named_plan
from einsummable.planning.plan import Options
from experiments.training_plan import training_graph
from helpers import inputs_for, rel_err


@pytest.fixture(scope="module")
def fsdp_step():
    train = training_graph("llama-tiny", 4, 64, "bfloat16", "adamw")
    return named_plan(train.graph, "a100x8", "fsdp", options=Options("sharded", False))


def _time(plan, **kw) -> float:
    low = lower(plan, deliver=IN_PLACE, **kw)
    return simulate_programs(low, plan.topology, cost_model=plan.options.cost).time_s


def test_a_side_streams_messages_go_in_batches_of_their_own() -> None:
    prog = [Send(1, 1, 0), Send(2, 1, 1, side=True), Recv(3, 1, 2, (4,), "float32", side=True),
            Recv(4, 1, 3, (4,), "float32"), Send(5, 1, 4)]
    assert p2p_batches(prog) == {0, 1, 3}
    assert p2p_batches([dataclasses.replace(i, side=False) for i in prog]) == {0}


def test_a_streamed_gradients_messages_folds_and_stitches_leave_the_compute_stream(
        fsdp_step) -> None:
    low = lower(fsdp_step, deliver=IN_PLACE)
    for prog in low.programs:
        side_sends = [i for i in prog.instrs if isinstance(i, Send) and i.side]
        assert side_sends and all(not i.queue for i in side_sends)
        assert any(isinstance(i, Reduce) and i.queue for i in prog.instrs)
    # the same programs with every message on the compute stream launch more batches there
    plain = dataclasses.replace(low, programs=tuple(
        dataclasses.replace(p, instrs=tuple(
            dataclasses.replace(i, side=False) if isinstance(i, Send | Recv) else i
            for i in p.instrs)) for p in low.programs))
    t = simulate_programs(low, fsdp_step.topology, cost_model=fsdp_step.options.cost).time_s
    assert t < simulate_programs(plain, fsdp_step.topology,
                                 cost_model=fsdp_step.options.cost).time_s


def test_the_next_ops_inputs_leave_before_this_ops_kernels(fsdp_step) -> None:
    """A tensor made by op P and read only by R, two or more ops later: rank 0 sends its
    blocks before the kernels of the op before R, not after them."""
    g = fsdp_step.graph
    order = {op.name: k for k, op in enumerate(g.ops)}
    readers: dict[str, list[str]] = {}
    for op in g.ops:
        for name in dict.fromkeys(op.inputs):
            readers.setdefault(name, []).append(op.name)

    def sends_before(ahead: bool) -> list[bool]:
        instrs = lower(fsdp_step, deliver=IN_PLACE, ahead=ahead).programs[0].instrs
        made = {x.out: x.op for x in instrs if isinstance(x, Compute)}
        first = {}
        for i, x in enumerate(instrs):
            if isinstance(x, Compute):
                first.setdefault(x.op, i)
        out = []
        for i, x in enumerate(instrs):
            op = made.get(x.src) if isinstance(x, Send) and not x.queue else None
            if op is None:
                continue
            (reader, *more) = readers.get(g.op(op).output, [None])
            if reader is None or more or order[reader] - order[op] < 2:
                continue
            before = g.ops[order[reader] - 1].name
            if before in first:
                out.append(i < first[before])
        return out

    early, late = sends_before(True), sends_before(False)
    assert early and all(early)
    assert late and not any(late)


def test_sending_ahead_is_never_slower_and_computes_as_the_reference() -> None:
    """The forward of a Ulysses layout (its all-to-alls sent ahead, on the side stream) and an
    FSDP training step (its gradients folded there), on the local executor against the
    reference."""
    module, (x,) = preset("llama-tiny", batch=2, seq=16)
    g = llama_block_graph(module.config, 2, 16)
    train = training_graph("llama-tiny", 2, 16, "float32", "adamw")
    forward = named_plan(g, "a100x8", "ulysses", options=Options("sharded", False))
    step = named_plan(train.graph, "a100x8", "fsdp", options=Options("sharded", False))
    for plan, early in ((forward, Send), (step, Reduce)):
        assert _time(plan, ahead=True) <= _time(plan, ahead=False) * (1 + 1e-9)
        low = lower(plan)
        # weight prefetches carry queue numbers too, but never `side`, and never fold
        assert any(isinstance(i, early) and (i.side if early is Send else i.queue)
                   for p in low.programs for i in p.instrs)
        ins = inputs_for(plan.graph, 7)
        ins.update({k: v.abs() for k, v in ins.items() if k.endswith("exp_avg_sq")})
        if plan.graph is train.graph:
            ins.update({k: torch.tensor([v]) for k, v in train.scalar_values(3).items()})
        want = evaluate(plan.graph, ins)
        got = run_local(low, ins)
        for name in plan.graph.outputs:
            assert rel_err(got[name].float(), want[name].float()) <= 1e-4, name


def test_a_constant_costs_the_simulator_nothing(fsdp_step) -> None:
    low = lower(fsdp_step, deliver=IN_PLACE)
    assert any(isinstance(i, Const) for p in low.programs for i in p.instrs)
    sim = simulate_programs(low, fsdp_step.topology, trace=True,
                            cost_model=fsdp_step.options.cost)
    consts = [e for e in sim.trace if e[2] == "Const"]
    assert consts and all(end == start for _, _, _, _, start, end in consts)
