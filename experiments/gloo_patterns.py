"""Collective patterns measured on gloo ranks: einsummable's point-to-point exchange programs
against gloo's own collectives (`einsummable-bench exchange_patterns_gloo`).

Each pattern is the one of `patterns.py` (a row-major [rows, 4096] float32 tensor of about
the given bytes among every rank), stated as a producer layout and its readers' needs:

    einsummable  the exchange synthesised for the cpu topology of that many ranks (cpu2,
                 cpu4), lowered as a plan lowers it (`lowering.lower_exchange`: messages
                 packed, parts landing in place), run by the gloo executor
                 (`runtime/dist.execute`), each rank ending when its needs are assembled;
    gloo         the collective a user would call for it, ending with each rank holding
                 what the pattern's needs say: all_gather_single, reduce_scatter_single
                 (all_reduce and the rank's slice where a build's gloo lacks it), all_reduce,
                 broadcast, all_to_all_single (after packing the rank's column blocks
                 contiguous, as einsummable's senders pack them).

The table shows, beside einsummable's measured time, the objective's price of the same
exchange on that topology (`predicted_s`). Partial sums: every rank holds the same tensor as its partial, so a correct sum is world
times it; both systems' results are checked once against that before timing. Timing follows
`measure.py`: spawned ranks, one thread each, warm-up passes, a barrier before every timed
pass, the two systems alternating, the slowest rank's time per round, the median over rounds
with the interquartile range. On this 2-core machine 2 ranks is the honest setting; 4 ranks
share 2 cores and are labelled oversubscribed.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .measure import percentile, run_ranks, time_rounds
from .patterns import PATTERNS, _size, geomean, pattern

# A rank's result agrees with the expected values within this (float32 sums, reordered).
CHECK_RTOL = 1e-5
# Topology whose exchange programs are synthesised, per world size.
TOPOLOGY = {2: "cpu2", 4: "cpu4"}
# The headline bar of the issue: einsummable within this factor of gloo's collective.
GLOO_RATIO = 1.2
# The single-tensor collectives under their torch 2.13 names (the older ones warn).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class Job:
    world: int
    patterns: tuple[str, ...]
    sizes: tuple[int, ...]
    warmup: int
    repeats: int


def _expected(kind: str, x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    rows, cols = x.shape
    mine = slice(rows * rank // world, rows * (rank + 1) // world)
    if kind == "all_gather" or kind == "broadcast":
        return x
    if kind == "reduce_scatter":
        return world * x[mine]
    if kind == "all_reduce":
        return world * x
    return x[:, cols * rank // world:cols * (rank + 1) // world]  # all_to_all


def _gloo_step(kind: str, x: torch.Tensor, rank: int, world: int):
    """(run, result): the gloo collective for the pattern, and where its answer lands."""
    rows, cols = x.shape
    mine = x[rows * rank // world:rows * (rank + 1) // world].contiguous()
    if kind == "all_gather":
        out = torch.empty_like(x)
        return (lambda: _ALL_GATHER(out, mine)), lambda: out
    if kind == "reduce_scatter":
        out = torch.empty_like(mine)
        try:
            _REDUCE_SCATTER(out, x.clone())
        except (RuntimeError, NotImplementedError, ValueError):  # gloo has none
            buf = x.clone()

            def run() -> None:
                buf.copy_(x)
                dist.all_reduce(buf)
                out.copy_(buf[rows * rank // world:rows * (rank + 1) // world])
            return run, lambda: out
        src = x.clone()

        def run() -> None:
            _REDUCE_SCATTER(out, src)
        return run, lambda: out
    if kind == "all_reduce":
        buf = x.clone()

        def run() -> None:
            buf.copy_(x)  # the sum of fresh partials each pass (einsummable reads its own)
            dist.all_reduce(buf)
        return run, lambda: buf
    if kind == "broadcast":
        buf = x.clone() if rank == 0 else torch.empty_like(x)
        return (lambda: dist.broadcast(buf, src=0)), lambda: buf
    out = torch.empty(rows, cols // world, dtype=x.dtype)

    def run() -> None:
        packed = torch.cat([mine[:, cols * j // world:cols * (j + 1) // world].reshape(-1)
                            for j in range(world)])
        dist.all_to_all_single(out.view(-1), packed)
    return run, lambda: out


def _einsummable_step(kind: str, x: torch.Tensor, rank: int, world: int):
    from einsummable.backend.lowering import lower_exchange
    from einsummable.backend.runtime.dist import execute, rank_blocks

    p = pattern(kind, world, x.numel() * x.element_size(), "float32")
    low = lower_exchange(p.info, p.produced, p.needs, p.agg, TOPOLOGY[world])
    blocks = rank_blocks(low, rank, {p.info.name: x})
    consts: dict = {}
    got: dict = {}

    def run() -> None:
        got.update(execute(low, rank, blocks, consts=consts))
    return run, (lambda: got[p.info.name]), len(low.programs[rank].instrs)


def _body(rank: int, job: Job) -> dict:
    out = {}
    for kind in job.patterns:
        for nbytes in job.sizes:
            p = pattern(kind, job.world, nbytes, "float32")
            g = torch.Generator().manual_seed(nbytes)
            x = torch.randn(p.info.shape, generator=g)
            mine_run, mine_out, instrs = _einsummable_step(kind, x, rank, job.world)
            gloo_run, gloo_out = _gloo_step(kind, x, rank, job.world)
            want = _expected(kind, x, rank, job.world)
            ok = []
            for run, result in ((mine_run, mine_out), (gloo_run, gloo_out)):
                run()
                ok.append(bool(torch.allclose(result(), want, rtol=CHECK_RTOL,
                                              atol=CHECK_RTOL * job.world)))
            flags = torch.tensor([float(not f) for f in ok])
            dist.all_reduce(flags)  # the harness may call collectives; the programs may not
            rounds = time_rounds({"einsummable": mine_run, "gloo": gloo_run}, job.warmup,
                                 job.repeats, job.world)
            out[f"{kind} {nbytes}"] = {
                "pattern": kind, "bytes": p.info.nbytes,
                "correct": {"einsummable": flags[0].item() == 0, "gloo": flags[1].item() == 0},
                "instructions": instrs,
                **{name: {"median_s": statistics.median(xs), "p25_s": percentile(xs, 0.25),
                          "p75_s": percentile(xs, 0.75)} for name, xs in rounds.items()}}
    return out


def measure_patterns(job: Job, timeout_s: float) -> dict:
    """Every pattern and size of `job`, measured on `job.world` gloo ranks (module
    docstring); raises RuntimeError where the ranks did not finish."""
    got, why, _ = run_ranks(_body, job, job.world, timeout_s,
                            f"exchange patterns on {job.world} gloo ranks")
    if got is None:
        raise RuntimeError(why)
    return got


def predicted_s(kind: str, world: int, nbytes: int) -> float:
    """The objective's price of the pattern's exchange on the ranks' topology
    (`timing.exchange_time` of what synthesis keeps), shown beside what it measured."""
    from einsummable.planning.exchange import synthesize
    from einsummable.planning.timing import exchange_time
    from einsummable.topology import load_topology
    topo = load_topology(TOPOLOGY[world])
    p = pattern(kind, world, nbytes, "float32")
    return exchange_time(synthesize(p.info, p.produced, p.needs, p.agg, topo), topo)


def runner(cfg: dict, stream=None) -> tuple[list, dict, str]:
    """The `exchange_patterns` config kind in `mode: measured`; (rows, extra fields, table)."""
    from .harness import Progress, Row
    kinds = tuple(cfg.get("patterns", PATTERNS))
    sizes = tuple(int(s) for s in cfg["sizes"])
    worlds = [int(w) for w in cfg.get("world_sizes", [2, 4])]
    progress = Progress(len(worlds), cfg["name"], stream)
    rows, lines, summary = [], [], {}
    for world in worlds:
        progress.step(f"{world} gloo ranks")
        over = " (oversubscribed: 4 ranks on 2 cores)" if world > 2 else ""
        found = measure_patterns(Job(world, kinds, sizes, int(cfg.get("warmup", 2)),
                                     int(cfg.get("repeats", 10))),
                                 float(cfg.get("timeout_s", 900)))
        lines.append(f"\n{world} gloo ranks{over}, {TOPOLOGY[world]} programs, measured "
                     "(median of interleaved rounds, the slowest rank's; p25-p75)")
        lines.append(f"{'pattern':15s} {'size':>9s} {'einsummable':>20s} {'predicted':>10s} "
                     f"{'gloo':>20s} {'ratio':>6s}  correct")
        ratios = []
        for key, r in found.items():
            mine, gloo = r["einsummable"], r["gloo"]
            ratio = mine["median_s"] / gloo["median_s"]
            ratios.append(ratio)
            predicted = predicted_s(r["pattern"], world, r["bytes"])
            name = f"{world} ranks {r['pattern']} {_size(r['bytes'])}"
            extra = {"pattern": r["pattern"], "bytes": r["bytes"], "world": world,
                     "oversubscribed": world > 2}
            for system in ("einsummable", "gloo"):
                t = r[system]
                rows.append(Row(cfg["name"], name, system, world, time_s=t["median_s"],
                                p25_s=t["p25_s"], p75_s=t["p75_s"],
                                model_s=predicted if system == "einsummable" else None,
                                note=("correct" if r["correct"][system] else "WRONG OUTPUT")
                                + over, extra=extra))
            span = lambda t: f"{t['median_s'] * 1e3:8.3f} ({t['p25_s'] * 1e3:.2f}-" \
                             f"{t['p75_s'] * 1e3:.2f})"  # noqa: E731
            lines.append(f"{r['pattern']:15s} {_size(r['bytes']):>9s} {span(mine):>20s} "
                         f"{predicted * 1e3:10.3f} {span(gloo):>20s} {ratio:6.2f}  "
                         f"{'yes' if all(r['correct'].values()) else 'NO'}")
        within = sum(x <= GLOO_RATIO for x in ratios)
        summary[world] = {"within_ratio": within, "rows": len(ratios),
                          "geomean_over_gloo": geomean(ratios)}
        lines.append(f"{world} ranks: within {GLOO_RATIO}x of gloo's collective in {within} of "
                     f"{len(ratios)} (geomean {geomean(ratios):.3f}){over}")
    return rows, {"summary": summary}, "\n".join(lines)
