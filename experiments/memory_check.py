"""The optimizer's memory model against what the lowered programs allocate (issue 22): per
plan and rank, the liveness model's peak (`optimizer/peak.py`) beside the peak of the rank's
program walked instruction by instruction (`backend/footprint.py`).

    python -m experiments.memory_check              # the table of BENCHMARKS.md
    python -m experiments.memory_check --random 25  # ratios over random graphs' plans
    python -m experiments.memory_check --least      # the 7B block's least capacity, met
    python -m experiments.memory_check --caps       # weights free against sharded by cap
"""
from __future__ import annotations

import argparse
import logging

from einsummable.backend.footprint import lowered_peaks
from einsummable.backend.lowering import lower
from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.builder import Builder
from einsummable.frontend.capture import trace
from einsummable.models import preset
from einsummable.models.llama_ir import llama_block_graph
from einsummable.optimizer.api import named_plan, optimize
from einsummable.optimizer.named import NAMED
from einsummable.optimizer.peak import peak_bytes
from einsummable.topology import load_topology

MB = 1e6
TOPOLOGIES = ("cpu2", "cpu4")


def mlp_graph(tokens: int = 64, d: int = 256, f: int = 1024):
    """x @ w1, relu, @ w2 in float32."""
    b = Builder("float32")
    x = b.input("x", (tokens, d))
    h = b.einsum("td,df->tf", x, b.weight("w1", (d, f)), name="up").relu()
    return b.build([b.einsum("tf,fd->td", h, b.weight("w2", (f, d)), name="down")])


def workloads() -> dict:
    module, _ = preset("llama-tiny", batch=2, seq=8)
    gpt2, (x,) = preset("gpt2-tiny", batch=2, seq=16)
    return {"llama-tiny": llama_block_graph(module.config, 2, 8),
            "mlp": mlp_graph(),
            "gpt2-tiny": trace(gpt2, (x,))}


def plans(graph, topo) -> dict:
    out = {"optimized": optimize(graph, topo)}
    for name in NAMED:
        try:
            out[name] = named_plan(graph, topo, name)
        except Exception as e:  # a strategy that does not apply to this graph: named below
            print(f"  ({name}: {type(e).__name__}: {str(e)[:80]})")
    return out


def delivery(plan) -> str:
    return "steady" if plan.options.steady_state else "in_place"


def rows(graph, topo) -> list[tuple]:
    out = []
    for label, plan in plans(graph, topo).items():
        model = peak_bytes(plan)
        prog = lowered_peaks(lower(plan, deliver=delivery(plan)))
        for m, p in zip(model, prog):
            out.append((label, m.device, m.bytes, p.peak_bytes, m, p))
    return out


RANDOM_PLANS = ("optimized", "data-parallel", "fsdp", "megatron-tp", "one-device")


def random_ratios(seeds: int) -> list[float]:
    """Model over program peak, per rank holding anything, for the plans `RANDOM_PLANS` of
    the random graphs of seeds 0..seeds-1 (the tests' generator) on cpu2 and cpu4."""
    import random
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers import random_graph
    out = []
    for seed in range(seeds):
        g = random_graph(random.Random(seed))
        for tname in TOPOLOGIES:
            topo = load_topology(tname)
            for name in RANDOM_PLANS:
                plan = (optimize(g, topo, cache=False) if name == "optimized"
                        else named_plan(g, topo, name))
                peaks = lowered_peaks(lower(plan, deliver=delivery(plan)))
                out += [m.bytes / p.peak_bytes for m, p in zip(peak_bytes(plan), peaks)
                        if p.peak_bytes]
    return out


def least_capacity() -> None:
    """The llama-7b block (batch 1 x 512) on a100x8: its default plan's peak, the least
    capacity the error reports at the first of its halvings where no plan fits, and the peak
    of the plan at that capacity."""
    import dataclasses
    import time
    from einsummable.errors import InfeasibleError
    from einsummable.models.presets import preset_config
    g = llama_block_graph(preset_config("llama-7b"), 1, 512)
    base = load_topology("a100x8")

    def capped(cap):
        return dataclasses.replace(base, name=f"a100x8-{cap:.0f}", devices=tuple(
            dataclasses.replace(d, mem_bytes=cap) for d in base.devices))

    def peak(plan) -> float:
        return max(p.bytes for p in peak_bytes(plan))
    t0 = time.perf_counter()
    default = peak(optimize(g, base, cache=False))
    print(f"default plan: {default / MB:.1f} MB on its fullest device "
          f"(solved in {time.perf_counter() - t0:.1f} s)")
    cap = default / 2
    while True:  # halve the cap until no plan fits (weights free: the replicas go first)
        t0 = time.perf_counter()
        try:
            fits = peak(optimize(g, capped(cap), cache=False))
            print(f"at {cap / MB:.1f} MB a plan of {fits / MB:.1f} MB fits "
                  f"({time.perf_counter() - t0:.1f} s)")
            cap /= 2
        except InfeasibleError as e:
            need = e.min_capacity
            print(f"at {cap / MB:.1f} MB ({time.perf_counter() - t0:.1f} s): {e}")
            break
    t0 = time.perf_counter()
    plan = optimize(g, capped(need * (1 + 1e-6)), cache=False)
    print(f"at the least capacity {need / MB:.1f} MB: a plan of {peak(plan) / MB:.1f} MB "
          f"({time.perf_counter() - t0:.1f} s)")


CAP_SHARES = (1.0, 0.75, 0.5, 0.35, 0.25)


def caps() -> None:
    """Weights free against stored once as memory shrinks: the llama-7b block (batch 1 x
    512, fp16) on a100x8, and an fp16 MLP (2048 tokens, 1024 -> 4096) on 4 synthetic devices,
    each with its memory cut to shares of the peak of its plan with weights free and memory
    to spare. Per cap and weights option: the plan's objective and simulated time, its
    model peak (gathered weight blocks counted), its programs' walked peak, the rounds of
    memory cuts and the solve's seconds."""
    from einsummable.models.presets import preset_config
    from einsummable.topology import synthetic
    b = Builder("float16")
    x = b.input("x", (2048, 1024))
    h = b.einsum("td,df->tf", x, b.weight("w1", (1024, 4096)), name="up").relu()
    mlp16 = b.build([b.einsum("tf,fd->td", h, b.weight("w2", (4096, 1024)), name="down")])
    cases = [("llama-7b block, 1 x 512, a100x8", llama_block_graph(preset_config("llama-7b"),
                                                                   1, 512),
              lambda cap: _capped(load_topology("a100x8"), cap)),
             ("MLP 2048 x 1024 -> 4096, 4 devices", mlp16,
              lambda cap: synthetic(4, mem_bytes=cap))]
    rounds = _RoundCounter()
    logger = logging.getLogger("einsummable.optimizer.gather_cuts")
    logger.addHandler(rounds)
    logger.setLevel(logging.INFO)
    print("| workload | cap MB | weights | objective ms | simulated ms | model peak MB | "
          "program peak MB | cut rounds | solve s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, g, topo_at in cases:
        roomy = max(p.bytes for p in peak_bytes(optimize(g, topo_at(1e12), weights="free",
                                                         cache=False)))
        for share in CAP_SHARES:
            for weights in ("free", "sharded"):
                print(f"| {label} | {_cap_row(g, topo_at, roomy * share, weights, rounds)}")


class _RoundCounter(logging.Handler):
    """Counts the rounds of memory cuts `gather_cuts.fit_gathers` logs."""
    count = 0

    def emit(self, record) -> None:
        self.count += record.getMessage().startswith("memory cuts")


def _capped(base, cap):
    import dataclasses
    return dataclasses.replace(base, name=f"{base.name}-{cap:.0f}", devices=tuple(
        dataclasses.replace(d, mem_bytes=cap) for d in base.devices))


def _cap_row(g, topo_at, cap: float, weights: str, rounds: _RoundCounter) -> str:
    import time
    from einsummable.errors import InfeasibleError
    rounds.count = 0
    t0 = time.perf_counter()
    try:
        plan = optimize(g, topo_at(cap), weights=weights, cache=False)
    except InfeasibleError as e:
        return (f"{cap / MB:.1f} | {weights} | no plan fits (least "
                f"{(e.min_capacity or 0) / MB:.1f} MB) | | | | {rounds.count} | "
                f"{time.perf_counter() - t0:.1f} |")
    s = time.perf_counter() - t0
    model = max(p.bytes for p in peak_bytes(plan))
    walk = max(p.peak_bytes for p in lowered_peaks(lower(plan, deliver=delivery(plan))))
    sim = simulate(plan).time_s
    return (f"{cap / MB:.1f} | {weights} | {plan.objective_s * 1e3:.3f} | {sim * 1e3:.3f} | "
            f"{model / MB:.1f} | {walk / MB:.1f} | {rounds.count} | {s:.1f} |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--random", type=int, default=0, help="seeds of random graphs instead")
    ap.add_argument("--least", action="store_true", help="the 7B block's least capacity")
    ap.add_argument("--caps", action="store_true", help="weights free against sharded by cap")
    args = ap.parse_args(argv)
    if args.caps:
        caps()
        return
    if args.least:
        least_capacity()
        return
    if args.random:
        r = sorted(random_ratios(args.random))
        inside = sum(1 for x in r if abs(x - 1) <= 0.1)
        print(f"{len(r)} ranks: min {r[0]:.3f}, median {r[len(r) // 2]:.3f}, max {r[-1]:.3f}; "
              f"within 10%: {inside}; under 0.9: {sum(1 for x in r if x < 0.9)}")
        return
    print("| workload | topology | plan | ranks | model peak MB | program peak MB | ratio |")
    print("|---|---|---|---|---|---|---|")
    for wname, graph in workloads().items():
        for tname in TOPOLOGIES:
            topo = load_topology(tname)
            groups: list[list] = []  # consecutive ranks of one plan with the same peaks
            for label, d, mb, pb, m, p in rows(graph, topo):
                if pb == 0 and mb == 0:
                    continue  # a rank the plan leaves empty (one device)
                if groups and groups[-1][0] == (label, mb, pb):
                    groups[-1][1].append(d)
                else:
                    groups.append([(label, mb, pb), [d]])
                if args.verbose:
                    print("   model:", m.describe())
                    print("   program: pc", p.pc, p.largest)
            for (label, mb, pb), ranks in groups:
                r = f"{ranks[0]}" if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
                print(f"| {wname} | {tname} | {label} | {r} | {mb / MB:.3f} | {pb / MB:.3f} | "
                      f"{mb / pb:.3f} |")


if __name__ == "__main__":
    main()
