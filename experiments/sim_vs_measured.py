"""Simulator vs measured time of the llama-tiny block on gloo ranks, over many plans; and a
1-rank program vs eager torch of the same model.

    python -m experiments.sim_vs_measured [--topology cpu4] [--random 14] [--rounds 7]

Plans: the optimizer's plan, the five named strategies and `--random` random plans (random
decomposition and device order per op, seeded), so times spread widely. Each is lowered,
simulated on the topology, and timed on a gloo pool: weights stay resident, every timed run
starts after a p2p barrier and lasts until the slowest rank ends (job transport excluded);
one warm-up round, then `--rounds` rounds that run every plan once each (interleaved, so drift
hits all plans alike), median per plan. Prints both per plan and the Pearson r.

1-rank section: the same graph, fused (attention and RMSNorm kernels, `einsummable.fuse`),
lowered for one rank and run by the local executor and by a 1-rank gloo pool, against (a) eager
torch running the nn.Module forward (the yardstick) and (b) the reference evaluator of the
fused graph; `local_unfused` runs the spelled-out graph. Ratios > 1 mean the program is slower.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time

import torch

from einsummable.backend.lowering import lower
from einsummable.planning.placement import INPUT_PREFIX, input_op, place, random_choice
from einsummable.frontend.reference import evaluate
from einsummable.backend.runtime.pool import Pools
from einsummable.backend.runtime.workers import threads_per_rank
from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate
from einsummable.topology import load_topology, synthetic

NAMED = ("data-parallel", "fsdp", "megatron-tp", "megatron-tp-sp", "ulysses")
# The bar for absolute agreement: simulated time within this fraction of measured.
ABS_TOLERANCE = 0.25


def header(argv) -> str:
    cmd = "python -m experiments.sim_vs_measured " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return (f"# command: {cmd.strip()}\n# machine: {platform.machine()}, nproc {os.cpu_count()}, "
            f"torch {torch.__version__}, python {platform.python_version()}\n# date: {stamp}")


def tiny(batch: int, seq: int, fused: bool = False):
    from einsummable.frontend.fuse import fuse
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, (x,) = preset("llama-tiny", batch=batch, seq=seq)
    g = llama_block_graph(module.config, batch, seq)
    g = fuse(g) if fused else g
    return module, x, g, {"x": x, **{k: v.detach() for k, v in module.named_parameters()}}


def random_plan(g, n, seed):
    return random_choice(g, n, random.Random(seed))


def plans(g, topo, n_random: int) -> dict[str, object]:
    """name -> something `lower` accepts (a Plan, or a choice for graph g on topo)."""
    from einsummable.optimizer.api import named_plan, optimize
    out: dict[str, object] = {"optimized": optimize(g, topo, time_limit_s=20)}
    for name in NAMED:
        out[name] = named_plan(g, topo, name)
    for seed in range(n_random):
        out[f"random{seed}"] = random_plan(g, topo.world_size, seed)
    return out


def pearson(a, b) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a) ** 0.5
    vb = sum((y - mb) ** 2 for y in b) ** 0.5
    return cov / (va * vb)


def interleaved(fns: dict[str, callable], rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per function over `rounds` rounds that call each function once."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    got: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            got[k].append(fn())
    return {k: statistics.median(v) for k, v in got.items()}


def wall(fn):
    def timed() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed


def sim_vs_measured(args, topo) -> float:
    module, x, g, ins = tiny(args.batch, args.seq)
    n = topo.world_size
    lows = {}
    for name, p in plans(g, topo, args.random).items():
        lows[name] = lower(p) if hasattr(p, "graph") else lower(g, p, topo)
    sims = {k: simulate(low, topology=topo).time_s for k, low in lows.items()}
    pools = Pools()
    try:
        pool = pools.get("gloo", n)
        meas = interleaved({k: (lambda low=low: pool.time(low, ins)) for k, low in lows.items()},
                           args.rounds)
    finally:
        pools.close()
    print(f"llama-tiny b{args.batch} s{args.seq} on {topo.name} ({n} gloo ranks, "
          f"{threads_per_rank(n)} thread(s) each); median of {args.rounds} interleaved rounds")
    print(f"{'plan':>16} {'instrs':>7} {'simulated_ms':>13} {'measured_ms':>12} {'sim/meas':>9}")
    for k, low in lows.items():
        ni = sum(len(p.instrs) for p in low.programs)
        print(f"{k:>16} {ni:7d} {sims[k] * 1e3:13.3f} {meas[k] * 1e3:12.3f} "
              f"{sims[k] / meas[k]:9.3f}")
    r = pearson(list(sims.values()), list(meas.values()))
    print(f"pearson r = {r:.3f} over {len(lows)} plans (1 optimized, {len(NAMED)} named, "
          f"{args.random} random)")
    ratios = sorted(sims[k] / meas[k] for k in lows)
    within = sum(abs(q - 1.0) <= ABS_TOLERANCE for q in ratios)
    print(f"simulated / measured: median {statistics.median(ratios):.3f}, range "
          f"{ratios[0]:.3f}-{ratios[-1]:.3f}; within {ABS_TOLERANCE:.0%}: {within} of "
          f"{len(ratios)} plans")
    return r


def _one_rank_low(g):
    ch = {op.name: place(op, {}, [0]) for op in g.ops}
    ch.update({INPUT_PREFIX + t.name: place(input_op(t), {}, [0]) for t in g.inputs})
    return lower(g, ch, synthetic(1))


def one_rank(args) -> None:
    """1-rank program vs eager torch of the same model at a few sizes."""
    torch.set_num_threads(threads_per_rank(1))
    rounds = args.rounds * 3
    print(f"\n1-rank program vs eager torch ({torch.get_num_threads()} threads here and in the "
          f"gloo worker); median of {rounds} interleaved rounds")
    print(f"{'size':>12} {'module_ms':>10} {'reference_ms':>13} {'local_ms':>9} {'gloo1_ms':>9}"
          f" {'unfused_ms':>11} {'local/module':>13} {'gloo1/module':>13} {'local/reference':>16}"
          f" {'unfused/module':>15}")
    pools = Pools()
    try:
        pool = pools.get("gloo", 1)
        for batch, seq in args.sizes:
            module, x, g, ins = tiny(batch, seq, fused=True)
            low = _one_rank_low(g)
            plain = _one_rank_low(tiny(batch, seq)[2])
            consts: dict = {}  # constant blocks (masks, rotary tables) generated once per plan
            plain_consts: dict = {}
            with torch.no_grad():
                fns = {"module": wall(lambda: module(x)), "reference": wall(lambda: evaluate(g, ins)),
                       "local": wall(lambda: run_local(low, ins, consts=consts)),
                       "gloo1": lambda: pool.time(low, ins),
                       "unfused": wall(lambda: run_local(plain, ins, consts=plain_consts))}
                t = interleaved(fns, rounds, warmup=2)
            print(f"{f'b{batch} s{seq}':>12} {t['module'] * 1e3:10.3f} {t['reference'] * 1e3:13.3f}"
                  f" {t['local'] * 1e3:9.3f} {t['gloo1'] * 1e3:9.3f} {t['unfused'] * 1e3:11.3f} "
                  f"{t['local'] / t['module']:13.3f} {t['gloo1'] / t['module']:13.3f} "
                  f"{t['local'] / t['reference']:16.3f} {t['unfused'] / t['module']:15.3f}")
    finally:
        pools.close()


def _size(text: str) -> tuple[int, int]:
    b, s = text.lower().split("x")
    return int(b), int(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="cpu4")
    ap.add_argument("--random", type=int, default=14, help="random plans besides the named ones")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--sizes", type=_size, nargs="*", default=[(4, 64), (8, 128), (8, 256), (4, 512)],
                    help="BxS sizes of the 1-rank comparison")
    ap.add_argument("--skip-sim", action="store_true")
    ap.add_argument("--skip-one-rank", action="store_true")
    args = ap.parse_args(argv)
    print(header(argv))
    if not args.skip_sim:
        sim_vs_measured(args, load_topology(args.topology))
    if not args.skip_one_rank:
        one_rank(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
