"""Plan: one candidate per node (graph inputs' layouts and ops), with the solver's figures.

The JSON form is self-contained (graph and topology included), so a worker can run a plan from
the file alone. It is canonical: sorted keys, no whitespace, and no wall-clock figure unless
asked for (`to_json(timing=True)`), so the same graph, topology and options give the same bytes.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import PlanError
from .ir import Graph
from .placement import INPUT_PREFIX, Candidate

FORMAT = "einsummable.plan/1"


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class Plan:
    graph: Graph
    topology: Any
    choice: tuple[tuple[str, Candidate], ...]
    objective_s: float
    bound_s: float | None
    gap: float | None
    solve_s: float
    options: tuple[tuple[str, Any], ...]

    @property
    def chosen(self) -> dict[str, Candidate]:
        return dict(self.choice)

    @property
    def option(self) -> dict[str, Any]:
        return dict(self.options)

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
             "gap": _num(self.gap), "options": {k: v for k, v in self.options}}
        if timing:
            d["solve_s"] = self.solve_s
        return d

    def to_json(self, timing: bool = False) -> str:
        return json.dumps(self.to_dict(timing), sort_keys=True, separators=(",", ":"),
                          allow_nan=False)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Plan":
        from .topology import Topology
        if d.get("format") != FORMAT:
            raise PlanError(f"not a plan file (format {d.get('format')!r})",
                            fix=f"write plans with Plan.to_json ({FORMAT})")
        graph = Graph.from_dict(d["graph"])
        topology = Topology.from_dict(d["topology"], "plan.topology")
        choice = tuple((k, Candidate.from_json(c)) for k, c in d["choice"])
        return Plan(graph, topology, choice, float(d["objective_s"]), d.get("bound_s"),
                    d.get("gap"), float(d.get("solve_s", 0.0)),
                    tuple(sorted((k, _freeze(v)) for k, v in d["options"].items())))

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

    # ----------------------------------------------------------------- report

    def explain(self, strategies: bool = True) -> str:
        """Per op: split modes per level, compute and exchange seconds, bytes moved, and the
        same op under each named strategy."""
        from .optimize import explain_plan
        return explain_plan(self, strategies=strategies)


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return {k: _freeze(x) for k, x in v.items()}
    return v
