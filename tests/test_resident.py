"""Outputs carried to the next call (`backend/carry.py`, `Keep`): the blocks the ranks keep are
the outputs in their paired inputs' layouts, the next run reads them instead of what the caller
would send, and `compile_train` keeps the AdamW state (and the parameters) on the ranks: it is
never sent after the first step, a parameter the caller changes is sent again, and 20 steps
still train as torch.optim does."""
from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

import einsummable as es
import einsummable.training as training
from einsummable.backend.carry import Carry
from einsummable.backend.lowering import lower
from einsummable.backend.runtime import kept, run
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.core.program import Keep, Place
from einsummable.errors import PlanError, ShapeError
from einsummable.frontend.builder import Builder
from einsummable.frontend.capture import trace_step
from einsummable.frontend.optim import Hyper, with_update
from einsummable.frontend.reference import evaluate
from einsummable.models import preset

from helpers import TOPOS, inputs_for, random_choice, rel_err
from test_step_capture import _llama
from test_training import ADAMW_CONDITIONING, HYPER, STEPS, TOL, _rel, _torch_optim


# ----------------------------------------------------------------------------- the programs

def _carried_graph(rng: random.Random):
    """A random step of the shape training has: h = x w, some maps of h, a partial-sum
    gradient g = x^T h' (split over the rows it folds partial sums), and outputs that stand for
    the inputs next call: w' = w - g / 10 (a weight) and x' = tanh(h' w^T) (an input), beside
    a loss-like sum that is not carried. Sizes 1..7, uneven."""
    b = Builder()
    m, k, n = (rng.randint(1, 7) for _ in range(3))
    x, w = b.input("x", (m, k)), b.weight("w", (k, n))
    h = b.einsum("ij,jk->ik", x, w)
    for _ in range(rng.randint(0, 2)):
        h = [(h * 0.5).tanh() + h, h.softmax(-1), h.amax(1, keepdim=True) + h][rng.randrange(3)]
    g = b.einsum("ij,ik->jk", x, h)
    w_next = w - g * 0.1
    x_next = b.einsum("ik,jk->ij", h, w).tanh()
    loss = h.sum(0, keepdim=True)
    return b.build([loss, w_next, x_next]), (("w", w_next.name), ("x", x_next.name))


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2 ** 31), n=st.sampled_from([1, 2, 3, 4, 6]),
       returned=st.booleans())
def test_kept_blocks_are_the_outputs_in_their_inputs_layout(seed, n, returned):
    rng = random.Random(seed)
    g, pairs = _carried_graph(rng)
    carry = Carry(pairs, returned=(pairs[0][1],) if returned else ())
    low = lower(g, random_choice(g, n, rng), TOPOS[n], carry=carry)
    simulate_programs(low, TOPOS[n])  # the simulator takes the new programs
    ins = inputs_for(g, seed)
    store: dict = {}
    first = run_local(low, ins, resident=store)
    want = evaluate(g, ins)
    assert rel_err(first[g.outputs[0]], want[g.outputs[0]]) <= 1e-5
    assert (pairs[0][1] in first) == returned and pairs[1][1] not in first
    # every rank keeps, for each Place of a carried input, that block of its output
    for p in low.programs:
        places = {(i.tensor, i.region) for i in p.instrs
                  if isinstance(i, Place) and i.tensor in ("w", "x")}
        keeps = {(i.tensor, i.region) for i in p.instrs if isinstance(i, Keep)}
        assert keeps == places and set(store.get(p.rank, {})) == places
        for (x, region), block in store.get(p.rank, {}).items():
            y = dict(pairs)[x]
            sl = tuple(slice(a, b) for a, b in region)
            assert rel_err(block, want[y][sl]) <= 1e-5
    # the next run reads the kept blocks: the caller passes neither w nor x
    second = run_local(low, {}, resident=store)
    again = evaluate(g, {"x": want[pairs[1][1]], "w": want[pairs[0][1]]})
    assert rel_err(second[g.outputs[0]], again[g.outputs[0]]) <= 1e-5
    assert rel_err(kept(low, ["w"], resident=store)["w"], again[pairs[0][1]]) <= 1e-5


def test_a_passed_input_replaces_the_kept_one():
    g, pairs = _carried_graph(random.Random(3))
    low = lower(g, random_choice(g, 2, random.Random(3)), TOPOS[2], carry=Carry(pairs))
    ins, store = inputs_for(g, 3), {}
    run_local(low, ins, resident=store)
    got = run_local(low, {"w": ins["w"] * 2}, resident=store)[g.outputs[0]]
    want = evaluate(g, {"x": evaluate(g, ins)[pairs[1][1]], "w": ins["w"] * 2})[g.outputs[0]]
    assert rel_err(got, want) <= 1e-5


def test_an_input_neither_passed_nor_kept_is_named():
    g, pairs = _carried_graph(random.Random(4))
    low = lower(g, random_choice(g, 2, random.Random(4)), TOPOS[2], carry=Carry(pairs))
    with pytest.raises(ShapeError, match="missing input 'x'"):
        run_local(low, {"w": inputs_for(g, 4)["w"]}, resident={})


@pytest.mark.parametrize("pairs,returned,match", [
    ((("nope", "w_next"),), (), "not an input"), ((("w", "nope"),), (), "not an output"),
    ((("x", "W_NEXT"),), (), "cannot stand for"), ((("w", "W_NEXT"),), ("X_NEXT",), "not carried")])
def test_a_bad_carry_is_named(pairs, returned, match):
    g, (pw, px) = _carried_graph(random.Random(5))
    rename = {"W_NEXT": pw[1], "X_NEXT": px[1], "w_next": pw[1]}
    pairs = tuple((x, rename.get(y, y)) for x, y in pairs)
    if match == "cannot stand for" and g.tensor("x").shape == g.tensor(pw[1]).shape:
        pytest.skip("this draw gives w' the shape of x")
    with pytest.raises(PlanError, match=match):
        lower(g, random_choice(g, 2, random.Random(5)), TOPOS[2],
              carry=Carry(pairs, tuple(rename.get(y, y) for y in returned)))


# ----------------------------------------------------------------------------- training

class _Feeds:
    """The inputs each call of `run` was passed (what the parent sends the ranks)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[set[str]] = []
        real = training.run

        def spy(low, feed, **kw):
            self.calls.append(set(feed))
            return real(low, feed, **kw)
        monkeypatch.setattr(training, "run", spy)


def _sent(pools) -> dict[str, int]:
    return pools.get("gloo", 2).last_sent


def _train(module, x, optimizer: str, backend: str, pools, plan=None, steps: int = STEPS,
           between=None):
    """20 steps of `module` with einsummable (state resident) beside torch.optim in float32 and
    float64; per step the loss, the parameters and (AdamW) the gathered state are held to
    test_training's bars. `between(step, modules)` may change parameters between steps."""
    torch.manual_seed(1)
    y = torch.randn_like(module(x)).detach()
    loss_fn = torch.nn.functional.mse_loss
    ref32, ref64 = copy.deepcopy(module), copy.deepcopy(module).double()
    opt32, opt64 = _torch_optim(ref32, optimizer), _torch_optim(ref64, optimizer)
    step = es.compile_train(module, (x,), loss_fn, (y,), optimizer=optimizer, topology="cpu2",
                            backend=backend, plan=plan, pools=pools, **HYPER[optimizer])
    assert step.resident
    losses = []
    for i in range(steps):
        if between is not None:
            between(i, (module, ref32, ref64))
        losses.append(step((x,), (y,)))
        for ref, opt, a, b in ((ref32, opt32, x, y), (ref64, opt64, x.double(), y.double())):
            opt.zero_grad()
            want = loss_fn(ref(a), b)
            want.backward()
            opt.step()
        assert abs(losses[-1] - want.item()) / abs(want.item()) <= TOL
        mine = max(_rel(p.double(), q) for p, q in zip(module.parameters(), ref64.parameters()))
        torch32 = max(_rel(p.double(), q) for p, q in zip(ref32.parameters(),
                                                          ref64.parameters()))
        assert mine <= max(TOL, ADAMW_CONDITIONING * torch32), (i, mine, torch32)
    assert losses[-1] < losses[0]
    if optimizer == "adamw":  # the state, gathered from the ranks, is torch.optim's
        state = step.optimizer_state()
        for (name, p), q32, q64 in zip(module.named_parameters(), ref32.parameters(),
                                       ref64.parameters()):
            assert state[name]["step"] == steps
            for kind in ("exp_avg", "exp_avg_sq"):
                mine = _rel(state[name][kind].double(), opt64.state[q64][kind])
                theirs = _rel(opt32.state[q32][kind].double(), opt64.state[q64][kind])
                assert mine <= max(TOL, ADAMW_CONDITIONING * theirs), (name, kind, mine)
    return step


@pytest.mark.parametrize("backend", ["local", "gloo"])
def test_twenty_adamw_steps_keep_the_state_on_the_ranks(backend, pools, monkeypatch):
    feeds = _Feeds(monkeypatch)
    module, x = _llama(3, 5)
    params = {n for n, _ in module.named_parameters()}
    step = _train(module, x, "adamw", backend, pools)
    state = set(step.state_names)
    assert len(state) == 2 * len(params)
    assert state | params <= feeds.calls[0]  # placed once, on the first call
    for fed in feeds.calls[1:]:  # then never again: neither the state nor the parameters
        assert not fed & (state | params), fed & (state | params)
    if backend == "gloo":
        assert not set(_sent(pools)) & (state | params)  # nor did the pool send any block
    assert not step.state  # nothing of it lives in the step object


# megatron-tp splits the weights (and so their state) over both ranks; fsdp shards them
@pytest.mark.parametrize("strategy,optimizer", [("megatron-tp", "adamw"), ("fsdp", "sgd")])
def test_a_named_plan_trains_as_torch_optim_with_the_state_resident(strategy, optimizer,
                                                                     pools):
    module, (x,) = preset("gpt2-tiny", batch=2, seq=8)
    torch.manual_seed(1)
    y = torch.randn_like(module(x)).detach()
    train = with_update(trace_step(module, (x,), torch.nn.functional.mse_loss, (y,)),
                        Hyper(optimizer, **HYPER[optimizer]))
    plan = es.named_plan(train.graph, "cpu2", strategy)
    step = _train(module, x, optimizer, "gloo", pools, plan=plan)
    ranks = {p.rank for p in step.lowered.programs if any(isinstance(i, Keep) for i in p.instrs)}
    assert ranks == {0, 1}


def test_the_optimized_plan_of_two_split_ranks_trains_with_the_state_resident(pools):
    module, (x,) = preset("gpt2-tiny", batch=2, seq=8)
    torch.manual_seed(1)
    y = torch.randn_like(module(x)).detach()
    train = with_update(trace_step(module, (x,), torch.nn.functional.mse_loss, (y,)),
                        Hyper("adamw", **HYPER["adamw"]))
    _train(module, x, "adamw", "gloo", pools, plan=es.optimize(train.graph, "cpu2",
                                                                  cache=False))


@pytest.mark.parametrize("backend", ["local", "gloo"])
def test_a_parameter_changed_between_steps_is_sent_again_and_honoured(backend, pools,
                                                                      monkeypatch):
    feeds = _Feeds(monkeypatch)
    module, x = _llama(3, 5)
    name = "attention.wq.weight"
    changed = {5: "in place", 9: "replaced"}

    def between(i: int, modules) -> None:
        if i not in changed:
            return
        for m in modules:
            p = dict(m.named_parameters())[name]
            with torch.no_grad():
                if changed[i] == "in place":
                    p.mul_(0.5)
                else:
                    p.data = p.detach() * 1.5
    _train(module, x, "adamw", backend, pools, steps=12, between=between)
    resent = [i for i, fed in enumerate(feeds.calls) if name in fed]
    assert resent == [0, *changed], resent
    assert all(len(fed & {n for n, _ in module.named_parameters()}) <= 1
               for fed in feeds.calls[1:])


def test_fed_state_is_what_resident_replaces(pools):
    """`resident=False` (the old step, kept to measure against): the state lives in the step
    and every call sends it, and both give the same training."""
    module, x = _llama(2, 4)
    y = torch.randn_like(module(x)).detach()
    twin = copy.deepcopy(module)
    kw = dict(optimizer="adamw", topology="cpu2", backend="gloo", pools=pools, **HYPER["adamw"])
    fed = es.compile_train(twin, (x,), torch.nn.functional.mse_loss, (y,), resident=False, **kw)
    kept_ = es.compile_train(module, (x,), torch.nn.functional.mse_loss, (y,), **kw)
    for _ in range(3):
        want = kept_((x,), (y,))
        assert fed((x,), (y,)) == pytest.approx(want, rel=TOL)  # the pool's last job: fed's
    assert set(_sent(pools)) >= set(fed.state_names) | {n for n, _ in twin.named_parameters()}
    assert set(fed.state) == set(fed.state_names)
    a, b = fed.optimizer_state(), kept_.optimizer_state()
    for name in a:
        assert rel_err(a[name]["exp_avg_sq"], b[name]["exp_avg_sq"]) <= TOL


def test_run_keeps_the_blocks_for_the_backend_it_ran_on(pools):
    g, pairs = _carried_graph(random.Random(8))
    low = lower(g, random_choice(g, 2, random.Random(8)), TOPOS[2], carry=Carry(pairs))
    ins = inputs_for(g, 8)
    want = evaluate(g, ins)
    run(low, ins, backend="gloo", pools=pools)
    assert set(_sent(pools)) == {"x", "w"}
    second = run(low, {}, backend="gloo", pools=pools)
    assert _sent(pools) == {}
    again = evaluate(g, {"x": want[pairs[1][1]], "w": want[pairs[0][1]]})
    assert rel_err(second[g.outputs[0]], again[g.outputs[0]]) <= 1e-5
    got = kept(low, ["x", "w"], "gloo", pools=pools)
    assert rel_err(got["w"], again[pairs[0][1]]) <= 1e-5
    assert rel_err(got["x"], again[pairs[1][1]]) <= 1e-5
