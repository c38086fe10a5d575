"""Lowering + local executor == reference, for random graphs, random (not only optimal)
candidates, world sizes 1, 2, 3, 4, 6, 8 and uneven shapes; programs print and round-trip."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from einsummable.frontend.builder import Builder
from einsummable.errors import PlanError
from einsummable.backend.lowering import lower
from einsummable.frontend.reference import evaluate
from einsummable.backend.runtime.local import run_local
from einsummable.backend.lowering import Lowered
from einsummable.planning.spec import decompositions
from einsummable.topology import synthetic

from helpers import (TOPOS, evaluate_by_tuples, inputs_for, llama_tiny, random_choice, random_graph,
                     rel_err)


@settings(max_examples=520)
@given(seed=st.integers(0, 2 ** 31), n=st.sampled_from(sorted(TOPOS)),
       mode=st.sampled_from(["optimized", "optimized", "naive"]))
def test_local_equals_reference(seed, n, mode):
    rng = random.Random(seed)
    g = random_graph(rng)
    choice = random_choice(g, n, rng)
    low = lower(g, choice, TOPOS[n], mode=mode)
    ins = inputs_for(g, seed)
    got = run_local(low, ins)
    want = evaluate(g, ins)
    for name in g.outputs:
        assert got[name].shape == want[name].shape
        assert rel_err(got[name], want[name]) <= 1e-5


def test_llama_tiny_block_random_plans():
    g, ins, _ = llama_tiny(batch=2, seq=6)
    want = evaluate(g, ins)[g.outputs[0]]
    for seed, n in [(0, 2), (1, 4), (2, 3), (3, 8)]:
        choice = random_choice(g, n, random.Random(seed))
        got = run_local(lower(g, choice, TOPOS[n]), ins)[g.outputs[0]]
        assert rel_err(got, want) <= 1e-5


def test_programs_print_and_round_trip():
    rng = random.Random(7)
    g = random_graph(rng)
    low = lower(g, random_choice(g, 4, rng), TOPOS[4])
    text = str(low)
    assert "program rank 3/4" in text and "compute" in text
    back = Lowered.from_json(low.to_json())
    assert back.programs == low.programs
    ins = inputs_for(g, 7)
    torch.testing.assert_close(run_local(back, ins)[g.outputs[0]], evaluate(g, ins)[g.outputs[0]])


def test_every_buffer_is_freed_except_outputs():
    rng = random.Random(11)
    g = random_graph(rng)
    low = lower(g, random_choice(g, 4, rng), TOPOS[4])
    from einsummable.core.program import Free, Output, Unpack, writes
    for p in low.programs:
        made = {writes(i) for i in p.instrs if writes(i) is not None}
        made |= {part[0] for i in p.instrs if isinstance(i, Unpack) for part in i.parts}
        freed = {i.buf for i in p.instrs if isinstance(i, Free)}
        kept = {i.src for i in p.instrs if isinstance(i, Output)}
        assert made == freed | kept


def test_plan_for_more_devices_is_refused():
    # Every op and input on device 7 of 8: the 4-device topology has no such rank.
    from einsummable.planning.placement import INPUT_PREFIX, input_op, place
    g = random_graph(random.Random(5))
    choice = {op.name: place(op, {}, [7]) for op in g.ops}
    choice.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [7]) for t in g.inputs})
    lower(g, choice, TOPOS[8])  # fine where device 7 exists
    with pytest.raises(PlanError, match="topology has 4"):
        lower(g, choice, TOPOS[4])


@pytest.mark.parametrize("spec,shapes", [
    ("bsd,fd->bsf", [(2, 3, 4), (5, 4)]), ("bsd,df->bsf", [(2, 3, 4), (4, 5)]),
    ("bsd,(he)d->bhse", [(2, 3, 4), (6, 4)]), ("bhse,d(he)->bsd", [(2, 2, 3, 3), (5, 6)]),
    ("abc(XY),XZ->abc(ZY)", [(2, 3, 4, 6), (2, 2)]), ("ij,jk->ki", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])])
def test_evaluate_op_fast_paths_equal_einsum(spec, shapes):
    """The cached matmul / small-contraction / einsum plans agree with torch.einsum, also on
    blocks of every decomposition (other extents, other plans)."""
    from einsummable.frontend.reference import evaluate_op
    b = Builder()
    xs = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    sizes = {"Y": 3, "X": 2} if "XY" in spec else {"e": 3} if "(he)" in spec else None
    y = b.einsum(spec, *xs, sizes=sizes)
    g = b.build([y])
    op = g.ops[0]
    gen = torch.Generator().manual_seed(0)
    blocks = [torch.randn(s, generator=gen) for s in shapes]
    fine = [t.reshape([op.size[m] for grp in d for m in grp]) for t, d in zip(blocks, op.in_dims)]
    letters = {m: chr(97 + i) for i, m in enumerate(op.modes)}
    eq = ",".join("".join(letters[m] for grp in d for m in grp) for d in op.in_dims) + "->" + \
        "".join(letters[m] for m in op.out_modes)
    want = torch.einsum(eq, *fine).reshape(g.tensor(g.outputs[0]).shape)
    assert torch.allclose(evaluate_op(op, blocks), want, atol=1e-6)
    for dec in decompositions(op, 2):
        assert torch.allclose(evaluate_by_tuples(op, dec, blocks), want, atol=1e-6)


def test_blocks_cut_over_the_rails_between_nodes_equal_reference(monkeypatch):
    # MiB-sized blocks between the two nodes of synthetic(4, nodes=2) are cut over both NICs
    # and relayed; relays keep what passed them and send it on. The programs stay exact.
    import einsummable.backend.lowering as mod
    exchanges = []
    synth = mod.synthesize
    monkeypatch.setattr(mod, "synthesize", lambda *a, **k: exchanges.append(synth(*a, **k))
                        or exchanges[-1])
    b = Builder()
    x = b.input("x", (2048, 1024))
    w = b.weight("w", (1024, 8))
    g = b.build([b.einsum("ij,jk->ik", (x * 0.5).tanh() + x, w)])
    topo = synthetic(4, nodes=2)
    ins = inputs_for(g, 0)
    want = evaluate(g, ins)[g.outputs[0]]
    for seed in range(4):
        got = run_local(lower(g, random_choice(g, 4, random.Random(seed)), topo), ins)
        assert rel_err(got[g.outputs[0]], want) <= 1e-5
    assert any(len(t.hops) > 2 for ex in exchanges for t in ex.transfers)
