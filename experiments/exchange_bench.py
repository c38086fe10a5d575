"""Optimized vs naive exchange, simulated on dgx1-v100: LLaMA blocks and a bushy matrix chain.

    python -m experiments.exchange_bench [--topology dgx1-v100]

Prints one row per (workload, plan): simulated seconds with naive and optimized exchange and
their ratio, then the geometric mean per workload family. Every number comes from this run.
"""
from __future__ import annotations

import argparse
import math
import random

from einsummable.builder import Builder
from einsummable.compile import greedy_plan
from einsummable.placement import INPUT_PREFIX, input_op, place
from einsummable.runtime.simulate import simulate
from einsummable.spec import decompositions
from einsummable.topology import load_topology


def llama(name: str, batch: int, seq: int):
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, _ = preset(name, batch=batch, seq=seq, device="meta")
    return llama_block_graph(module.config, batch, seq, dtype="float16")


def bushy_chain(n: int = 4096, leaves: int = 8):
    b = Builder("float16")
    xs = [b.weight(f"m{i}", (n, n)) for i in range(leaves)]
    while len(xs) > 1:
        xs = [b.einsum("ij,jk->ik", xs[i], xs[i + 1]) for i in range(0, len(xs), 2)]
    return b.build(xs)


def split_plan(g, topo, prefer, inputs_on=None):
    n = topo.world_size
    def cand(op):
        for m in prefer:
            if m in op.modes and op.can_split(m) and op.size[m] % n == 0:
                return place(op, {m: n}, list(range(n)))
        return place(op, {}, list(range(n)))
    ch = {op.name: cand(op) for op in g.ops}
    for info in g.inputs:
        iop = input_op(info)
        ch[INPUT_PREFIX + info.name] = cand(iop) if inputs_on is None else place(iop, {}, [inputs_on])
    return ch


def random_plan(g, topo, seed):
    rng = random.Random(seed)
    n = topo.world_size
    def cand(op):
        decs = [d for d in decompositions(op, n) if d.n_tuples == n] or list(decompositions(op, n))
        dec = rng.choice(decs)
        devs = list(range(n))
        rng.shuffle(devs)
        return place(op, dec.part, devs)
    ch = {op.name: cand(op) for op in g.ops}
    for info in g.inputs:
        ch[INPUT_PREFIX + info.name] = cand(input_op(info))
    return ch


def plans_for(g, topo, family):
    out = {"greedy": greedy_plan(g, topo).choice}
    if family == "llama":
        out["tensor-parallel(h,f)"] = split_plan(g, topo, ("h", "f", "d"))
        out["sequence-parallel(s)"] = split_plan(g, topo, ("s",))
    else:
        out["row-split(i)"] = split_plan(g, topo, ("i",))
        out["contract-split(j)"] = split_plan(g, topo, ("j",))
    for seed in range(3):
        out[f"random{seed}"] = random_plan(g, topo, seed)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="dgx1-v100")
    args = ap.parse_args(argv)
    topo = load_topology(args.topology)
    workloads = [("llama", "llama-7b b1 s2048", llama("llama-7b", 1, 2048)),
                 ("llama", "llama-13b b1 s2048", llama("llama-13b", 1, 2048)),
                 ("llama", "llama3-8b b1 s2048", llama("llama3-8b", 1, 2048)),
                 ("chain", "bushy chain 8 x 4096^2", bushy_chain(4096)),
                 ("chain", "bushy chain 8 x 8192^2", bushy_chain(8192))]
    ratios: dict[str, list[float]] = {}
    print(f"topology {topo.name}; simulated seconds")
    print(f"{'workload':26} {'plan':24} {'naive_ms':>10} {'optimized_ms':>13} {'speedup':>8}")
    for family, label, g in workloads:
        for pname, choice in plans_for(g, topo, family).items():
            naive = simulate(g, choice, topo, mode="naive").time_s
            opt = simulate(g, choice, topo, mode="optimized").time_s
            ratios.setdefault(family, []).append(naive / opt)
            print(f"{label:26} {pname:24} {naive * 1e3:10.3f} {opt * 1e3:13.3f} {naive / opt:8.3f}")
    for family, rs in ratios.items():
        geo = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{family}: geomean speedup {geo:.3f}x, max {max(rs):.3f}x over {len(rs)} plans")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
