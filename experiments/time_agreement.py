"""The objective against the simulated time: one truth for time, checked.

    python -m experiments.time_agreement [--topologies a100x8 ...] [--models llama-7b ...]
        [--random 50] [--seed 0]

Per topology and LLaMA preset (batch 4, seq 2048, fp16, weights sharded, steady state): the
plans the selection stage considers (the MIP's optimum, the named strategies, one device;
`selection.choose_plan`), and data parallel beside them, each with its objective (the MIP's
prediction of one block's time) beside the simulator's time of one block in a stack (`simulator.block_time`: T(2 blocks) -
T(1), so that neither includes the first block's cold start), and their ratio. With
`--random N`, N uniformly random plans per topology (a random candidate per node, from the
optimizer's own candidate lists) are priced both ways, and the Spearman rank correlation of
objective and simulated time is printed. Each row then says which plan was chosen, and the chosen plan's and the MIP optimum's simulated
time over the best named plan's. Every figure is simulated; none is measured.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys

from einsummable.backend.runtime.simulator import block_time
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.optimizer.api import named_plan
from einsummable.optimizer.model import build_model
from einsummable.optimizer.named import NAMED
from einsummable.optimizer.objective import objective_s
from einsummable.planning.plan import Considered, Options, Plan, Solved
from einsummable.selection.choose import OPTIMIZED, choose_plan
from einsummable.topology import load_topology

PRESETS = ("llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama3-8b")
TOPOLOGIES = ("a100x8", "dgx1-v100", "h100x8x2")
# The bar: the objective within this of the simulated time, for every plan.
AGREEMENT = 0.10
BASELINES = NAMED  # the named plans the chosen one is held against (one device included)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def random_plans(graph, topology, count: int, seed: int) -> list[Plan]:
    """`count` random plans: a uniformly random candidate per node, priced as the MIP prices."""
    options = Options("sharded", True)
    model = build_model(graph, topology, options)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        choice = {k: rng.randrange(len(oc.cands)) for k, oc in model.nodes.items()}
        for group in model.ties:  # tied nodes choose alike, as every plan the MIP makes
            for k in group[1:]:
                choice[k] = choice[group[0]]
        chosen = tuple((k, model.nodes[k].cands[c]) for k, c in choice.items())
        out.append(Plan(graph, topology, chosen, objective_s(model, choice), None, None, 0.0,
                        options, Solved("random", "random")))
    return out


def _mip(plan: Plan) -> Considered:
    return next(c for c in plan.judged.considered if c.label == OPTIMIZED)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES))
    ap.add_argument("--models", nargs="+", default=list(PRESETS))
    ap.add_argument("--random", type=int, default=0, help="random plans per topology")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ratios: list[float] = []
    headline: list[float] = []
    print(f"{'topology':<10} {'model':<10} {'plan':<15} {'objective ms':>12} "
          f"{'simulated ms':>12} {'sim/obj':>8}")
    for tn in args.topologies:
        topo = load_topology(tn)
        for name in args.models:
            g = llama_block_graph(preset_config(name), 4, 2048, "float16", 1)
            chosen = choose_plan(g, topo, steady_state=True)
            rows = [(c.label, c.objective_s, c.simulated_s) for c in chosen.judged.considered]
            # data parallel stores a replica of every weight: another option, shown beside
            dp = named_plan(g, topo, "data-parallel", steady_state=True)
            rows.append(("data-parallel", dp.objective_s, block_time(dp)))
            for label, obj, sim in rows:
                ratios.append(sim / obj)
                flag = "" if abs(sim / obj - 1) <= AGREEMENT else "  *"
                print(f"{tn:<10} {name:<10} {label:<15} {obj * 1e3:>12.3f} "
                      f"{sim * 1e3:>12.3f} {sim / obj:>8.3f}{flag}", flush=True)
            best = chosen.judged.considered[0]
            named = [c for c in chosen.judged.considered if c.label in BASELINES]
            top = min(named, key=lambda c: c.simulated_s)
            headline.append(best.simulated_s / top.simulated_s)
            print(f"{tn:<10} {name:<10} chosen: {best.label}, simulated {best.simulated_s * 1e3:.3f}"
                  f" ms = {headline[-1]:.3f}x the best named plan ({top.label}); the MIP's "
                  f"optimum alone {_mip(chosen).simulated_s / top.simulated_s:.3f}x", flush=True)
        if args.random:
            g = llama_block_graph(preset_config(args.models[0]), 4, 2048, "float16", 1)
            plans = random_plans(g, topo, args.random, args.seed)
            obj = [p.objective_s for p in plans]
            sim = [block_time(p) for p in plans]
            print(f"{tn:<10} {args.models[0]:<10} {args.random} random plans: Spearman "
                  f"{spearman(obj, sim):.3f}, sim/obj median "
                  f"{statistics.median(s / o for s, o in zip(sim, obj)):.3f}", flush=True)
    if headline:
        print(f"chosen / best named plan, simulated: geomean {statistics.geometric_mean(headline):.3f}"
              f", worst {max(headline):.3f} over {len(headline)} rows")
    within = sum(abs(r - 1) <= AGREEMENT for r in ratios)
    print(f"plans whose objective is within {AGREEMENT:.0%} of the simulated time: "
          f"{within} of {len(ratios)} (marked * otherwise); sim/obj from {min(ratios):.3f} "
          f"to {max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
