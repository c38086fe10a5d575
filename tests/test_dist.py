"""gloo executor: plans on 2 and 4 ranks equal the reference with every collective forbidden;
a killed rank and a wrong world size fail fast with clear errors."""
from __future__ import annotations

import os
import time

import pytest
import torch

from einsummable.errors import PlanError, RuntimeFault
from einsummable.backend.lowering import lower
from einsummable.planning.placement import INPUT_PREFIX, input_op, place
from einsummable.frontend.reference import evaluate
from einsummable.backend.runtime import run
from einsummable.backend.runtime.dist import WAIT_TIMEOUT_S
from einsummable.backend.runtime.pool import Pools, run_dist
from einsummable.topology import load_topology, synthetic

from helpers import (LLAMA_TINY_STRATEGIES, llama_tiny as llama, named_plans, probe_blocks,
                     rel_err, split_plan)


@pytest.mark.parametrize("n", [2, 4])
def test_llama_tiny_on_gloo_equals_reference(n, pools):
    g, ins, ref = llama()
    topo = synthetic(n) if n == 2 else load_topology("cpu4")
    want = evaluate(g, ins)[g.outputs[0]]
    assert rel_err(want, ref) <= 1e-5
    plans = named_plans(g, topo)  # every named strategy applies here, or this raises
    assert set(LLAMA_TINY_STRATEGIES) < set(plans)
    from einsummable.backend.runtime.pool import run_dist
    for name, choice in plans.items():
        low = lower(g, choice, topo)
        got = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
        assert rel_err(got[g.outputs[0]], want) <= 1e-5, name
        # A second call reuses the pool and the weights already placed.
        got2 = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
        assert torch.equal(got[g.outputs[0]], got2[g.outputs[0]])


def test_collectives_really_raise_in_workers(pools, monkeypatch):
    # Every rank's input block is a probe whose use (the rank's Place) calls all_reduce in
    # that worker process. In a pool that forbids collectives the rank raises there and the
    # run fails naming the collective (where they are allowed, the all_reduce runs across
    # the ranks and the run succeeds). The parent's torch.distributed is never patched: the
    # refusal lives in the workers.
    import torch.distributed as dist
    import einsummable.backend.runtime.pool as pool_mod
    from einsummable.backend.runtime.pool import run_dist
    from einsummable.frontend.builder import Builder
    from einsummable.frontend.scalar import arg
    b = Builder()
    x = b.input("x", (4, 3))
    g = b.build([b.map(arg(0) * 2.0, x)])
    op = g.ops[0]
    # Rows split over the 2 ranks, each holding its own rows: one Place per rank, no sends.
    choice = {op.name: place(op, {op.modes[0]: 2}, [0, 1]),
              INPUT_PREFIX + "x": place(input_op(g.tensor("x")), {"a": 2}, [0, 1])}
    low = lower(g, choice, synthetic(2))
    ins = {"x": torch.arange(12.0).reshape(4, 3)}
    real = pool_mod.rank_blocks
    monkeypatch.setattr(pool_mod, "rank_blocks", lambda *a: probe_blocks(real(*a)))
    parent_all_reduce = dist.all_reduce
    with pytest.raises(RuntimeFault, match=r"rank \d failed: collective "
                       r"torch\.distributed\.all_reduce was called"):
        run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
    assert dist.all_reduce is parent_all_reduce


def test_killed_rank_fails_everyone_fast():
    g, ins, _ = llama()
    topo = load_topology("cpu4")
    low = lower(g, split_plan(g, 4, ("b",)), topo)
    from einsummable.backend.runtime.pool import run_dist
    p = Pools()
    try:
        pool = p.get("gloo", 4)
        procs = list(pool._procs)
        start = time.monotonic()
        with pytest.raises(RuntimeFault, match=r"rank 2 died \(exit code 17\)"):
            run_dist(low, ins, backend="gloo", pools=p, fault=(2, len(low.programs[2].instrs) // 2))
        # Found dead, not waited for: sooner than any rank's receive could time out.
        assert time.monotonic() - start < WAIT_TIMEOUT_S
        for proc in procs:
            proc.join(10)
            assert not proc.is_alive()
    finally:
        p.close()


def test_a_stopped_rank_is_named_before_any_receive_times_out(monkeypatch):
    """A rank whose process is there but does not run (SIGSTOP, as a debugger or the machine
    would stop it) sends no heartbeat: it is named, not a peer whose receive times out (nor a
    rank that waits on it and goes quiet after it)."""
    import signal
    from einsummable.backend.runtime import pool as pool_mod
    FROZEN_AFTER_S = 4.0  # eight missed beats; the default's 10 s only adds to the suite
    monkeypatch.setattr(pool_mod, "FROZEN_AFTER_S", FROZEN_AFTER_S)
    g, ins, _ = llama()
    low = lower(g, split_plan(g, 4, ("b",)), load_topology("cpu4"))
    p = Pools()
    try:
        pool = p.get("gloo", 4)
        os.kill(pool._procs[2].pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(RuntimeFault, match=r"rank 2 stopped responding"):
            run_dist(low, ins, backend="gloo", pools=p)
        assert FROZEN_AFTER_S <= time.monotonic() - start < WAIT_TIMEOUT_S
    finally:
        p.close()


def test_the_rank_named_is_the_one_silent_longest():
    from einsummable.backend.runtime.pool import FROZEN_AFTER_S, _quietest
    now = 100.0
    late = now - FROZEN_AFTER_S - 1
    # rank 2 stopped first; rank 0 waited on it and went quiet a beat later
    assert _quietest({0: late + 0.5, 1: now, 2: late, 3: now}, {}, now) == 2
    assert _quietest({0: late + 0.5, 1: now, 2: late, 3: now}, {2: None}, now) == 0
    assert _quietest({0: now, 1: now - 1.0}, {}, now) is None
    # a rank stopped while idle keeps its stamp from the last job; silence counts from this
    # job's start, and it is still the one named before a rank that stamped as it took the job
    job = now - FROZEN_AFTER_S - 0.1
    assert _quietest({0: job + 0.05, 1: now, 2: job - 50.0}, {}, now, since=job) == 2
    assert _quietest({0: now, 1: now, 2: job - 50.0}, {}, now - 0.2, since=job) is None


def test_a_failing_rank_puts_its_error_first_and_the_traceback_below(monkeypatch):
    from einsummable.backend.runtime import pool as pool_mod
    try:
        raise ValueError("bad block\nsecond line")
    except ValueError as e:
        text = pool_mod._failure(e)
    head, _, below = text.partition("\n")
    assert head == "ValueError: bad block"
    assert "Traceback" in below and "test_dist.py" in below


def test_world_size_mismatch_is_refused():
    g, ins, _ = llama()
    low = lower(g, split_plan(g, 4, ("b",)), load_topology("cpu4"))
    with pytest.raises(PlanError, match="plan is for 4 ranks"):
        run(low, ins, backend="gloo", world_size=2)
    with pytest.raises(PlanError, match="plan is for 4 ranks"):
        run(low, ins, backend="local", world_size=3)


def test_compile_llama_tiny_on_gloo():
    from einsummable.compiler import compile as es_compile
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, (x,) = preset("llama-tiny", batch=2, seq=8)
    g = llama_block_graph(module.config, 2, 8)
    fn = es_compile(module, (x,), topology="cpu4", backend="gloo", graph=g)
    ref = module(x).detach()
    assert rel_err(fn(x), ref) <= 1e-5
    fn_local = es_compile(module, (x,), topology="cpu4", backend="local", graph=g)
    assert rel_err(fn_local(x), ref) <= 1e-5


def test_the_timeline_has_one_ordered_entry_per_instruction():
    # A one-rank program sends nothing, so `execute` runs it without a process group.
    from einsummable.backend.runtime.dist import execute, rank_blocks
    g, ins, _ = llama(2, 8)
    ch = {op.name: place(op, {}, [0]) for op in g.ops}
    ch.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in g.inputs})
    low = lower(g, ch, synthetic(1))
    timeline: list = []
    with torch.no_grad():
        outs = execute(low, 0, rank_blocks(low, 0, ins), timeline=timeline)
    instrs = low.programs[0].instrs
    assert [e[0] for e in timeline] == list(range(len(instrs)))
    assert [e[1] for e in timeline] == [type(i).__name__ for i in instrs]
    assert all(a <= b <= c for _, _, a, b, c in timeline)
    assert all(x[4] <= y[2] for x, y in zip(timeline, timeline[1:]))
    ref = evaluate(g, ins)[g.outputs[0]]
    assert torch.allclose(outs[g.outputs[0]], ref, atol=1e-5)
