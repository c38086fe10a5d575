"""Simulator vs measured time of the llama-tiny block on gloo ranks, over many plans.

    python -m experiments.sim_vs_measured [--topology cpu4] [--plans 20] [--repeats 5]

Each plan (random candidates per op, seeded) is lowered, timed on a gloo pool (median of
`repeats` runs after one warm-up) and simulated on the topology. Prints both per plan and the
Pearson r between them. Also: a 1-rank program vs eager evaluation of the same graph.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from einsummable.lower import lower
from einsummable.placement import INPUT_PREFIX, input_op, place
from einsummable.reference import evaluate
from einsummable.runtime.dist import Pools
from einsummable.runtime.local import run_local
from einsummable.runtime.simulate import simulate
from einsummable.spec import decompositions
from einsummable.topology import load_topology, synthetic


def tiny(batch: int, seq: int):
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, (x,) = preset("llama-tiny", batch=batch, seq=seq)
    g = llama_block_graph(module.config, batch, seq)
    return g, {"x": x, **{k: v.detach() for k, v in module.named_parameters()}}


def random_plan(g, n, seed):
    rng = random.Random(seed)
    def cand(op):
        dec = rng.choice(decompositions(op, n))
        devs = list(range(n))
        rng.shuffle(devs)
        return place(op, dec.part, devs)
    ch = {op.name: cand(op) for op in g.ops}
    for info in g.inputs:
        ch[INPUT_PREFIX + info.name] = cand(input_op(info))
    return ch


def pearson(a, b) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a) ** 0.5
    vb = sum((y - mb) ** 2 for y in b) ** 0.5
    return cov / (va * vb)


def timed(fn, repeats):
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="cpu4")
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args(argv)
    topo = load_topology(args.topology)
    g, ins = tiny(args.batch, args.seq)
    n = topo.world_size
    pools = Pools()
    from einsummable.runtime.dist import run_dist
    sims, meas = [], []
    print(f"llama-tiny b{args.batch} s{args.seq} on {topo.name} ({n} gloo ranks)")
    print(f"{'plan':>6} {'simulated_ms':>13} {'measured_ms':>12}")
    try:
        for seed in range(args.plans):
            low = lower(g, random_plan(g, n, seed), topo)
            sim = simulate(low, topology=topo).time_s
            m = timed(lambda: run_dist(low, ins, backend="gloo", pools=pools), args.repeats)
            sims.append(sim)
            meas.append(m)
            print(f"{seed:6d} {sim * 1e3:13.3f} {m * 1e3:12.3f}")
    finally:
        pools.close()
    print(f"pearson r = {pearson(sims, meas):.3f} over {len(sims)} plans")
    one = synthetic(1)
    ch = {op.name: place(op, {}, [0]) for op in g.ops}
    ch.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in g.inputs})
    low1 = lower(g, ch, one)
    t_prog = timed(lambda: run_local(low1, ins), args.repeats * 4)
    t_eager = timed(lambda: evaluate(g, ins), args.repeats * 4)
    print(f"1-rank program {t_prog * 1e3:.3f} ms vs eager graph {t_eager * 1e3:.3f} ms: "
          f"{t_prog / t_eager:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
