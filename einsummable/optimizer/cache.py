"""Plans cached on disk, keyed by graph, topology, options, time limit and solver."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..errors import EinsummableError
from ..frontend.ir import Graph
from ..planning.plan import Options, Plan

# Part of every cache key: raise it whenever pricing changes which plan is optimal, so that
# no cached plan of an older cost model is served (2: exchanges over the rails; weights sent
# in one batch priced once; 3: relayed transfers priced store-and-forward; 4: weight streams
# charged their contention, partial sums reduce-scattered in row-major chunks; 5: strided
# parts packed by their senders, priced; 6: exchanges on GPU fabrics timed by replaying their
# programs, no round barrier; 7: a weight's stitching copies charged in full to compute;
# 8: copies and folds over packed trees, one send per peer at a time; 9: a weight's
# stitching copies on the GPUs' copy streams, charged what they take from kernels; 13: ring
# and multipath programs on meshes, forwarded parts sent from where they landed; 14: direct
# folds, pipelined folds a round after arrival, a round's strided sends packed by one kernel).
CACHE_VERSION = 14


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


def load_cached(path: Path, graph: Graph, topology):
    """The cached plan, or None when absent, corrupt, or for another graph/topology."""
    try:
        plan = Plan.from_json(path.read_text())
    except (OSError, UnicodeDecodeError, EinsummableError, Exception):  # corrupt: rebuild
        return None
    if plan.graph.to_dict() != graph.to_dict() or plan.topology.to_dict() != topology.to_dict():
        return None
    return plan


def store(path: Path, plan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(plan.to_json(timing=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs a re-solve next time

