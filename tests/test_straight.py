"""A message-free program bound into closures (`runtime/straight.py`) means what the handler
path means: the same outputs, the same buffers dropped where the program frees them; and a
kernel bound to its block extents (`kernels.bind_kernel`) computes what its unbound call does."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from einsummable import named_plan
from einsummable.backend.lowering import lower
from einsummable.backend.runtime.dist import execute, rank_blocks
from einsummable.backend.runtime.rank_state import RankState, step_handler
from einsummable.backend.runtime.straight import has_messages, straight_runner
from einsummable.core.program import Free
from einsummable.frontend import kernels
from einsummable.frontend.reference import evaluate
from einsummable.topology import synthetic

from helpers import inputs_for, llama_tiny, random_choice, random_graph, rel_err


def _states(low, inputs, rank=0):
    """Two RankStates of one rank over the same inputs: one for each path."""
    prog = low.programs[rank]
    return [RankState(low, prog, inputs, "cpu", consts={}) for _ in range(2)]


def _by_handlers(st: RankState) -> None:
    for ins in st.prog.instrs:
        step_handler(ins)(st, ins)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31))
def test_straight_equals_the_handlers_on_random_one_device_programs(seed):
    rng = random.Random(seed)
    g = random_graph(rng)
    low = lower(g, random_choice(g, 1, rng), synthetic(1))
    ins = inputs_for(g, seed)
    straight, handlers = _states(low, ins)
    straight_runner(straight)()
    _by_handlers(handlers)
    # every freed buffer is gone on both paths, and only those
    assert set(straight.bufs) == set(handlers.bufs)
    want = evaluate(g, ins)
    for name in g.outputs:
        assert torch.equal(straight.outputs[name], handlers.outputs[name])
        assert rel_err(straight.outputs[name], want[name]) <= 1e-5


def test_frees_drop_buffers_as_the_program_runs():
    # a long program keeps only what it has not freed yet: peak memory is the program's
    g, inputs, _ = llama_tiny(batch=2, seq=8)
    low = lower(g, _one_device(g), synthetic(1))
    prog = low.programs[0]
    st, _ = _states(low, inputs)
    straight_runner(st)()
    freed = {i.buf for i in prog.instrs if isinstance(i, Free)}
    assert freed and not freed & set(st.bufs)


def _one_device(g):
    return named_plan(g, synthetic(1), "one-device").chosen


def test_execute_runs_a_message_free_rank_straight_and_keeps_its_steps():
    # the steps are bound once per plan and kept in the caller's consts; a second run reuses
    # them and gives the same output
    g, inputs, want = llama_tiny(batch=2, seq=8)
    low = lower(g, _one_device(g), synthetic(1))
    assert not has_messages(low.programs[0])
    blocks = rank_blocks(low, 0, inputs)
    consts: dict = {}
    first = execute(low, 0, blocks, consts=consts)[g.outputs[0]]
    steps = consts["straight"][1]
    second = execute(low, 0, blocks, consts=consts)[g.outputs[0]]
    assert consts["straight"][1] is steps
    assert torch.equal(first, second)
    torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-5)
    # the traced path (a timeline) runs the handlers one by one: the same output
    timeline: list = []
    traced = execute(low, 0, blocks, timeline=timeline)[g.outputs[0]]
    assert timeline and torch.equal(traced, first)


def test_a_program_with_messages_is_not_run_straight():
    g, _, _ = llama_tiny(batch=2, seq=8)
    low = lower(g, named_plan(g, synthetic(2), "megatron-tp").chosen, synthetic(2))
    prog = next(p for p in low.programs if has_messages(p))
    st = RankState(low, prog, {}, "cpu", consts={})
    with pytest.raises(ValueError, match="without sends or receives"):
        straight_runner(st)


@pytest.mark.parametrize("name", ["llama-tiny", "mistral-tiny", "gpt2-tiny"])
def test_bound_attention_equals_the_spelled_out_attention_on_any_block(name):
    # Blocks of split batch, heads and queries (keys whole or cut at the query's end, so a
    # causal block needs a mask of global positions): the bound sdpa kernel against the
    # layout-generic einsum attention, which binds nothing.
    from einsummable import trace
    from einsummable.models import preset
    module, (x,) = preset(name, batch=2, seq=12)
    g = trace(module, (x,))
    ops = [op for op in g.ops if op.fused == "attention"]
    assert ops
    rng = random.Random(0)
    for op in ops:
        p = op.param
        for _ in range(6):
            ranges = {}
            for m in op.modes:
                n = op.size[m]
                if m in p["e"] + p["f"] + p["k"] or n == 1:
                    ranges[m] = (0, n)
                else:
                    lo = rng.randrange(n)
                    ranges[m] = (lo, rng.randrange(lo + 1, n + 1))
            qm, km = p["q"], p["k"]
            if p.get("causal") and len(qm) == 1 and len(km) == 1 and rng.random() < 0.5:
                ranges[km[0]] = (0, ranges[qm[0]][1])  # keys up to the block's last query
            blocks = []
            for t, dims in zip(op.inputs, op.in_dims):
                shape = [kernels.math.prod(ranges[m][1] - ranges[m][0] for m in grp)
                         for grp in dims]
                blocks.append(torch.randn(shape, generator=torch.Generator().manual_seed(7)))
            got = kernels.bind_kernel(op, ranges)(blocks)
            want = kernels._attention_einsum(op, blocks, ranges)
            torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
