"""`einsummable plan --model NAME | --module path.py:Class | --hf TYPE --topology NAME`: optimise a
plan.

The plan printed is the least simulated of the MIP's optimum and the named strategies
(`selection.choose_plan`); `--mip-only` returns the MIP's optimum without simulating.

Models by preset name are captured from their nn.Module built on the meta device (no weights
are allocated); `--module` imports a file and captures `Class()` on an input of shape
(batch, seq, dim) where dim comes from `--dim` or the class's `dim` attribute. `--hf TYPE`
builds a transformers model type from its default config (LLaMA's is 7B) with `--hf-set
key=value` fields in place, on the meta device, and plans one layer or (`--hf-part model`) the
whole model (`models.huggingface`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from ..errors import EinsummableError
from ..frontend.capture import trace
from ..models.huggingface import PARTS, hf, parse_overrides
from ..models.presets import preset
from ..optimizer.api import named_plan, optimize
from ..optimizer.report import explain
from ..selection.choose import DEFAULT_POOL, choose_plan
from ..topology import load_topology
from .progress import progress

HELP = "optimise a multi-device plan for a model on a topology"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="preset name, e.g. llama-7b")
    src.add_argument("--module", help="path.py:Class (an nn.Module taking x of (batch, seq, dim))")
    src.add_argument("--hf", metavar="TYPE",
                     help="a transformers model type (llama, mistral, qwen2, gemma, phi3, gpt2, "
                          "bert, ...) built from its default config")
    p.add_argument("--hf-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config field for --hf, e.g. num_hidden_layers=2 (repeatable)")
    p.add_argument("--hf-part", default="layer", choices=PARTS,
                   help="--hf: plan one decoder layer (default) or the whole model")
    p.add_argument("--hf-attn", default="sdpa", choices=("sdpa", "eager"),
                   help="--hf: the attention implementation the model is built with")
    p.add_argument("--topology", required=True, help="shipped name (a100x8, ...) or a YAML path")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dim", type=int, default=None, help="input width for --module")
    p.add_argument("--layers", type=int, default=1, help="stacked blocks (presets)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--width", type=float, default=None, help="scale a preset's width")
    p.add_argument("--weights", default="free", choices=("free", "sharded"),
                   help="free: memory decides what is replicated; sharded: stored once")
    p.add_argument("--nodes", default="free", choices=("free", "parallel"),
                   help="on a machine of several nodes: search every level (free, beside the "
                        "node-parallel optimum), or only plans in which each node runs its "
                        "share of the batch (parallel; a search the size of one node's)")
    p.add_argument("--model-layers", type=int, default=None,
                   help="the graph is one block of a model of this many identical layers: "
                        "memory holds every layer's weights in the plan's layout")
    p.add_argument("--steady-state", action="store_true",
                   help="leave the output in the layout the input arrived in (stacked blocks)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="wall seconds for the search, build and pricing included; when it "
                        "runs out, the best plan found and its gap")
    p.add_argument("--strategy", default=None,
                   help="a named strategy instead of the optimizer (data-parallel, fsdp, "
                        "megatron-tp, megatron-tp-sp, ulysses, one-device)")
    p.add_argument("--mip-only", action="store_true",
                   help="return the MIP's optimum as it is, without simulating it beside the "
                        "named strategies and keeping the fastest")
    p.add_argument("--pool", type=int, default=DEFAULT_POOL,
                   help="plans of the MIP the simulator judges: the optimum and the next ones "
                        "that split a time-heavy op otherwise (1: the optimum alone)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes simulating the plans at once (pays on large machines: a "
                        "LLaMA-7B block on h100x8x2 takes tens of seconds a plan)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the plan cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--out", default=None, help="write the plan JSON here")


def load_graph(args: argparse.Namespace):
    if args.hf:
        import torch
        module, inputs = hf(args.hf, part=args.hf_part, batch=args.batch, seq=args.seq,
                            dtype=getattr(torch, args.dtype),
                            overrides=parse_overrides(args.hf_set),
                            attn_implementation=args.hf_attn)
        return trace(module, inputs)
    if args.hf_set:
        raise EinsummableError("--hf-set sets fields of a --hf model's config",
                               fix="pass --hf TYPE, or leave --hf-set out")
    if args.model:
        import torch
        module, inputs = preset(args.model, args.batch, args.seq, device="meta",
                                dtype=getattr(torch, args.dtype), width=args.width,
                                n_layers=args.layers)
        return trace(module, inputs)
    path, _, cls = args.module.partition(":")
    if not cls or not Path(path).is_file():
        raise EinsummableError(f"--module {args.module!r}: expected an existing path.py:Class",
                               fix="e.g. --module mymodel.py:Block")
    spec = importlib.util.spec_from_file_location("user_module", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch
    with torch.device("meta"):
        module = getattr(mod, cls)()
    dim = args.dim or getattr(module, "dim", None)
    if dim is None:
        raise EinsummableError(f"cannot tell the input width of {cls}", fix="pass --dim")
    x = torch.empty(args.batch, args.seq, dim, device="meta", dtype=getattr(torch, args.dtype))
    return trace(module.to(getattr(torch, args.dtype)), (x,))


def main(args: argparse.Namespace) -> int:
    with progress(not args.json):
        plan, graph, topo = _make(args)
    return _report(args, plan, graph, topo)


def _make(args: argparse.Namespace):
    graph = load_graph(args)
    topo = load_topology(args.topology)
    if args.strategy:
        plan = named_plan(graph, topo, args.strategy, weights=args.weights,
                          steady_state=args.steady_state)
    elif args.mip_only:
        plan = optimize(graph, topo, time_limit_s=args.time_limit, weights=args.weights,
                        steady_state=args.steady_state, cache=not args.no_cache,
                        nodes=args.nodes, layers=args.model_layers)
    else:
        plan = choose_plan(graph, topo, time_limit_s=args.time_limit, weights=args.weights,
                           steady_state=args.steady_state, cache=not args.no_cache,
                           jobs=args.jobs, pool=args.pool, nodes=args.nodes,
                           layers=args.model_layers)
    return plan, graph, topo


def _report(args: argparse.Namespace, plan, graph, topo) -> int:
    if args.out:
        Path(args.out).write_text(plan.to_json())
    if args.json:
        summary = {"objective_s": plan.objective_s, "bound_s": plan.bound_s, "gap": plan.gap,
                   "solve_s": plan.solve_s, "topology": topo.name, "ops": len(graph.ops),
                   "options": plan.to_dict()["options"], "out": args.out,
                   "choice": {k: str(c) for k, c in plan.choice},
                   "judged": None if plan.judged is None else plan.judged.to_dict()}
        print(json.dumps(summary, sort_keys=True))
    else:
        print(explain(plan, strategies=False))
        if args.out:
            print(f"wrote {args.out}", file=sys.stderr)
    return 0
