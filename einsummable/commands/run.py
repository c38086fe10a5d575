"""`einsummable run plan.json`: run a Plan on seeded random inputs, optionally check it.

Time is the median of `--repeats` runs after one warm-up. On gloo it is the programs alone
(every rank starts after a p2p barrier; the run ends with the slowest rank), on local the wall
time of the in-process executor. `--check` compares every output with the reference evaluator
and reports the max relative error (max |out - ref| / max |ref|, per output, the worst).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ..backend.lowering import lower
from ..backend.runtime.chrome import write_trace
from ..backend.runtime.pool import Pools
from ..backend.runtime.local import run_local
from ..errors import PlanError
from ..frontend.reference import TORCH_DTYPES, evaluate
from ..planning.plan import Plan

HELP = "run a plan JSON on random inputs (local or gloo ranks); --check compares to the reference"

# Relative error above which --check fails (fp32 programs re-associate sums; fp16 lose more).
TOLERANCE: dict[str, float] = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def random_inputs(graph, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen).to(TORCH_DTYPES[t.dtype])
            for t in graph.inputs}


def max_rel_error(outs, refs) -> float:
    worst = 0.0
    for name, ref in refs.items():
        got, ref = outs[name].double(), ref.double()
        scale = ref.abs().max().item() or 1.0
        worst = max(worst, (got - ref).abs().max().item() / scale)
    return worst


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="Plan JSON (einsummable plan ... --out plan.json)")
    p.add_argument("--backend", choices=("local", "gloo"), default="local")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (default: the plan's topology size; must match it)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
    p.add_argument("--mode", choices=("optimized", "naive", "naive-routed"), default="optimized",
                   help="exchange synthesis mode")
    p.add_argument("--check", action="store_true", help="compare with the reference evaluator")
    p.add_argument("--trace", default=None, metavar="OUT.json",
                   help="write one measured run's timeline as Chrome trace JSON (gloo ranks)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def main(args: argparse.Namespace) -> int:
    try:
        text = Path(args.plan).read_text()
    except OSError as e:
        raise PlanError(f"cannot read plan {args.plan!r}: {e.strerror}",
                        fix="pass the path of a plan JSON") from None
    plan = Plan.from_json(text)
    low = lower(plan, mode=args.mode)
    n = low.world_size if args.world_size is None else args.world_size
    if n != low.world_size:
        raise PlanError(f"the plan is for {low.world_size} ranks but --world-size is {n}",
                        fix=f"pass --world-size {low.world_size} or plan for {n} devices")
    if args.trace and args.backend != "gloo":
        raise PlanError("--trace records the ranks' timelines, which run as processes with "
                        "--backend gloo", fix="pass --backend gloo, or see the simulated "
                        "schedule with: einsummable show plan.json --trace out.json")
    inputs = random_inputs(plan.graph, args.seed)
    times: list[float] = []
    if args.backend == "local":
        outs = run_local(low, inputs)
        for _ in range(max(1, args.repeats)):
            t0 = time.perf_counter()
            run_local(low, inputs)
            times.append(time.perf_counter() - t0)
    else:
        pools = Pools()
        try:
            pool = pools.get("gloo", n, no_collectives=True)
            outs = pool.run(low, inputs)
            times = [pool.time(low, inputs) for _ in range(max(1, args.repeats))]
            if args.trace:
                write_trace(args.trace, low, pool.trace(low, inputs),
                            f"measured, {n} gloo ranks")
        finally:
            pools.close()
    result = {"plan": args.plan, "backend": args.backend, "world_size": n, "mode": args.mode,
              "seed": args.seed, "repeats": len(times), "time_s": statistics.median(times),
              "trace": args.trace,
              "outputs": {k: list(v.shape) for k, v in outs.items()}}
    ok = True
    if args.check:
        err = max_rel_error(outs, evaluate(plan.graph, inputs))
        dtypes = {plan.graph.tensor(k).dtype for k in outs}
        tol = max(TOLERANCE.get(d, 1e-2) for d in dtypes)
        ok = err <= tol
        result.update({"max_rel_error": err, "tolerance": tol, "ok": ok})
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        line = (f"{args.plan}: {n} rank(s) on {args.backend}, median "
                f"{result['time_s'] * 1e3:.3f} ms over {len(times)} run(s)")
        if args.check:
            line += (f"; max relative error {result['max_rel_error']:.3g} "
                     f"({'ok' if ok else 'FAIL'}, tolerance {result['tolerance']:g})")
        print(line)
    return 0 if ok else 1
