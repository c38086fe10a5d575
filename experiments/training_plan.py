"""Plan one training step of a preset block (forward, backward, optimizer update) on a
topology, simulated: the graph's size, the solve's time and gap, the objective and the
simulated time of the MIP's optimum. The module is built on the meta device (no weights).

    python -m experiments.training_plan --model llama-7b --topology a100x8 \
        --batch 4 --seq 2048 --dtype bfloat16 --optimizer adamw
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import einsummable as es
from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.optim import OPTIMIZERS, Hyper, TrainGraph, with_update
from einsummable.models import preset

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The learning rate of the planned step: a hyperparameter folded into the update's joins,
# so it changes no op's cost.
PLAN_LR = 1e-4


def training_graph(model: str, batch: int, seq: int, dtype: str, optimizer: str) -> TrainGraph:
    """The preset block's training step (mse_loss against a target shaped as its output)."""
    module, (x,) = preset(model, batch=batch, seq=seq, device="meta", dtype=DTYPES[dtype])
    step = es.trace_step(module, (x,), torch.nn.functional.mse_loss, (torch.empty_like(x),))
    return with_update(step, Hyper(optimizer, PLAN_LR))


def plan_training(model: str, topology: str, batch: int = 4, seq: int = 2048,
                  dtype: str = "bfloat16", optimizer: str = "adamw",
                  time_limit_s: float | None = None) -> dict:
    """Capture, solve and simulate (module docstring); the figures as a dict."""
    t0 = time.perf_counter()
    train = training_graph(model, batch, seq, dtype, optimizer)
    capture_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = es.optimize(train.graph, topology, time_limit_s=time_limit_s, cache=False)
    solve_s = time.perf_counter() - t0
    sim = simulate(plan)
    return {"model": model, "topology": topology, "ops": len(train.graph.ops),
            "capture_s": round(capture_s, 2), "solve_s": round(solve_s, 2),
            "status": plan.origin.status, "gap": plan.gap,
            "objective_ms": round(plan.objective_s * 1e3, 4),
            "simulated_ms": round(sim.time_s * 1e3, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.training_plan",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--topology", default="a100x8")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    ap.add_argument("--time-limit", type=float, default=None)
    args = ap.parse_args(argv)
    json.dump(plan_training(args.model, args.topology, args.batch, args.seq, args.dtype,
                            args.optimizer, args.time_limit), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
