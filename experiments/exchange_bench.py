"""Optimized vs naive exchange, simulated on dgx1-v100: LLaMA blocks and a bushy matrix chain.

    python -m experiments.exchange_bench [--topology dgx1-v100] [--time-limit 60]

Prints one row per (workload, plan): simulated seconds with the two naive baselines and the
optimized exchange, and the ratios, then the geometric means per workload family. LLaMA blocks
(batch 4, seq 2048, fp16, weights sharded) run under the optimizer's plan, the five named
strategies, and the older hand plans; the chain under hand and random plans.

Baselines (see einsummable/exchange.py): `naive` = each owner sends straight to every reader
over the direct link where one exists (on DGX-1 that is the QPI/PCIe fallback for pairs without
NVLink, as point-to-point NCCL does); `naive-routed` = the same sends, each on the topology's
fastest route (NVLink relays). Every number comes from this run.
"""
from __future__ import annotations

import argparse
import math
import random

from einsummable.frontend.builder import Builder
from einsummable.planning.placement import random_choice, split_choice
from einsummable.backend.runtime.simulator import simulate
from einsummable.topology import load_topology

from .greedy import greedy_plan


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
    return split_choice(g, topo.world_size, prefer, inputs_on)


def random_plan(g, topo, seed):
    return random_choice(g, topo.world_size, random.Random(seed), exact=True)


NAMED = ("data-parallel", "fsdp", "megatron-tp", "megatron-tp-sp", "ulysses")


def plans_for(g, topo, family, time_limit_s):
    out = {}
    if family == "llama":
        from einsummable.optimizer.api import named_plan, optimize
        out["optimized-plan"] = optimize(g, topo, time_limit_s=time_limit_s, weights="sharded")
        for name in NAMED:
            out[name] = named_plan(g, topo, name, weights="sharded")
    out["greedy"] = greedy_plan(g, topo).choice
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
    ap.add_argument("--time-limit", type=float, default=60.0, help="MIP seconds per workload")
    args = ap.parse_args(argv)
    from experiments.sim_vs_measured import header
    print(header(argv).replace("experiments.sim_vs_measured", "experiments.exchange_bench"))
    topo = load_topology(args.topology)
    workloads = [("llama", "llama-7b b4 s2048", llama("llama-7b", 4, 2048)),
                 ("llama", "llama-13b b4 s2048", llama("llama-13b", 4, 2048)),
                 ("llama", "llama3-8b b4 s2048", llama("llama3-8b", 4, 2048)),
                 ("chain", "bushy chain 8 x 4096^2", bushy_chain(4096)),
                 ("chain", "bushy chain 8 x 8192^2", bushy_chain(8192))]
    ratios: dict[tuple[str, str], list[float]] = {}
    print(f"topology {topo.name}; simulated seconds")
    print(f"{'workload':22} {'plan':22} {'naive_ms':>10} {'routed_ms':>10} {'optimized_ms':>13}"
          f" {'naive/opt':>10} {'routed/opt':>11}")
    for family, label, g in workloads:
        for pname, p in plans_for(g, topo, family, args.time_limit).items():
            def sim(mode):
                if hasattr(p, "graph"):
                    return simulate(p, mode=mode).time_s
                return simulate(g, p, topo, mode=mode).time_s
            naive, routed, opt = sim("naive"), sim("naive-routed"), sim("optimized")
            sub = "named" if pname in NAMED or pname == "optimized-plan" else "other"
            for key in ((family, "naive"), (family, "routed"), (f"{family}/{sub}", "naive"),
                        (f"{family}/{sub}", "routed")):
                ratios.setdefault(key, []).append((naive if key[1] == "naive" else routed) / opt)
            print(f"{label:22} {pname:22} {naive * 1e3:10.3f} {routed * 1e3:10.3f} "
                  f"{opt * 1e3:13.3f} {naive / opt:10.3f} {routed / opt:11.3f}")
    for (family, base), rs in sorted(ratios.items()):
        geo = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{family:14} {base:>6}/optimized: geomean {geo:.3f}x, max {max(rs):.3f}x "
              f"over {len(rs)} plans")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
