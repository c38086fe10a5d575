"""Simulated against measured on one device: the LLaMA-7B-width block under one-device plans.

    python -m experiments.gpu_check [--device cuda] [--device-yaml calibrated.yaml]
        [--tokens 512,2048] [--plans tp1,tp2,tp4,tp8,seq4] [--repeats 5] [--out report.json]

Graph: `llama_block_graph(preset_config("llama-7b"), 1, T)` (on the CPU, `--width 1/16`
scales it down), fused (`frontend/fuse.py`: one attention and one RMSNorm kernel, as a GPU
runs them), in float16 on cuda and float32 on the CPU.

Plans, world size 1, every tuple on device 0, so the kernels have the shapes that multi-GPU
plans give each GPU:
    tpK     every op splits its heads or FFN mode K ways (q/k/v/o and attention by heads,
            gate/up/down by FFN: T x 4096 x 4096/K and T x 11008/K x 4096); other ops whole
    seqK    every op splits its token mode K ways

Measured, per (T, plan):
    check    one run of the local executor on the device (`run_local(device=)`), its output
             against the reference evaluator on the same device: max |a - b| / max |b|
    program  the local executor's run, the device synchronised before and after, timed with
             CUDA events (perf_counter on the CPU); median of `--repeats` after the check run
             and one warm-up run
    kernels  the program stepped instruction by instruction (the executor's `RankState`),
             each kernel instruction in its own `Span`: the device idle before it, so the span
             is the host's issue plus the device's run, what the instruction costs its rank;
             median per instruction over the repeats
    dist     the program on a 1-rank `dist` pool (nccl on cuda, gloo on the CPU), `Pool.time`;
             its Place instructions copy the weights from the host to the device every run
Simulated: `simulate_programs(trace=True)` on a one-device topology of the device type in a
calibrated YAML (`einsummable calibrate --device cuda --out ...`), or the shipped a100 type:
per program its time, per kernel instruction its end minus start.

The report (JSON, `--out`): the device, the topology, the model, per program the measured and
simulated seconds, per kernel the same, and Pearson's r over programs, over kernels and over
the logs of kernel times (times span decades). Constant blocks are generated once per plan and
cached (as the executors do); the simulator charges them every run, so Const instructions are
left out of the kernel r.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import yaml

from einsummable.backend.lowering import Lowered, lower
from einsummable.backend.runtime.pool import Pools
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.rank_state import RankState
from einsummable.backend.runtime.simulator import KERNELS, simulate_programs
from einsummable.commands.calibrate.clock import Span, check_device, synchronize
from einsummable.core.program import Compute
from einsummable.errors import EinsummableError, PlanError
from einsummable.frontend.fuse import fuse
from einsummable.frontend.ir import Graph, Op
from einsummable.frontend.reference import TORCH_DTYPES, evaluate_op, materialize
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.planning.kernel_time import op_class
from einsummable.planning.placement import INPUT_PREFIX, Candidate, input_op, place
from einsummable.topology import Topology, read_topology
from einsummable.topology.reader import SHIPPED_DIR

DEFAULT_YAML = SHIPPED_DIR / "a100x8.yaml"
# Output agreement that counts as correct, per dtype (max |a - b| / max |b|).
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
# Defaults per device kind: tokens, plans, repeats, width, dtype.
DEFAULTS = {"cuda": ("512,2048", "tp1,tp2,tp4,tp8,seq4", 5, "1", "float16"),
            "cpu": ("16,32", "tp1,tp2,seq2", 3, "1/16", "float32")}
SEED = 0


@dataclass(frozen=True)
class Setup:
    device: torch.device
    dtype: str
    width: float
    tokens: tuple[int, ...]
    plans: tuple[str, ...]
    repeats: int
    dist: bool
    time_limit_s: float


def device_topology(path: str | Path | None, type_name: str | None = None) -> Topology:
    """A one-device topology of a device type from a topology YAML (default: a100x8's)."""
    src = Path(path) if path else DEFAULT_YAML
    data = yaml.safe_load(src.read_text())
    types = (data or {}).get("device_types") or {}
    if not types:
        raise PlanError(f"{src}: no device_types entry",
                        fix="pass a YAML written by `einsummable calibrate --device cuda`")
    name = type_name or next(iter(types))
    if name not in types:
        raise PlanError(f"{src}: no device type {name!r}", fix=f"use one of {', '.join(types)}")
    doc = {"name": f"{name}x1", "source_notes": f"device type {name} of {src}",
           "device_types": {name: types[name]},
           "nodes": {"count": 1, "devices_per_node": 1, "device_type": name}, "links": []}
    return read_topology(doc, str(src))


def block_graph(tokens: int, width: float, dtype: str) -> Graph:
    cfg = preset_config("llama-7b", None if width == 1 else width)
    return fuse(llama_block_graph(cfg, 1, tokens, dtype))


def _split_mode(op: Op, sizes: set[int], avoid: int, k: int) -> str | None:
    for m in op.modes:
        if op.size[m] in sizes and op.size[m] != avoid and op.can_split(m) \
                and op.size[m] % k == 0:
            return m
    return None


def plan_choice(g: Graph, plan: str, width: float, tokens: int) -> dict[str, Candidate]:
    """The candidates of one named one-device plan (module docstring)."""
    kind, k = plan.rstrip("0123456789"), int(plan[len(plan.rstrip("0123456789")):] or 1)
    cfg = preset_config("llama-7b", None if width == 1 else width)
    if kind == "tp":
        sizes, avoid = {cfg.n_heads, cfg.ffn_dim}, tokens
    elif kind == "seq":
        sizes, avoid = {tokens}, -1
    else:
        raise PlanError(f"unknown plan {plan!r}", fix="use tpK or seqK, e.g. tp4 or seq2")

    def cand(op: Op) -> Candidate:
        m = _split_mode(op, sizes, avoid, k) if k > 1 else None
        return place(op, {m: k}, [0] * k) if m else place(op, {}, [0])
    choice = {op.name: cand(op) for op in g.ops}
    choice.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in g.inputs})
    return choice


def make_inputs(g: Graph) -> dict[str, torch.Tensor]:
    """Seeded inputs on the CPU and on the device: x ~ N(0, 1), matrices ~ N(0, 1/fan_in),
    norm weights 1 (activations stay in range in float16)."""
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for t in g.inputs:
        if t.kind == "weight" and len(t.shape) == 1:
            v = torch.ones(t.shape)
        else:
            v = torch.randn(t.shape, generator=gen)
            if t.kind == "weight":
                v = v / math.sqrt(t.shape[-1])
        out[t.name] = v.to(TORCH_DTYPES[t.dtype])
    return out


def reference(g: Graph, inputs: dict[str, torch.Tensor], device: torch.device
              ) -> dict[str, torch.Tensor]:
    """The reference evaluator's arithmetic (`evaluate_op` per op in graph order) with every
    tensor, constants included, on `device`."""
    env: dict[str, torch.Tensor] = {}
    for t in g.tensors:
        if t.kind in ("input", "weight"):
            env[t.name] = inputs[t.name].to(device=device, dtype=TORCH_DTYPES[t.dtype])
        elif t.kind == "constant":
            env[t.name] = materialize(g.constant[t.name], t, None, device)
    for op in g.ops:
        env[op.output] = evaluate_op(op, [env[n] for n in op.inputs]).to(
            TORCH_DTYPES[g.tensor(op.output).dtype])
    return {n: env[n] for n in g.outputs}


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    a, b = got.float(), want.float().to(got.device)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def kernel_times(low: Lowered, inputs: dict[str, torch.Tensor], device: torch.device,
                 consts: dict) -> dict[int, float]:
    """Seconds of every kernel instruction of rank 0's program, each in its own Span."""
    prog = low.programs[0]
    st = RankState(low, prog, inputs, device, consts.setdefault(0, {}))
    out = {}
    for pc, ins in enumerate(prog.instrs):
        if isinstance(ins, KERNELS):
            with Span(device) as span:
                st.step(ins)
            out[pc] = span.seconds
        else:
            st.step(ins)
    synchronize(device)
    return out


def program_time(run: Callable[[], Any], device: torch.device) -> float:
    with Span(device) as span:
        run()
    return span.seconds


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def _kernel_class(low: Lowered, ins: Any) -> tuple[str, str, float]:
    """(op name, class, FLOPs of the call) of a kernel instruction ("", "copy", 0 if none)."""
    if not isinstance(ins, Compute):
        return "", "copy", 0.0
    op = next(o for o in low.graph.ops if o.name == ins.op)
    share = math.prod(b - a for a, b in ins.ranges) / math.prod(op.size.values())
    return op.name, "view" if op.is_view else op_class(op), float(op.flops * share)


@dataclass(frozen=True)
class Case:
    """One token count: its graph, inputs on the host and on the device, reference outputs."""
    tokens: int
    graph: Graph
    host: dict[str, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    ref: dict[str, torch.Tensor]


def make_case(tokens: int, setup: Setup) -> Case:
    g = block_graph(tokens, setup.width, setup.dtype)
    host = make_inputs(g)
    inputs = {k: v.to(setup.device) for k, v in host.items()}  # resident, as weights are
    return Case(tokens, g, host, inputs, reference(g, inputs, setup.device))


def check_one(case: Case, low: Lowered, plan: str, setup: Setup, topo: Topology,
              pool: Any) -> tuple[dict, list[dict]]:
    """Everything of the module docstring for one (T, plan): its program and kernel rows."""
    dev, g, inputs, tokens = setup.device, case.graph, case.inputs, case.tokens
    consts: dict = {}
    outs = run_local(low, inputs, consts=consts, device=dev)
    err = max(rel_error(outs[n], case.ref[n]) for n in g.outputs)
    run_local(low, inputs, consts=consts, device=dev)  # warm-up: caches filled, clocks up
    prog_s, per_pc = [], {}
    for _ in range(setup.repeats):
        prog_s.append(program_time(lambda: run_local(low, inputs, consts=consts, device=dev),
                                   dev))
        for pc, s in kernel_times(low, inputs, dev, consts).items():
            per_pc.setdefault(pc, []).append(s)
    dist_s = None
    if pool is not None:
        pool.time(low, case.host)  # warm-up: ships the plan and the weights once
        dist_s = statistics.median(pool.time(low, case.host) for _ in range(setup.repeats))
    sim = simulate_programs(low, topo, trace=True)
    sim_pc = {pc: end - start for r, pc, _, _, start, end in sim.trace if r == 0}
    kernels = []
    for pc, times in sorted(per_pc.items()):
        ins = low.programs[0].instrs[pc]
        name, cls, flops = _kernel_class(low, ins)
        kernels.append({"tokens": tokens, "plan": plan, "pc": pc, "kind": type(ins).__name__,
                        "op": name, "class": cls, "flops": flops,
                        "measured_s": statistics.median(times), "simulated_s": sim_pc[pc]})
    row = {"tokens": tokens, "plan": plan, "instructions": len(low.programs[0].instrs),
           "kernels": len(kernels), "max_rel_error": err,
           "ok": err <= TOLERANCE[setup.dtype], "measured_s": statistics.median(prog_s),
           "measured_kernels_sum_s": sum(k["measured_s"] for k in kernels),
           "dist_s": dist_s, "simulated_s": sim.time_s}
    return row, kernels


def dist_backend(device: torch.device) -> tuple[str | None, str]:
    """(backend, why) of the 1-rank dist pool: nccl on cuda where torch has it, else gloo."""
    import torch.distributed as dist
    if device.type == "cuda":
        if dist.is_available() and dist.is_nccl_available():
            return "nccl", "torch.distributed with NCCL"
        return None, "this torch has no NCCL: the dist check was skipped"
    return "gloo", "gloo on the CPU (the nccl path's code, another transport)"


def run_check(setup: Setup, topo: Topology) -> dict:
    t_start = time.monotonic()
    backend, why = dist_backend(setup.device) if setup.dist else (None, "--no-dist")
    programs, kernels, skipped = [], [], []
    pools = Pools()
    try:
        pool = pools.get(backend, 1) if backend else None
        for tokens in setup.tokens:
            if time.monotonic() - t_start > setup.time_limit_s:
                skipped += [{"tokens": tokens, "plan": p, "why": "time limit"}
                            for p in setup.plans]
                continue
            case = make_case(tokens, setup)
            for plan in setup.plans:
                if time.monotonic() - t_start > setup.time_limit_s:
                    skipped.append({"tokens": tokens, "plan": plan, "why": "time limit"})
                    continue
                low = lower(case.graph, plan_choice(case.graph, plan, setup.width, tokens), topo)
                row, ks = check_one(case, low, plan, setup, topo, pool)
                programs.append(row)
                kernels.extend(ks)
                print(f"[gpu_check] T={tokens} {plan}: measured {row['measured_s'] * 1e3:.3f} "
                      f"ms, simulated {row['simulated_s'] * 1e3:.3f} ms, error "
                      f"{row['max_rel_error']:.2e}", file=sys.stderr)
    finally:
        pools.close()
    timed = [k for k in kernels if k["kind"] != "Const"]
    positive = [k for k in timed if k["measured_s"] > 0 and k["simulated_s"] > 0]
    r = {"programs": pearson([p["measured_s"] for p in programs],
                             [p["simulated_s"] for p in programs]),
         "kernels": pearson([k["measured_s"] for k in timed], [k["simulated_s"] for k in timed]),
         "kernels_log": pearson([math.log(k["measured_s"]) for k in positive],
                                [math.log(k["simulated_s"]) for k in positive])}
    dev = setup.device
    return {
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": setup.dtype,
        "model": {"preset": "llama-7b", "width": setup.width, "batch": 1, "fused": True},
        "topology": {"name": topo.name, "source": topo.source_notes,
                     "device": topo.devices[0].name},
        "dist": {"backend": backend, "note": why},
        "programs": programs, "kernels": kernels, "pearson": r, "skipped": skipped,
        "all_ok": all(p["ok"] for p in programs), "wall_s": time.monotonic() - t_start,
        "notes": ["kernel times: each kernel instruction alone, the device idle before it",
                  "Const instructions are cached after the first run and left out of r",
                  "dist_s includes the host-to-device copy of the weights at every Place"]}


def table(report: dict) -> str:
    lines = [(f"{'T':>6} {'plan':>6} {'instrs':>6} {'measured ms':>12} {'simulated ms':>13} "
              f"{'sim/meas':>8} {'dist ms':>9} {'error':>9}")]
    for p in report["programs"]:
        dist = f"{p['dist_s'] * 1e3:9.3f}" if p["dist_s"] is not None else f"{'-':>9}"
        lines.append(f"{p['tokens']:6d} {p['plan']:>6} {p['instructions']:6d} "
                     f"{p['measured_s'] * 1e3:12.3f} {p['simulated_s'] * 1e3:13.3f} "
                     f"{p['simulated_s'] / p['measured_s']:8.3f} {dist} "
                     f"{p['max_rel_error']:9.2e}")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    r = report["pearson"]
    lines.append(f"pearson r: programs {fmt(r['programs'])}, kernels {fmt(r['kernels'])}, "
                 f"log kernels {fmt(r['kernels_log'])} ({len(report['kernels'])} kernels, "
                 f"{report['device_name']}, topology {report['topology']['name']})")
    return "\n".join(lines)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise PlanError(f"--{what}: expected positive integers, got {text!r}",
                        fix=f"write e.g. --{what} 512,2048")
    return vals


def parse(argv: list[str] | None) -> tuple[Setup, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_check",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--device-yaml", default=None,
                    help="topology YAML whose device type the simulator uses (default: the "
                         "shipped a100x8's a100)")
    ap.add_argument("--device-type", default=None, help="which device type of that YAML")
    ap.add_argument("--tokens", default=None, help="token counts, e.g. 512,2048")
    ap.add_argument("--plans", default=None, help="e.g. tp1,tp2,tp4,tp8,seq4")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--width", default=None, help="model width factor, e.g. 1 or 1/16")
    ap.add_argument("--dtype", default=None, help="float16, bfloat16 or float32")
    ap.add_argument("--no-dist", action="store_true", help="skip the 1-rank dist pool")
    ap.add_argument("--time-limit", type=float, default=420.0,
                    help="seconds after which the remaining plans are skipped")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    dev = check_device(args.device)
    tokens, plans, repeats, width, dtype = DEFAULTS[dev.type]
    dtype = args.dtype or dtype
    if dtype not in TOLERANCE:
        raise PlanError(f"--dtype {dtype!r} is not supported", fix="use float16, bfloat16 or "
                                                                   "float32")
    setup = Setup(dev, dtype, float(Fraction(args.width or width)),
                  _ints(args.tokens or tokens, "tokens"),
                  tuple(p for p in (args.plans or plans).split(",") if p),
                  args.repeats or repeats, not args.no_dist, args.time_limit)
    return setup, args


def main(argv: list[str] | None = None) -> int:
    try:
        setup, args = parse(argv)
        topo = device_topology(args.device_yaml, args.device_type)
        report = run_check(setup, topo)
    except EinsummableError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True))
    print(table(report))
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
