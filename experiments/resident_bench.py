"""`python -m experiments.resident_bench`: the wall time of `step(args, targets)` of
`compile_train` (the caller's whole call: binding, sending the ranks their blocks, the run,
the outputs back, the parameters written into the module) with the AdamW state and the
parameters resident on the ranks, against the step that feeds them every call and gathers
them all back on rank 0 (`resident=False`, the step before issue 23).

Both steps run the same plan on the same gloo pool, on two copies of one module; after warm-up
they alternate call by call (which goes first alternates too), so both see the same machine.
Reported: the median and interquartile range of each, and the bytes the parent sent the ranks
on the last call of each.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import einsummable as es
from einsummable.backend.runtime.pool import POOLS
from einsummable.models import preset

RESULTS = Path(__file__).resolve().parent / "results"
HYPER = dict(optimizer="adamw", lr=1e-3, weight_decay=0.01)
TOPOLOGY, WORLD = "cpu2", 2
TARGET_SEED = 7  # the targets' generator seed (the training bench's inputs use their own)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def bench(model: str, batch: int, seq: int, strategy: str | None, warmup: int,
          repeats: int) -> dict:
    block, (x,) = preset(model, batch=batch, seq=seq)
    gen = torch.Generator().manual_seed(TARGET_SEED)
    y = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    plan = None
    if strategy is not None:
        train = es.compile_train(block, (x,), F.mse_loss, (y,), topology=TOPOLOGY,
                                 backend="gloo", **HYPER).train
        plan = es.named_plan(train.graph, TOPOLOGY, strategy)
    steps = {}
    for name, resident in (("fed", False), ("resident", True)):
        steps[name] = es.compile_train(copy.deepcopy(block), (x,), F.mse_loss, (y,),
                                       topology=TOPOLOGY, backend="gloo", plan=plan,
                                       resident=resident, **HYPER)
        plan = steps[name].plan  # the same plan for both
    label = (strategy or (plan.judged.considered[0].label if plan.judged else "optimized"))
    times: dict[str, list[float]] = {name: [] for name in steps}
    sent: dict[str, int] = {}
    order = list(steps)
    for i in range(warmup + repeats):
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            steps[name]((x,), (y,))
            dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt)
            sent[name] = sum(POOLS.get("gloo", WORLD).last_sent.values())
    losses = {name: s((x,), (y,)) for name, s in steps.items()}  # the same training
    row = {"model": model, "batch": batch, "seq": seq, "plan": label, "repeats": repeats}
    for name in steps:
        q1, med, q3 = _quartiles(times[name])
        row[name] = {"median_ms": med * 1e3, "iqr_ms": (q3 - q1) * 1e3,
                     "sent_bytes": sent[name], "loss": losses[name]}
    row["resident_over_fed"] = row["resident"]["median_ms"] / row["fed"]["median_ms"]
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--plans", nargs="+", default=["optimized", "fsdp"],
                    help="'optimized' (compile_train's choice) or named strategies")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(RESULTS / "resident_bench.json"))
    args = ap.parse_args(argv)
    rows = []
    for seq in args.seq:
        for p in args.plans:
            row = bench(args.model, args.batch, seq, None if p == "optimized" else p,
                        args.warmup, args.repeats)
            rows.append(row)
            print(f"{row['model']} {row['batch']}x{row['seq']} {row['plan']:>12}: "
                  f"fed {row['fed']['median_ms']:.2f} ms (IQR {row['fed']['iqr_ms']:.2f}, "
                  f"{row['fed']['sent_bytes']} B sent), resident "
                  f"{row['resident']['median_ms']:.2f} ms (IQR {row['resident']['iqr_ms']:.2f},"
                  f" {row['resident']['sent_bytes']} B sent), ratio "
                  f"{row['resident_over_fed']:.3f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"protocol": __doc__, "rows": rows}, indent=1))
    POOLS.close()


if __name__ == "__main__":
    main()
