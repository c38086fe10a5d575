"""A high-resolution convolution stack at batch 1: where a spatial split with halo exchange is
the best plan (issue 20).

The workload: `layers` 3x3 convolutions (padding 1) with a ReLU after each, C channels in and
out, on one H x W image. Data parallel is impossible (batch 1). The plans compared, all on the
same cost model and simulated by the same simulator:

- the MIP's optimum (`optimize`, free to split any mode of any op);
- spatial: every op splits the output rows over the devices; a convolution then reads its
  rows plus a halo of (K - 1) d - s + 1 = 2 rows from its neighbours (2 W C elements);
- out-channels: every op splits the channels, so each convolution reads the whole previous
  activation (an all-gather of H W C elements per layer);
- in-channels: each convolution splits its input channels, the following ReLU the channels;
  partial sums of the whole output are reduce-scattered (H W C elements per layer);
- one-device: everything on device 0 (no exchange, 1/N of the machine).

Each forced plan fixes every op's candidate (the one with exactly those parts) and gives every
graph input its cheapest layout given the ops (`named.cheapest_inputs`), then is priced by the
objective (`objective_s`) and simulated (`simulate`, outputs left where they are computed).
"""
from __future__ import annotations

from dataclasses import dataclass

from einsummable.backend.lowering import IN_PLACE
from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.builder import Builder
from einsummable.frontend.ir import Graph
from einsummable.optimizer.api import named_plan, optimize, resolve_options
from einsummable.optimizer.model import Model, build_model
from einsummable.optimizer.named import cheapest_inputs
from einsummable.optimizer.objective import objective_s
from einsummable.planning.placement import Candidate
from einsummable.topology import load_topology

from . import harness
from .harness import Progress, Row

KERNEL = 3
OPTIMUM = harness.OPTIMIZED_SYSTEM  # the MIP's plan, under the name every table knows
REFERENCE = "out-channels"          # the tensor-parallel analogue the table divides by
# The forced plans: per op kind, the mode split over every device ("n" stands for the world).
FORCED = {"spatial": {"conv": "y", "map": "c"},
          "out-channels": {"conv": "o", "map": "b"},
          "in-channels": {"conv": "c", "map": "b"}}


def conv_stack(channels: int, height: int, width: int, layers: int,
               dtype: str = "float32") -> Graph:
    """`layers` x (3x3 convolution with padding 1, then ReLU) on one (channels, H, W) image."""
    b = Builder(dtype)
    x = b.input("x", (1, channels, height, width))
    for i in range(layers):
        w = b.weight(f"w{i}", (channels, channels, KERNEL, KERNEL))
        x = b.conv(x, w, padding=KERNEL // 2).relu()
    return b.build([x])


@dataclass(frozen=True)
class PlanResult:
    name: str
    objective_s: float
    simulated_s: float
    splits: dict[str, str]


def _forced(model: Model, rule: dict[str, str]) -> dict[str, int]:
    """Each op's candidate that splits exactly the rule's mode over every device."""
    n = model.topology.world_size
    choice = {}
    for op in model.graph.ops:
        mode = rule["conv" if op.fused == "conv" else "map"]
        want = tuple((m, n if m == mode else 1) for m in op.modes)
        hits = [i for i, c in enumerate(model.nodes[op.name].cands) if c.parts == want]
        if not hits:
            raise ValueError(f"{op.name}: no candidate splits {mode} {n} ways")
        choice[op.name] = hits[0]
    return cheapest_inputs(model, choice)


def _result(name: str, graph: Graph, topology, choice: dict[str, Candidate], objective: float,
            options) -> PlanResult:
    sim = simulate(graph, choice, topology, cost_model=options.cost, deliver=IN_PLACE)
    splits = {op.name: str(choice[op.name]) for op in graph.ops}
    return PlanResult(name, objective, sim.time_s, splits)


def compare(graph: Graph, topology, time_limit_s: float | None = None) -> list[PlanResult]:
    """The MIP's optimum and the forced plans (module docstring), objective and simulated."""
    options = resolve_options(steady_state=False)
    best = optimize(graph, topology, time_limit_s, options=options, cache=False)
    out = [_result(OPTIMUM, graph, topology, best.chosen, best.objective_s, options)]
    model = build_model(graph, topology, options)
    for name, rule in FORCED.items():
        idx = _forced(model, rule)
        choice = {k: model.nodes[k].cands[i] for k, i in idx.items()}
        out.append(_result(name, graph, topology, choice, objective_s(model, idx), options))
    one = named_plan(graph, topology, "one-device", options=options)
    out.append(_result("one-device", graph, topology, one.chosen, one.objective_s, options))
    return out


def run(cfg: dict, stream=None) -> tuple[list[Row], dict, str]:
    """The bench's rows (kind `conv_spatial`, `runners.conv_spatial`): per workload, every
    plan of `compare` (time: simulated; model: the objective), the plans' splits, the table."""
    topo = load_topology(cfg["topology"])
    progress = Progress(len(cfg["workloads"]), cfg["name"], stream)
    rows: list[Row] = []
    plans: dict = {}
    for w in cfg["workloads"]:
        progress.step(w["name"])
        graph = conv_stack(w["channels"], w["height"], w["width"], w["layers"],
                           cfg.get("dtype", "float32"))
        results = compare(graph, topo, cfg.get("time_limit_s"))
        plans[w["name"]] = {r.name: r.splits for r in results}
        for r in results:
            rows.append(Row(cfg["name"], w["name"], r.name, topo.world_size,
                            time_s=r.simulated_s, model_s=r.objective_s,
                            note=f"conv {r.splits[graph.ops[0].name]}, objective "
                                 f"{r.objective_s * 1e3:.3f} ms"))
    title = f"{cfg['name']}: convolution stacks at batch 1 on {topo.name} (simulated)"
    text = harness.format_table(rows, REFERENCE, title)
    text += "\n\n" + harness.format_summary(harness.summarize(rows, REFERENCE), REFERENCE)
    text += "\n" + harness.format_headline(harness.headline(rows, REFERENCE), REFERENCE)
    return rows, {"plans": plans}, text
