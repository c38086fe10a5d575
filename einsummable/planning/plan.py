"""Plan: one candidate per node (graph inputs' layouts and ops), the options it was solved
under, how it was found, and the solver's figures.

Every consumer of a plan (the report, `einsummable show`, the harness, lowering) rebuilds the
model from `Plan.options`, so a plan is always priced on the model it was solved on.

The JSON form is self-contained (graph and topology included), so a worker can run a plan from
the file alone. It is canonical: sorted keys, no whitespace, and no wall-clock figure unless
asked for (`to_json(timing=True)`), so the same graph, topology and options give the same bytes.
Its "options" object holds the options' fields and the origin's side by side; "judged", where
present, what the simulator said of the plan and of the plans it was chosen from
(`selection/`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import PlanError
from ..frontend.ir import Graph
from ..topology import Topology, read_topology
from .cost import CostModel
from .placement import INPUT_PREFIX, Candidate

FORMAT = "einsummable.plan/1"
WEIGHT_MODES = ("sharded", "free")
# "free": every level searched; "parallel": the slowest level fixed, each node running its
# share of the batch (`planning/node_parallel.py`).
NODE_MODES = ("free", "parallel")


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _flag(d: Mapping[str, Any], key: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise PlanError(f"plan option {key!r} must be true or false, got {v!r}",
                        fix="regenerate the plan")
    return v


@dataclass(frozen=True)
class Options:
    """What defines the model a plan is solved on.

    weights: "free" (the default: any layout at no cost, weights placed ahead of time, so
    memory decides: they replicate where every device's memory holds them and shard where it
    must) or "sharded" (every weight byte stored once; consumers gather it and pay for that
    exchange, as FSDP does).
    steady_state: the block hands its output on in the layout its input came in (stacked
    blocks), or pays the exchange that restores it.
    cost: the cost model's knobs (`cost.CostModel`).
    overlap: weight exchanges stream behind compute (objective A + max(C, W), see
    `optimizer/objective.py`); False prices every exchange on the critical path.
    nodes: "free" (every level of the machine searched) or "parallel" (on a machine of
    several nodes, each node runs its share of the batch and the search covers the levels
    inside a node; where the batch does not divide over the nodes, groups of consecutive
    nodes do, the plan's topology naming the groups as its slowest level:
    `planning/node_parallel.py`).
    layers: how many copies of this graph run one after another with their own weights (the
    graph is one block of a model of that many identical layers, each planned alike): the
    memory rows hold every layer's weights in the plan's layout, while activations and
    gathered weights are one layer's at a time. Time is one block's.
    """
    weights: str = "free"
    steady_state: bool = False
    cost: CostModel = field(default_factory=CostModel)
    overlap: bool = True
    nodes: str = "free"
    layers: int = 1

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_MODES:
            raise PlanError(f"unknown weights option {self.weights!r}",
                            fix=f"use one of: {', '.join(WEIGHT_MODES)}")
        if self.nodes not in NODE_MODES:
            raise PlanError(f"unknown nodes option {self.nodes!r}",
                            fix=f"use one of: {', '.join(NODE_MODES)}")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) \
                or self.layers < 1:
            raise PlanError(f"layers must be a whole number of at least 1, got {self.layers!r}",
                            fix="give how many identical blocks the model stacks, e.g. 80")

    def to_dict(self) -> dict:
        d = {"weights": self.weights, "steady_state": self.steady_state,
             "cost": self.cost.to_dict(), "overlap": self.overlap}
        if self.nodes != "free":  # absent when free: plans and cache keys from before hold
            d["nodes"] = self.nodes
        if self.layers != 1:  # likewise absent for one block
            d["layers"] = self.layers
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Options":
        return Options(str(d.get("weights", "sharded")), _flag(d, "steady_state", False),
                       CostModel.from_dict(d.get("cost", {})), _flag(d, "overlap", True),
                       str(d.get("nodes", "free")), d.get("layers", 1))


@dataclass(frozen=True)
class Solved:
    """An optimized plan: the solver, how its solve ended ("optimal" or "time_limit"), the
    time limit it ran under, the named strategy that warm-started it, and its rank in the
    MIP's pool (1: the optimum; k: optimal among the plans that split some time-heavy op
    otherwise than each of the k - 1 before it, `optimizer/pool.py`)."""
    solver: str
    status: str
    time_limit_s: float | None = None
    warm_start: str | None = None
    pool_rank: int = 1

    def to_dict(self) -> dict:
        d = {"solver": self.solver, "status": self.status,
             "time_limit_s": self.time_limit_s, "warm_start": self.warm_start}
        if self.pool_rank != 1:  # the optimum's files stay as they were
            d["pool_rank"] = self.pool_rank
        return d


@dataclass(frozen=True)
class Named:
    """A named strategy's plan, and the ops where no candidate matched its rule exactly."""
    strategy: str
    inexact_ops: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "inexact_ops": list(self.inexact_ops)}


Origin = Solved | Named


@dataclass(frozen=True)
class Considered:
    """One plan the selection stage simulated: its label ("optimized", or a strategy's name),
    its objective and its simulated seconds."""
    label: str
    objective_s: float
    simulated_s: float

    def to_dict(self) -> dict:
        return {"label": self.label, "objective_s": self.objective_s,
                "simulated_s": self.simulated_s}


@dataclass(frozen=True)
class Judged:
    """What the simulator said of a plan chosen by `selection.choose_plan`: its simulated
    seconds (`measure`: "block", one block in a stack, or "program", the plan's program
    alone) and every plan it was chosen from, least simulated first. The objective's bound
    and gap are a proof on the objective's model; the choice among the considered plans is
    by simulated time and proves nothing beyond them. `left_out`: (label, why) of the plans
    that could not be made (one device without the memory for the whole graph)."""
    simulated_s: float
    measure: str
    considered: tuple[Considered, ...]
    left_out: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        return {"simulated_s": self.simulated_s, "measure": self.measure,
                "considered": [c.to_dict() for c in self.considered],
                "left_out": [list(x) for x in self.left_out]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Judged":
        return Judged(float(d["simulated_s"]), str(d["measure"]),
                      tuple(Considered(str(c["label"]), float(c["objective_s"]),
                                       float(c["simulated_s"])) for c in d["considered"]),
                      tuple((str(a), str(b)) for a, b in d.get("left_out", ())))
_ORIGIN_KEYS = ("solver", "status", "time_limit_s", "warm_start", "pool_rank", "strategy",
                "inexact_ops")


def _origin(d: Mapping[str, Any]) -> Origin:
    if "strategy" in d:
        return Named(str(d["strategy"]), tuple(d.get("inexact_ops") or ()))
    return Solved(str(d.get("solver", "highs")), str(d.get("status", "optimal")),
                  d.get("time_limit_s"), d.get("warm_start"), int(d.get("pool_rank", 1)))


@dataclass(frozen=True)
class Plan:
    graph: Graph
    topology: Topology
    choice: tuple[tuple[str, Candidate], ...]
    objective_s: float
    bound_s: float | None
    gap: float | None
    solve_s: float
    options: Options
    origin: Origin
    judged: Judged | None = None

    @property
    def chosen(self) -> dict[str, Candidate]:
        return dict(self.choice)

    def candidate(self, key: str) -> Candidate:
        try:
            return self.chosen[key]
        except KeyError:
            raise PlanError(f"the plan has no choice for {key!r}", op=key,
                            fix="ops use their name, graph inputs 'input:<name>'") from None

    def layout_of_input(self, name: str) -> Candidate:
        return self.candidate(INPUT_PREFIX + name)

    # ----------------------------------------------------------------- JSON

    def to_dict(self, timing: bool = False) -> dict[str, Any]:
        d = {"format": FORMAT, "graph": self.graph.to_dict(),
             "topology": self.topology.to_dict(),
             "choice": [[k, c.to_json()] for k, c in self.choice],
             "objective_s": _num(self.objective_s), "bound_s": _num(self.bound_s),
             "gap": _num(self.gap),
             "options": {**self.options.to_dict(), **self.origin.to_dict()}}
        if self.judged is not None:
            d["judged"] = self.judged.to_dict()
        if timing:
            d["solve_s"] = self.solve_s
        return d

    def to_json(self, timing: bool = False) -> str:
        return json.dumps(self.to_dict(timing), sort_keys=True, separators=(",", ":"),
                          allow_nan=False)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Plan":
        if d.get("format") != FORMAT:
            raise PlanError(f"not a plan file (format {d.get('format')!r})",
                            fix=f"write plans with Plan.to_json ({FORMAT})")
        opts = d.get("options", {})
        known = Options(nodes="parallel", layers=2).to_dict()  # every key, even those left out
        unknown = sorted(set(opts) - set(known) - set(_ORIGIN_KEYS))
        if unknown:
            raise PlanError(f"plan options hold unknown keys {unknown}",
                            fix="regenerate the plan with this version of einsummable")
        graph = Graph.from_dict(d["graph"])
        topology = read_topology(d["topology"], "plan.topology")
        choice = tuple((k, Candidate.from_json(c)) for k, c in d["choice"])
        return Plan(graph, topology, choice, float(d["objective_s"]), d.get("bound_s"),
                    d.get("gap"), float(d.get("solve_s", 0.0)), Options.from_dict(opts),
                    _origin(opts), Judged.from_dict(d["judged"]) if "judged" in d else None)

    @staticmethod
    def from_json(text: str) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan JSON does not parse: {e}", fix="regenerate the plan") from None
        if not isinstance(data, dict):
            raise PlanError("plan JSON is not an object", fix="regenerate the plan")
        try:
            return Plan.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"plan JSON is missing or has a bad field ({e})",
                            fix="regenerate the plan") from None
