"""`einsummable show plan.json [--png out.png] [--trace out.json]`: explain a plan; optionally draw
it, or write its simulated schedule as Chrome trace JSON (one track per device: kernels,
sends, receives, waits; open it in Perfetto or chrome://tracing).

The figure has one row per op and one column per device; a cell is shaded by the share of the
op's tuples that device computes, and the right margin gives the op's compute and exchange
milliseconds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..backend.lowering import IN_PLACE, STEADY, lower
from ..backend.runtime.chrome import write_trace
from ..backend.runtime.simulator import simulate_programs
from ..errors import PlanError
from ..optimizer.report import explain, plan_costs
from ..planning.plan import Plan

HELP = "explain a plan JSON (text, or a figure with --png)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="Plan JSON")
    p.add_argument("--png", default=None, help="also draw the plan to this PNG file")
    p.add_argument("--trace", default=None, metavar="OUT.json",
                   help="also write the simulated schedule as Chrome trace JSON")
    p.add_argument("--no-strategies", action="store_true",
                   help="skip the comparison with the named strategies")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _figure(plan, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    per = plan_costs(plan)
    n = plan.topology.world_size
    keys = [k for k, _ in plan.choice]
    grid = []
    for k in keys:
        c = plan.chosen[k]
        row = [0.0] * n
        for ds in c.devices:
            for d in ds:
                row[d] += 1.0 / len(c.devices)
        grid.append(row)
    fig, ax = plt.subplots(figsize=(2 + 0.5 * n, 1 + 0.25 * len(keys)))
    ax.imshow(grid, aspect="auto", cmap="Blues", vmin=0, vmax=1)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"{k}  [{plan.chosen[k]}]" for k in keys], fontsize=6)
    ax.set_xticks(range(n))
    ax.set_xlabel("device")
    for i, k in enumerate(keys):
        ax.text(n - 0.4, i, f"{per[k].compute_s * 1e3:.3f} + {per[k].exchange_s * 1e3:.3f} ms",
                fontsize=6, va="center")
    ax.set_title(f"{plan.topology.name}: {plan.objective_s * 1e3:.3f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _trace(plan: Plan, path: str) -> None:
    """The plan's program simulated as its objective speaks of it (outputs handed on in the
    input layout for a steady-state plan, else left where they are), timeline written."""
    deliver = STEADY if plan.options.steady_state else IN_PLACE
    low = lower(plan, deliver=deliver)
    sim = simulate_programs(low, plan.topology, trace=True, cost_model=plan.options.cost)
    write_trace(path, low, sim.trace, f"simulated on {plan.topology.name}: "
                f"{sim.time_s * 1e3:.3f} ms")


def main(args: argparse.Namespace) -> int:
    try:
        text = Path(args.plan).read_text()
    except OSError as e:
        raise PlanError(f"cannot read {args.plan}: {e.strerror}", fix="check the path") from None
    plan = Plan.from_json(text)
    report = explain(plan, strategies=not args.no_strategies)
    if args.png:
        _figure(plan, args.png)
    if args.trace:
        _trace(plan, args.trace)
    if args.json:
        print(json.dumps({"objective_s": plan.objective_s, "report": report, "png": args.png,
                          "trace": args.trace}, sort_keys=True))
    else:
        print(report)
    return 0
