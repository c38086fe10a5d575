"""Plans cached on disk, keyed by graph, topology, options, time limit and solver.

A cached plan is served only after it is checked (`load_cached`): the file's digest matches
its plan (a file edited or cut short), the plan is an optimized one of this graph, topology,
options and solver, every op and graph input has a candidate with devices of the topology, and
its objective, recomputed on the model, is the one it states (so a plan of an older cost model
or a hand-edited figure is not served). Anything else is solved again, and the log says why.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from pathlib import Path

from ..errors import EinsummableError
from ..frontend.ir import Graph
from ..planning.plan import Options, Plan, Solved
from .model import plan_model
from .objective import objective_s

log = logging.getLogger(__name__)
# The recomputed objective must equal the stored one up to float rounding of its sums.
OBJECTIVE_REL_TOL = 1e-9

# Part of every cache key: raise it whenever pricing changes which plan is optimal, so that
# no cached plan of an older cost model is served (2: exchanges over the rails; weights sent
# in one batch priced once; 3: relayed transfers priced store-and-forward; 4: weight streams
# charged their contention, partial sums reduce-scattered in row-major chunks; 5: strided
# parts packed by their senders, priced; 6: exchanges on GPU fabrics timed by replaying their
# programs, no round barrier; 7: a weight's stitching copies charged in full to compute;
# 8: copies and folds over packed trees, one send per peer at a time; 9: a weight's
# stitching copies on the GPUs' copy streams, charged what they take from kernels; 13: ring
# and multipath programs on meshes, forwarded parts sent from where they landed; 14: direct
# folds, pipelined folds a round after arrival, a round's strided sends packed by one kernel;
# 15: files carry their plan's digest; 16: flat programs, broadcasts and gathers by rail;
# 17: an exchange that is one node's on every node synthesised per node; 18: memory rows
# count blocks read in place as free, weights gathered from their fetch step, packed messages;
# 19: weights placed freely, cut for the blocks gathered; 20: messages over 4 MiB wait for
# their receive; 21: a training step's carried outputs handed on and its gradients streamed;
# 22: a streamed gradient's stitching on the side stream, a stream's contention by level,
# constants free in the simulator, inputs sent ahead of their reader).
CACHE_VERSION = 22


CACHE_ENV = "EINSUMMABLE_CACHE_DIR"


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "einsummable" / "plans"


def cache_key(graph: Graph, topology, options: Options, time_limit_s, solver: str) -> str:
    blob = json.dumps({"version": CACHE_VERSION, "graph": graph.to_dict(),
                       "topology": topology.to_dict(), "options": options.to_dict(),
                       "time_limit_s": time_limit_s, "solver": solver},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_cached(path: Path, graph: Graph, topology, options: Options, time_limit_s,
                solver: str, pool_rank: int = 1) -> Plan | None:
    """The cached plan, or None when there is none or it fails a check (module docstring);
    `pool_rank`: the plan's rank in the MIP's pool (`api.optimize_pool`)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    why = _check(raw, graph, topology, options, time_limit_s, solver, pool_rank)
    if isinstance(why, str):
        log.warning("cached plan %s not served (%s): solving again", path.name, why)
        return None
    return why


def _check(raw: str, graph: Graph, topology, options: Options, time_limit_s,
           solver: str, pool_rank: int = 1) -> Plan | str:
    """The plan, or why it is not served."""
    try:
        doc = json.loads(raw)
        text, digest = doc["plan"], doc["digest"]
    except (ValueError, KeyError, TypeError):
        return "not a cache file of this version"
    if not isinstance(text, str) or _digest(text) != digest:
        return "its digest does not match its plan"
    try:
        plan = Plan.from_json(text)
    except Exception as e:  # noqa: BLE001 - any parse failure means: solve again
        return f"the plan does not parse ({type(e).__name__})"
    if plan.graph.to_dict() != graph.to_dict() or plan.topology.to_dict() != topology.to_dict():
        return "it is for another graph or topology"
    if plan.options != options:
        return "it was solved under other options"
    origin = plan.origin
    if not isinstance(origin, Solved) or origin.solver != solver \
            or origin.time_limit_s != time_limit_s or origin.pool_rank != pool_rank:
        return "it is not an optimized plan of this solver, time limit and pool rank"
    n = len(topology.devices)
    if any(not 0 <= d < n for _, c in plan.choice for ds in c.devices for d in ds):
        return "it names devices the topology does not have"
    try:
        recomputed = objective_s(plan_model(plan), {k: 0 for k, _ in plan.choice})
    except EinsummableError as e:
        return f"its choice is not a plan of this graph ({e.args[0] if e.args else e})"
    if not (math.isfinite(plan.objective_s)
            and math.isclose(recomputed, plan.objective_s, rel_tol=OBJECTIVE_REL_TOL)):
        return f"its objective {plan.objective_s!r} s is not its cost {recomputed:.6g} s"
    if plan.bound_s is not None and plan.bound_s > plan.objective_s * (1 + OBJECTIVE_REL_TOL):
        return "its bound exceeds its objective"
    return plan


def store(path: Path, plan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = plan.to_json(timing=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"digest": _digest(text), "plan": text}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs a re-solve next time
