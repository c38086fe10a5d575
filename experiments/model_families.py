"""The model families users have, captured as they are and planned (issue 20).

Each workload builds one model with its library's own classes, from the library's default
config for that model type (transformers: one decoder or encoder layer run as the model runs
it, `einsummable.models.hf`; timm: the whole model by name), on the meta device, nothing
downloaded. For each: capture seconds (`trace`, fusion included), the op count, the fused
kernels the ops became, and the MIP's plan on the topology: its objective and proved gap, and
its program simulated (`simulate`, the time the objective predicts). No baseline is compared:
this is a table of what captures and plans, not a speed claim.
"""
from __future__ import annotations

import collections
import time

import torch

from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.capture import trace
from einsummable.models import hf
from einsummable.models.compat import torchvision_importable
from einsummable.optimizer.api import optimize
from einsummable.topology import load_topology

from . import harness
from .harness import Progress, Row

MS = 1e3


def build(w: dict, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple]:
    """The workload's module and example input (module docstring)."""
    if w["library"] == "transformers":
        return hf(w["model_type"], part=w.get("part", "layer"), batch=w["batch"],
                  seq=w["seq"], dtype=dtype, overrides=w.get("overrides"),
                  attn_implementation=w.get("attn", "sdpa"))
    torchvision_importable()
    import timm
    with torch.device("meta"):
        module = timm.create_model(w["model"], pretrained=False, **w.get("overrides", {}))
    size = w.get("image", 224)
    x = torch.empty(w["batch"], 3, size, size, device="meta", dtype=dtype)
    return module.to(dtype).eval(), (x,)


def run(cfg: dict, stream=None) -> tuple[list[Row], dict, str]:
    """Per workload, one row: the MIP's plan simulated (`time_s`) beside its objective
    (`model_s`), with ops, kernels and capture seconds in the row's note."""
    topo = load_topology(cfg["topology"])
    dtype = getattr(torch, cfg.get("dtype", "float16"))
    progress = Progress(len(cfg["workloads"]), cfg["name"], stream)
    rows: list[Row] = []
    families: dict = {}
    for w in cfg["workloads"]:
        progress.step(w["name"])
        module, args = build(w, dtype)
        t0 = time.perf_counter()
        graph = trace(module, args)
        capture_s = time.perf_counter() - t0
        kernels = collections.Counter(op.fused for op in graph.ops if op.fused)
        plan = optimize(graph, topo, cfg.get("time_limit_s"), steady_state=False, cache=False)
        simulated_s = simulate(plan).time_s
        families[w["name"]] = {"ops": len(graph.ops), "kernels": dict(kernels),
                               "capture_s": capture_s, "objective_s": plan.objective_s,
                               "simulated_s": simulated_s, "gap": plan.gap,
                               "solve_s": plan.solve_s}
        rows.append(Row(cfg["name"], w["name"], harness.OPTIMIZED_SYSTEM, topo.world_size,
                        time_s=simulated_s, model_s=plan.objective_s,
                        note=f"{len(graph.ops)} ops, capture {capture_s:.2f} s"))
    lines = [f"{cfg['name']}: model families captured and planned on {topo.name} "
             "(the MIP's plan: objective, and simulated)",
             f"{'workload':<22} {'ops':>5} {'capture s':>10} {'objective ms':>13} "
             f"{'simulated ms':>13} {'gap':>8} {'solve s':>8}  fused kernels"]
    for name, f in families.items():
        lines.append(f"{name:<22} {f['ops']:>5} {f['capture_s']:>10.2f} "
                     f"{f['objective_s'] * MS:>13.3f} {f['simulated_s'] * MS:>13.3f} "
                     f"{f['gap']:>8.1e} {f['solve_s']:>8.1f}  "
                     + ", ".join(f"{k} x{n}" for k, n in sorted(f["kernels"].items())))
    return rows, {"families": families}, "\n".join(lines)
