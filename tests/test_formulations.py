"""The pairwise-choice MIP against brute force, plus memory diagnosis, time limits, CBC,
determinism and the tree DP. Everything here is small: the whole file runs in well under 60 s."""

from __future__ import annotations

import dataclasses
import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import formulations as F
import formulations.relax as relax_module
from formulations.relax import Relaxation

TOL = 1e-9


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


@st.composite
def problems(draw, max_nodes: int = 6, tree: bool = False, extras: bool = True,
             parts: bool = False) -> F.Problem:
    n = draw(st.integers(1, max_nodes))
    ks = [draw(st.integers(1, 5)) for _ in range(n)]
    while _product(ks) > 600:  # keeps brute force cheap
        ks[ks.index(max(ks))] -= 1
    names = [f"n{i}" for i in range(n)]
    unit = draw(st.sampled_from([1.0, 1e-6, 1e3]))  # seconds are small numbers
    cost = st.integers(0, 20)
    use_mem = extras and draw(st.booleans())
    k_parts = draw(st.integers(1, 3))  # overlapping parts: only the largest counts
    n_res = draw(st.integers(1, 2)) if use_mem else 0
    nodes = []
    for name, k in zip(names, ks):
        mem = None
        if use_mem and draw(st.booleans()):
            mem = tuple(tuple(draw(st.lists(st.integers(0, 9), min_size=k, max_size=k))) for _ in range(n_res))
        npart = None
        if parts and draw(st.booleans()):
            npart = tuple(tuple(unit * c for c in draw(st.lists(cost, min_size=k, max_size=k)))
                          for _ in range(k_parts))
        nodes.append(F.Node(name, tuple(unit * c for c in draw(st.lists(cost, min_size=k, max_size=k))), mem, npart))
    pairs = [(names[draw(st.integers(0, j - 1))], names[j]) for j in range(1, n) if draw(st.booleans())] if tree else [
        (names[i], names[j]) for j in range(n) for i in range(j) if draw(st.integers(0, 2)) == 0
    ]
    if not tree and n > 1 and draw(st.booleans()):
        pairs.append(pairs[0] if pairs else (names[0], names[1]))  # a parallel edge
    edges = []
    for a, b in pairs:
        ka, kb = ks[names.index(a)], ks[names.index(b)]
        pa = pb = None
        ra, rb = ka, kb
        if draw(st.booleans()):  # cost over layouts, several options per layout
            ra = draw(st.integers(1, ka))
            pa = tuple(draw(st.integers(0, ra - 1)) for _ in range(ka))
        if draw(st.booleans()):
            rb = draw(st.integers(1, kb))
            pb = tuple(draw(st.integers(0, rb - 1)) for _ in range(kb))
        mat = tuple(tuple(unit * draw(cost) for _ in range(rb)) for _ in range(ra))
        epart = None
        if parts and draw(st.booleans()):
            epart = tuple(tuple(tuple(unit * draw(cost) for _ in range(rb)) for _ in range(ra))
                          for _ in range(k_parts))
        edges.append(F.Edge(a, b, mat, pa, pb, epart))
    tie, fixed, side, caps, allowed = (), {}, (), None, {}
    if extras:
        by_k: dict[int, list[str]] = {}
        for name, k in zip(names, ks):
            by_k.setdefault(k, []).append(name)
        groups = [tuple(g[:3]) for g in by_k.values() if len(g) > 1 and draw(st.booleans())]
        tie = tuple(groups)
        if draw(st.integers(0, 3)) == 0:
            i = draw(st.integers(0, n - 1))
            fixed = {names[i]: draw(st.integers(0, ks[i] - 1))}
        if draw(st.integers(0, 3)) == 0:  # some options left out (e.g. by a bound)
            i = draw(st.integers(0, n - 1))
            allowed = {names[i]: tuple(draw(st.sets(st.integers(0, ks[i] - 1), min_size=1)))}
        if draw(st.integers(0, 2)) == 0:
            terms = tuple(
                (names[i], draw(st.integers(0, ks[i] - 1)), float(draw(st.integers(-2, 3))))
                for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
            )
            side = (F.LinearConstraint(terms, draw(st.sampled_from(["<=", ">=", "=="])), float(draw(st.integers(0, 3))), "s0"),)
        if use_mem:
            caps = tuple(float(draw(st.integers(0, 9 * n))) for _ in range(n_res))
    return F.Problem(tuple(nodes), tuple(edges), caps, side, tie, fixed, allowed=allowed)


def _product(ks):
    out = 1
    for k in ks:
        out *= k
    return out


def outcome(fn, problem):
    try:
        return fn(problem)
    except F.Infeasible as exc:
        return exc


def check_same(problem: F.Problem, got, want) -> None:
    if isinstance(want, F.Infeasible):
        assert isinstance(got, F.Infeasible), f"solver found {got} but brute force says infeasible"
        assert (got.extra is None) == (want.extra is None)
        if want.extra is not None:
            assert abs(got.extra - want.extra) <= 1e-6 * max(1.0, abs(want.extra))
        return
    assert not isinstance(got, F.Infeasible), f"brute force found {want} but solver raised {got}"
    assert got.status == "optimal"
    assert close(got.objective, want.objective), (got, want)
    assert got.objective == pytest.approx(F.objective(problem, got.assignment), rel=1e-12, abs=0)
    assert not F.violations(problem, got.assignment)
    assert got.bound <= got.objective + TOL * max(1.0, abs(got.objective))
    # optimal: the bound meets the objective (up to the solver's tolerance)
    assert got.objective - got.bound <= 1e-6 * max(1.0, abs(got.objective))


SLOW_OK = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@SLOW_OK
@given(problems())
def test_highs_matches_brute_force(problem):
    check_same(problem, outcome(F.solve, problem), outcome(F.exhaustive, problem))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(problems(parts=True))
def test_overlapping_parts_match_brute_force(problem):
    # objective = plain + max(part 0, part 1): the epigraph row pair against enumeration
    check_same(problem, outcome(F.solve, problem), outcome(F.exhaustive, problem))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(problems(max_nodes=5))
def test_cbc_matches_brute_force(problem):
    check_same(problem, outcome(lambda p: F.solve(p, solver="cbc"), problem), outcome(F.exhaustive, problem))


@settings(max_examples=60, deadline=None, database=None)
@given(problems(tree=True, extras=False), st.data())
def test_dp_matches_mip_on_trees(problem, data):
    if data.draw(st.booleans()):  # some options of one node left out
        n = data.draw(st.sampled_from(problem.nodes))
        keep = data.draw(st.sets(st.integers(0, n.n_options - 1), min_size=1))
        problem = dataclasses.replace(problem, allowed={n.name: tuple(keep)})
    dp, mip = F.solve_tree(problem), F.solve(problem)
    assert close(dp.objective, mip.objective)
    assert close(dp.objective, F.exhaustive(problem).objective)
    assert dp.status == "optimal" and dp.gap == 0.0


def test_dp_rejects_cycles_and_memory():
    nodes = [F.Node(n, (0.0, 1.0)) for n in "abc"]
    m = ((0.0, 1.0), (1.0, 0.0))
    cycle = F.Problem(nodes, [F.Edge("a", "b", m), F.Edge("b", "c", m), F.Edge("a", "c", m)])
    with pytest.raises(F.NotATree):
        F.solve_tree(cycle)
    mem = F.Problem([F.Node("a", (0.0, 1.0), ((1.0, 2.0),))], capacities=(5.0,))
    with pytest.raises(F.NotATree):
        F.solve_tree(mem)


def _memory_problem(cap: float) -> F.Problem:
    # two devices; option 0 puts everything on device 0, option 1 splits it
    nodes = [
        F.Node("w1", (0.0, 5.0), ((8.0, 4.0), (0.0, 4.0))),
        F.Node("w2", (0.0, 5.0), ((6.0, 3.0), (0.0, 3.0))),
        F.Node("act", (0.0, 1.0, 2.0), ((3.0, 2.0, 1.0), (0.0, 1.0, 2.0))),
    ]
    edges = [F.Edge("w1", "act", ((0.0, 1.0, 1.0), (1.0, 0.0, 1.0))), F.Edge("w2", "act", ((0.0, 1.0, 1.0), (1.0, 0.0, 1.0)))]
    return F.Problem(nodes, edges, capacities=(cap, cap))


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_infeasible_memory_reports_min_capacity(solver):
    # best split: w1=1, w2=1, act=1 -> device 0: 4+3+2 = 9, device 1: 4+3+1 = 8
    want = F.exhaustive(_memory_problem(9.0))
    assert want.status == "optimal"
    with pytest.raises(F.Infeasible) as info:
        F.solve(_memory_problem(6.0), solver=solver)
    exc = info.value
    assert exc.min_capacity == pytest.approx(9.0)
    assert exc.capacity == 6.0 and exc.extra == pytest.approx(3.0)
    assert "memory needs at least 9 bytes on resource" in str(exc) and "capacity is 6" in str(exc)
    with pytest.raises(F.Infeasible) as brute:
        F.exhaustive(_memory_problem(6.0))
    assert brute.value.min_capacity == pytest.approx(9.0)
    ok = F.solve(_memory_problem(exc.min_capacity), solver=solver)  # the reported capacity fits
    assert ok.objective == pytest.approx(want.objective)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_an_elastic_side_row_is_a_memory_row(solver):
    # The memory problem at 9 bytes fits (w1=1, w2=1, act=1: 9 and 8); an elastic row over
    # w1 and act adding 4 bytes where both take option 1 (as gather cuts do) is hard in the
    # MIP, relaxed by the same δ as the capacity rows in the model of least memory, and left
    # out of the check without memory.
    cut = F.LinearConstraint((("w1", 1, 4.0), ("act", 1, 4.0)), "<=", 9.0 + 4.0, "cut",
                             elastic=True)
    roomy = dataclasses.replace(_memory_problem(9.0), side=(cut,))
    sol = F.solve(roomy, solver=solver)
    assert not F.violations(roomy, sol.assignment)
    brute = F.exhaustive(roomy)
    assert sol.objective == pytest.approx(brute.objective)
    tight = dataclasses.replace(_memory_problem(6.0), side=(cut,))
    with pytest.raises(F.Infeasible) as info:
        F.solve(tight, solver=solver)
    # the least δ over the rows and the cut: no plan is below 9 on the rows; the plan of
    # least δ meets the cut within that δ
    exc = info.value
    assert exc.extra == pytest.approx(3.0) and exc.assignment is not None
    a = exc.assignment
    lhs = sum(x for n, c, x in cut.terms if a[n] == c)
    assert lhs - cut.rhs <= 3.0 + 1e-6
    only = F.Problem(roomy.nodes, roomy.edges, side=(dataclasses.replace(cut, rhs=-1.0),))
    with pytest.raises(F.Infeasible) as alone:  # elastic rows alone: the plan of least δ
        F.solve(only, solver=solver)
    assert alone.value.assignment is not None and alone.value.min_capacity is None
    with pytest.raises(F.InvalidProblem, match="elastic"):
        F.LinearConstraint((("a", 0, 1.0),), ">=", 1.0, "bad", elastic=True)


def test_infeasible_without_memory_reason():
    p = F.Problem(
        [F.Node("a", (0.0, 1.0)), F.Node("b", (0.0, 1.0))],
        side=(F.LinearConstraint((("a", 0, 1.0), ("a", 1, 1.0)), "==", 2.0, "impossible"),),
    )
    with pytest.raises(F.Infeasible) as info:
        F.solve(p)
    assert info.value.min_capacity is None
    tied = F.Problem([F.Node("a", (0.0, 1.0)), F.Node("b", (0.0, 1.0))], tie=(("a", "b"),), fixed={"a": 0, "b": 1})
    with pytest.raises(F.Infeasible):
        F.solve(tied)


def _big_random(seed: int, n: int = 120, k: int = 8, mem: bool = False) -> F.Problem:
    rng = random.Random(seed)
    names = [f"v{i:03d}" for i in range(n)]
    nodes = [
        F.Node(v, tuple(rng.random() for _ in range(k)), ((tuple(rng.random() for _ in range(k)),) if mem else None))
        for v in names
    ]
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), min(j, 3)):  # three parents: many cycles
            edges.append(F.Edge(names[i], names[j], tuple(tuple(rng.random() for _ in range(k)) for _ in range(k))))
    return F.Problem(nodes, edges, capacities=(0.3 * n,) if mem else None)


@pytest.mark.parametrize("mem", [False, True])
def test_time_limit_never_claims_a_wrong_optimum(mem):
    p = _big_random(1, mem=mem)
    try:
        s = F.solve(p, time_limit_s=0.05)
    except F.SolveFailed as exc:
        assert "no feasible assignment" in str(exc)
        return
    assert s.status in ("optimal", "time_limit")
    assert s.bound <= s.objective + 1e-9
    # the gap is the bound's relative distance below the objective (costs are positive)
    assert s.objective > 0
    assert s.gap == pytest.approx(max(0.0, s.objective - s.bound) / s.objective, abs=1e-12)
    assert not F.violations(p, s.assignment)
    assert s.objective == pytest.approx(F.objective(p, s.assignment))
    if s.status == "optimal":
        assert s.gap <= 1e-9


def test_time_limit_gap_is_real():
    p = _big_random(2, n=30, k=4)
    quick = F.solve(p, time_limit_s=0.05)
    full = F.solve(p, time_limit_s=60)
    assert quick.bound <= full.objective + 1e-9  # a valid lower bound
    assert full.objective <= quick.objective + 1e-9
    # the reported gap covers how far the quick plan really is from the optimum
    assert quick.gap >= (quick.objective - full.objective) / quick.objective - 1e-9
    if quick.status == "optimal":
        assert quick.objective == pytest.approx(full.objective)
    else:
        assert quick.status == "time_limit"


def test_deterministic_under_reordering():
    p = _big_random(3, n=16, k=4)
    a = F.solve(p)
    b = F.solve(p)
    rng = random.Random(0)
    nodes, edges = list(p.nodes), list(p.edges)
    rng.shuffle(nodes)
    rng.shuffle(edges)
    c = F.solve(F.Problem(tuple(nodes), tuple(edges)))
    assert a.assignment == b.assignment == c.assignment
    assert list(a.assignment) == sorted(a.assignment)


def test_cbc_selectable_and_agrees():
    p = _big_random(4, n=12, k=3)
    h, c = F.solve(p, solver="highs"), F.solve(p, solver="cbc")
    assert c.solver == "cbc" and h.solver == "highs"
    assert c.objective == pytest.approx(h.objective, rel=1e-9)
    with pytest.raises(F.InvalidProblem):
        F.solve(p, solver="gurobi")


def test_warm_start_and_fixed():
    p = _big_random(5, n=14, k=4)
    best = F.solve(p)
    warm = F.solve(F.Problem(p.nodes, p.edges, warm_start=best.assignment))
    assert warm.objective == pytest.approx(best.objective)
    fixed = F.solve(F.Problem(p.nodes, p.edges, fixed={"v000": 3}))
    assert fixed.assignment["v000"] == 3 and fixed.objective >= best.objective - 1e-12


def test_ties_share_one_choice_and_repeated_layers_are_fast():
    # 40 identical layers of a 50-op chain, tied across layers, 20x20 matrices over 20 layouts
    rng = random.Random(7)
    k, ops, layers = 20, 50, 40
    unary = [tuple(rng.random() for _ in range(k)) for _ in range(ops)]
    mats = [tuple(tuple(rng.random() for _ in range(k)) for _ in range(k)) for _ in range(ops)]
    name = lambda l, o: f"l{l:02d}.op{o:02d}"  # noqa: E731
    nodes = [F.Node(name(l, o), unary[o]) for l in range(layers) for o in range(ops)]
    edges = [F.Edge(name(l, o - 1), name(l, o), mats[o]) for l in range(layers) for o in range(1, ops)]
    edges += [F.Edge(name(l - 1, ops - 1), name(l, 0), mats[0]) for l in range(1, layers)]
    tie = tuple(tuple(name(l, o) for l in range(layers)) for o in range(ops))
    s = F.solve(F.Problem(nodes, edges, tie=tie))
    assert s.status == "optimal" and s.wall_s < 20
    for o in range(ops):
        assert len({s.assignment[name(l, o)] for l in range(layers)}) == 1


def test_projection_equals_expanded_matrix():
    p = F.Problem(
        [F.Node("a", (0.0, 0.5, 1.0, 0.2)), F.Node("b", (0.3, 0.0, 0.1))],
        [F.Edge("a", "b", ((0.0, 2.0), (2.0, 0.0)), src_proj=(0, 1, 0, 1), dst_proj=(1, 0, 0))],
    )
    full = ((2.0, 0.0, 0.0), (0.0, 2.0, 2.0), (2.0, 0.0, 0.0), (0.0, 2.0, 2.0))
    q = F.Problem(p.nodes, [F.Edge("a", "b", full)])
    assert F.solve(p).objective == pytest.approx(F.solve(q).objective) == pytest.approx(F.exhaustive(q).objective)


def test_invalid_problems_are_rejected():
    with pytest.raises(F.InvalidProblem):
        F.Problem([F.Node("a", (0.0, 1.0)), F.Node("b", (0.0,))], [F.Edge("a", "b", ((0.0, 1.0),))])
    with pytest.raises(F.InvalidProblem):
        F.Problem([F.Node("a", (0.0, 1.0))], fixed={"a": 2})
    with pytest.raises(F.InvalidProblem):
        F.Problem([F.Node("a", (0.0, 1.0)), F.Node("a", (1.0,))])
    assert issubclass(F.Infeasible, F.FormulationError) and issubclass(F.SolveFailed, F.FormulationError)


def _plans(problem: F.Problem):
    """Every feasible assignment and its objective (brute force)."""
    import itertools
    names = [n.name for n in problem.nodes]
    for combo in itertools.product(*(range(n.n_options) for n in problem.nodes)):
        a = dict(zip(names, combo))
        if not F.violations(problem, a):
            yield a, F.objective(problem, a)


def _cell(problem: F.Problem, j: int, a) -> tuple[int, int]:
    e = problem.edges[j]
    r, s = a[e.src], a[e.dst]
    return (r if e.src_proj is None else e.src_proj[r], s if e.dst_proj is None else e.dst_proj[s])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(problems(parts=True), st.floats(0.0, 1.0))
def test_lp_relaxation_bounds_every_plan_using_a_cell(problem, frac):
    # L is at most the optimum; a cell's bound is at most every plan using it (among the plans
    # no worse than `upper`, for which the LP was built)
    _assert_lp_bounds_hold(problem, frac)


def _assert_lp_bounds_hold(problem: F.Problem, frac: float) -> None:
    plans = list(_plans(problem))
    if not plans:
        return
    best = min(o for _, o in plans)
    # the LP bounds the plans no worse than `upper`
    upper = best + frac * (max(o for _, o in plans) - best)
    res = Relaxation(problem, upper).solve()
    assert res.value <= best + TOL * max(1.0, abs(best))
    for j in range(len(problem.edges)):
        bounds = res.bounds(j)
        for a, obj in plans:
            if obj <= upper:
                r, s = _cell(problem, j, a)
                assert bounds[r, s] <= obj + TOL * max(1.0, abs(obj)), (j, r, s, a)
    for n in problem.nodes:
        bounds = res.option_bounds(n.name)
        for a, obj in plans:
            if obj <= upper:
                assert bounds[a[n.name]] <= obj + TOL * max(1.0, abs(obj)), (n.name, a)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(st.integers(2, 4), st.integers(2, 4), st.integers(2, 3), st.randoms(use_true_random=False),
       st.floats(0.0, 1.0))
def test_lp_bounds_count_parallel_edges_once(ka, kb, n_edges, rng, frac):
    # edges between the same two nodes add their least reduced costs once each, on one side
    cost = lambda r, c: tuple(tuple(float(rng.randint(0, 20)) for _ in range(c))  # noqa: E731
                              for _ in range(r))
    nodes = [F.Node("a", cost(1, ka)[0]), F.Node("b", cost(1, kb)[0]), F.Node("c", (0.0, 1.0))]
    edges = [F.Edge("a", "b", cost(ka, kb)) for _ in range(n_edges)]
    edges += [F.Edge("b", "c", cost(kb, 2)), F.Edge("c", "a", cost(2, ka))]
    _assert_lp_bounds_hold(F.Problem(nodes, edges), frac)


def _raised(problem: F.Problem, rng) -> F.Problem:
    """The problem with some edge costs and parts raised (as pricing raises estimates)."""
    def raised(m):
        return tuple(tuple(v * rng.choice([1.0, 1.0, 2.5]) for v in row) for row in m)
    return dataclasses.replace(problem, edges=tuple(
        F.Edge(e.src, e.dst, raised(e.cost), e.src_proj, e.dst_proj,
               None if e.parts is None else tuple(raised(p) for p in e.parts))
        for e in problem.edges))


def _set_every_cell(relax: Relaxation, problem: F.Problem) -> None:
    for j, e in enumerate(problem.edges):
        if relax.ycols[j] is None:
            continue
        for r, row in enumerate(e.cost):
            for s, c in enumerate(row):
                relax.set_cell(j, r, s, c, None if e.parts is None
                               else tuple(p[r][s] for p in e.parts))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(problems(parts=True, extras=False), st.randoms(use_true_random=False))
def test_lp_relaxation_set_cell_matches_a_fresh_build(problem, rng):
    # raising costs (cells priced since) through `set_cell` gives the LP a fresh build gives
    after = _raised(problem, rng)
    plans = list(_plans(after))
    if not plans:
        return
    # z's bound, as in use: a plan's cost (far above 1e9 x the costs, the solver's tolerance
    # on z's reduced cost would show in L)
    upper = 2 * max(abs(o) for _, o in plans)
    relax = Relaxation(problem, upper)
    relax.solve()
    _set_every_cell(relax, after)
    want = Relaxation(after, upper).solve().value
    got = relax.solve().value
    # to the LP solver's tolerances (1e-7 on the scaled costs): a re-solve from the last
    # basis may stop at another point within them
    assert abs(got - want) <= 1e-6 * relax.scale, (got, want)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(problems(parts=True), st.floats(0.0, 1.0))
def test_lp_column_generation_ends_at_the_lp_over_every_column(problem, frac):
    # HiGHS starting from a few columns per row (column generation) ends at the value it has
    # with every column held, and the bounds it gives on the way hold
    plans = list(_plans(problem))
    if not plans:
        return
    upper = 2 * max(abs(o) for _, o in plans)
    with mock.patch.object(relax_module, "FIRST_CHEAPEST", 1):
        few = Relaxation(problem, upper)
        got = few.solve().value
        _assert_lp_bounds_hold(problem, frac)
    with mock.patch.object(relax_module, "FIRST_CHEAPEST", 10 ** 6):
        every = Relaxation(problem, upper)
        assert every.active.all()
        want = every.solve().value
    assert abs(got - want) <= 1e-6 * every.scale, (got, want)


def test_lp_column_generation_adds_the_columns_it_needs():
    problem = _big_random(3, n=40, k=8, mem=True)
    with mock.patch.object(relax_module, "FIRST_CHEAPEST", 1):
        few = Relaxation(problem, 1e9)
        held = int(few.active.sum())
        got = few.solve().value
    assert held < len(few.active) // 3  # it started with few columns
    assert few.active.sum() > held  # and the duals called more in
    with mock.patch.object(relax_module, "FIRST_CHEAPEST", 10 ** 6):
        want = Relaxation(problem, 1e9).solve().value
    assert abs(got - want) <= 1e-6 * few.scale, (got, want)


def test_lp_column_generation_recovers_from_an_infeasible_start():
    # the cheapest cell of each row and column leaves out (0, 1), the only cell the fixed
    # options allow: the LP over the columns held is infeasible, and every column joins
    nodes = [F.Node("a", (0.0, 0.0)), F.Node("b", (0.0, 0.0))]
    problem = F.Problem(nodes, [F.Edge("a", "b", ((0.0, 5.0), (1.0, 2.0)))],
                        fixed={"a": 0, "b": 1})
    with mock.patch.object(relax_module, "FIRST_CHEAPEST", 1):
        relax = Relaxation(problem, 1e9)
        assert not relax.active[relax.ycols[0][0, 1]]
        res = relax.solve()
    assert relax.active.all()
    assert abs(res.value - 5.0) <= 1e-6 * relax.scale
    assert res.support(0).tolist() == [[0, 1]]


def test_parts_must_agree_in_number():
    a = F.Node("a", (1.0, 2.0), parts=((1.0, 0.0), (0.0, 1.0)))
    b = F.Node("b", (1.0,), parts=((1.0,), (0.0,), (2.0,)))
    with pytest.raises(F.InvalidProblem, match="different numbers of parts"):
        F.Problem((a, b))
    three = F.Problem((F.Node("a", (0.0, 0.0), parts=((3.0, 1.0), (0.0, 2.0), (1.0, 2.5))),))
    assert three.n_parts == 3
    assert F.objective(three, {"a": 1}) == 2.5 and F.solve(three).objective == 2.5
