"""Solve time and predicted time of optimized plans against named strategies.

    python experiments/optimizer_bench.py [--topologies a100x8 ...] [--models llama-7b ...]
        [--batch 4 --seq 2048] [--stack 32] [--phases] [--time-limit S]
        [--digests | --check-digests experiments/plan_digests.json]

Prints, per workload: optimize wall seconds (model build + MIP), gap, the objective, each named
strategy's objective on the same cost model, and the compute floor FLOPs / (devices x peak x
efficiency). Every number comes from this run.

`--digests` adds a column with a digest of the row's plan JSON and of its named plans' JSON
(source paths made relative to the checkout, so any clone gives the same bytes);
`--check-digests FILE` compares them with the ones FILE holds (written by `--save-digests`)
and exits 1 on any difference: the check that a change left every plan byte-identical.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.optimizer.api import named_plan, optimize
from einsummable.optimizer.model import build_model
from einsummable.optimizer.named import STRATEGIES
from einsummable.optimizer.pricing import EdgePricer
from einsummable.planning.cost import compute_floor
from einsummable.planning.plan import Options
from einsummable.topology import load_topology

PRESETS = ("llama-7b", "llama-13b", "llama-30b", "llama-65b", "llama3-8b")
CHECKOUT = str(Path(__file__).resolve().parent.parent) + "/"


def digest(*plans) -> str:
    """sha256 of the plans' JSON, with the checkout's path cut out of every op's source."""
    h = hashlib.sha256()
    for plan in plans:
        h.update(plan.to_json().replace(CHECKOUT, "").encode())
    return h.hexdigest()[:16]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--topologies", nargs="+", default=["a100x8", "dgx1-v100", "h100x8x2"])
    p.add_argument("--models", nargs="+", default=list(PRESETS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--stack", type=int, default=1, help="blocks per graph (tied)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="wall seconds per optimize call (the best plan found and its gap)")
    p.add_argument("--phases", action="store_true",
                   help="print where each solve spends its time (build, solves, pricing)")
    p.add_argument("--digests", action="store_true", help="print each row's plan digest")
    p.add_argument("--save-digests", type=Path, help="write the digests to this JSON file")
    p.add_argument("--check-digests", type=Path,
                   help="compare the digests with this file's; exit 1 on a difference")
    a = p.parse_args()
    want = json.loads(a.check_digests.read_text()) if a.check_digests else None
    got: dict[str, str] = {}
    if a.phases:
        import logging
        logging.basicConfig(format="  %(message)s")
        logging.getLogger("einsummable.optimizer").setLevel(logging.INFO)
    rows = []
    print(f"{'topology':<10} {'model':<10} {'solve s':>8} {'gap':>8} {'opt ms':>8} "
          + " ".join(f"{s[:12]:>12}" for s in STRATEGIES) + f" {'floor ms':>9} {'opt/tp':>7}")
    for tn in a.topologies:
        topo = load_topology(tn)
        for name in a.models:
            g = llama_block_graph(preset_config(name), a.batch, a.seq, "float16", a.stack)
            pricer = EdgePricer(topo)  # one memo: the named plans reuse the optimizer's prices
            t0 = time.perf_counter()
            plan = optimize(g, topo, weights="sharded", steady_state=True, cache=False,
                            pricer=pricer, time_limit_s=a.time_limit)
            wall = time.perf_counter() - t0
            sharded = build_model(g, topo, Options("sharded", True), pricer=pricer)
            free = build_model(g, topo, Options("free", True), pricer=pricer)
            named = {s: named_plan(g, topo, s, steady_state=True,
                                   model=free if s == "data-parallel" else sharded)
                     for s in STRATEGIES}
            floor = compute_floor(g, topo)
            ratio = plan.objective_s / named["megatron-tp"].objective_s
            rows.append(ratio)
            key = f"{tn}/{name}/b{a.batch}/s{a.seq}/x{a.stack}"
            got[key] = digest(plan, *named.values())
            mark = ""
            if a.digests or want is not None:
                mark = f" {got[key]}"
                if want is not None:
                    mark += " same" if want.get(key) == got[key] else " DIFFERENT"
            print(f"{tn:<10} {name:<10} {wall:>8.2f} {plan.gap:>8.1e} {plan.objective_s * 1e3:>8.3f} "
                  + " ".join(f"{named[s].objective_s * 1e3:>12.3f}" for s in STRATEGIES)
                  + f" {floor * 1e3:>9.3f} {ratio:>7.3f}{mark}", flush=True)
    geo = math.exp(sum(math.log(r) for r in rows) / len(rows))
    print(f"geometric mean optimized / megatron-tp: {geo:.3f}")
    if a.save_digests:
        a.save_digests.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if want is not None:
        differ = sorted(k for k in got if want.get(k) != got[k])
        print(f"plans differing from {a.check_digests}: {len(differ)} of {len(got)}"
              + (f" ({', '.join(differ)})" if differ else ""))
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
