"""gloo executor: plans on 2 and 4 ranks equal the reference with every collective forbidden;
a killed rank and a wrong world size fail fast with clear errors."""
from __future__ import annotations

import random
import time

import pytest
import torch

from einsummable.errors import PlanError, RuntimeFault
from einsummable.backend.lowering import lower
from einsummable.planning.placement import INPUT_PREFIX, input_op, place, split_choice
from einsummable.frontend.reference import evaluate
from einsummable.backend.runtime import run
from einsummable.backend.runtime.dist import Pools
from einsummable.topology import load_topology, synthetic

from test_lower_local import random_choice, rel_err


@pytest.fixture(scope="module")
def pools():
    p = Pools()
    yield p
    p.close()


def llama():
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, (x,) = preset("llama-tiny", batch=2, seq=8)
    g = llama_block_graph(module.config, 2, 8)
    ins = {"x": x, **{k: v.detach() for k, v in module.named_parameters()}}
    return g, ins, module(x).detach()


def split_plan(g, n, prefer):
    """Split each op on the first mode of `prefer` it can split n ways, else replicate."""
    return split_choice(g, n, prefer, inputs_on=0)


def named_plans(g, topo):
    """Hand-named plans; the optimizer's `es.named_plan` ones join when it lands."""
    n = topo.world_size
    out = {"one-device": split_plan(g, 1, ()) | {},
           "random": random_choice(g, n, random.Random(0))}
    out["one-device"] = {k: place(input_op(g.tensor(k[len(INPUT_PREFIX):])) if k.startswith(
        INPUT_PREFIX) else g.op(k), {}, [0]) for k in split_plan(g, 1, ())}
    out["batch-parallel"] = split_plan(g, n, ("b",))
    out["head-parallel"] = split_plan(g, n, ("h", "f", "n", "b"))
    try:
        from einsummable.optimizer.api import named_plan, optimize
    except ImportError:  # the optimizer is optional for these tests
        return out
    for name in ("data-parallel", "fsdp", "megatron-tp"):
        try:
            out[name] = dict(named_plan(g, topo, name).choice)
        except Exception:  # noqa: BLE001 - a strategy may not apply to this shape
            pass
    out["optimized"] = dict(optimize(g, topo).choice)
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_llama_tiny_on_gloo_equals_reference(n, pools):
    g, ins, ref = llama()
    topo = synthetic(n) if n == 2 else load_topology("cpu4")
    want = evaluate(g, ins)[g.outputs[0]]
    assert rel_err(want, ref) <= 1e-5
    plans = named_plans(g, topo)
    assert len(plans) >= 4
    from einsummable.backend.runtime.dist import run_dist
    for name, choice in plans.items():
        low = lower(g, choice, topo)
        got = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
        assert rel_err(got[g.outputs[0]], want) <= 1e-5, name
        # A second call reuses the pool and the weights already placed.
        got2 = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
        assert torch.equal(got[g.outputs[0]], got2[g.outputs[0]])


def test_collectives_really_raise_in_workers(pools):
    from einsummable.backend.runtime.dist import forbid_collectives
    import torch.distributed as dist
    saved = {k: getattr(dist, k) for k in ("all_reduce", "barrier", "broadcast")}
    try:
        forbid_collectives()
        for k in saved:
            with pytest.raises(RuntimeFault, match="collective"):
                getattr(dist, k)(torch.zeros(1))
    finally:
        for k, v in saved.items():
            setattr(dist, k, v)


def test_killed_rank_fails_everyone_fast():
    g, ins, _ = llama()
    topo = load_topology("cpu4")
    low = lower(g, split_plan(g, 4, ("b",)), topo)
    from einsummable.backend.runtime.dist import run_dist
    p = Pools()
    try:
        pool = p.get("gloo", 4)
        procs = list(pool._procs)
        start = time.monotonic()
        with pytest.raises(RuntimeFault, match="rank 2"):
            run_dist(low, ins, backend="gloo", pools=p, fault=(2, len(low.programs[2].instrs) // 2))
        assert time.monotonic() - start < 60
        for proc in procs:
            proc.join(10)
            assert not proc.is_alive()
    finally:
        p.close()


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
