"""One runner per config `kind`: blocks (simulated or measured), random_plans, exchange,
matrix_chains, training (`training_bench.py`). Each returns rows, extra result fields, and the table to print."""
from __future__ import annotations

import dataclasses
import functools
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable

from einsummable.errors import EinsummableError
from einsummable.optimizer.peak import peak_bytes
from einsummable.topology import load_topology

from einsummable.backend.runtime.simulator import simulate as simulate_choice

from . import cluster_baselines
from . import conv_spatial as conv_spatial_bench
from . import model_families as model_families_bench
from . import einsummable_system as es_sys
from . import harness, plan_summary, simulated, training_bench
from .cpu_topologies import cpu_topology
from .harness import Progress, Row
from .systems import vllm_available
from .unavailable import Unavailable
from .workloads import Workload


@dataclass(frozen=True)
class RunResult:
    rows: list[Row]
    extra: dict = field(default_factory=dict)
    table: str = ""


def _workloads(cfg: dict) -> list[Workload]:
    return [Workload.from_dict(w, cfg.get("dtype", "float32")) for w in cfg["workloads"]]


def _vllm_reason(where: str) -> str:
    if not vllm_available():
        return "vLLM is not installed"
    return f"vLLM is installed but runs only on CUDA GPUs; not {where}"


def plan_record(plan, sim=None) -> dict:
    """What the figures need about a plan: split modes per op and the traffic it makes."""
    rec: dict = {"json": plan.to_json(), "explain": es_sys.explain(plan, strategies=False)}
    choice = plan.chosen
    graph = plan.graph
    if graph is not None:
        priced = es_sys.plan_costs(plan)
        by_role = plan_summary.op_splits(plan)
        rec["ops"] = [{"op": op.name, "einsum": op.einsum,
                       "split": str(choice[op.name]) if op.name in choice else "?",
                       "split_roles": by_role.get(op.name, "view"),
                       "parts": dict(choice[op.name].parts) if op.name in choice else {},
                       "compute_s": priced[op.name].compute_s,
                       "exchange_s": priced[op.name].exchange_s,
                       "bytes_in": priced[op.name].nbytes}
                      for op in graph.ops]
        rec["world"] = plan.topology.world_size
    if sim is not None:
        rec["link_bytes"] = [[a, b, n] for (a, b), n in sorted(sim.link_bytes.items())]
        rec["predicted_s"] = sim.time_s
    return rec


# ----------------------------------------------------------------------------- simulated blocks

def _einsummable_sim_row(cfg, w: Workload, graph, topo, floor_s: float,
                         plans: dict) -> Row:
    opt = es_sys.optimize(graph, topo, weights=cfg.get("weights", "sharded"),
                          steady_state=cfg.get("steady_state", True),
                          select=cfg.get("select", True), **cfg.get("optimize", {}))
    sim = es_sys.simulate(opt.plan)
    plans[w.name] = plan_record(opt.plan, sim)
    plans[w.name]["summary"] = plan_summary.describe(opt.plan)
    # a block in a stack (steady state), as the FSDP baseline with prefetch is costed
    block_s = es_sys.block_seconds(opt.plan)
    # the fullest device by the memory model (every layer's weights where `layers` says so)
    peak = max(p.bytes for p in peak_bytes(opt.plan))
    cap = min(d.mem_bytes for d in opt.plan.topology.devices)
    plans[w.name]["peak_bytes"] = peak
    return Row(cfg["name"], w.name, "einsummable", topo.world_size, w.tokens, block_s,
               model_s=getattr(opt.plan, "objective_s", None), floor_s=floor_s,
               note=f"{es_sys.chosen_label(opt.plan)}, a block in a stack; objective "
                    f"{opt.plan.objective_s * 1e3:.3f} ms, gap {opt.plan.gap or 0:.1%}; "
                    f"plan {opt.solve_wall_s:.1f} s; peak {peak / 1e9:.1f} of "
                    f"{cap / 1e9:.0f} GB per device"
                    + (f" ({opt.plan.options.layers} layers' weights)"
                       if opt.plan.options.layers > 1 else ""),
               extra={"solve_s": opt.solve_wall_s, "bound_s": getattr(opt.plan, "bound_s", None),
                      "peak_bytes": peak})


def simulated_blocks(cfg: dict, stream=None) -> RunResult:
    """Every workload on the config's topology, or on each of its `topologies` (a row's world
    size tells them apart; plans and layouts are keyed workload@topology then)."""
    topos = [load_topology(t) for t in cfg.get("topologies") or [cfg["topology"]]]
    workloads = _workloads(cfg)
    systems = cfg["systems"]
    progress = Progress(len(topos) * len(workloads) * len(systems), cfg["name"], stream)
    rows: list[Row] = []
    plans: dict = {}
    layouts: dict[str, str] = {}
    for topo, w in ((t, w) for t in topos for w in workloads):
        try:
            graph = es_sys.graph_for(w)
        except Unavailable as e:
            for s in systems:
                rows.append(Row(cfg["name"], w.name, s, topo.world_size, w.tokens,
                                unavailable=f"no graph: {e}"))
                progress.step(f"{w.name} {s}")
            continue
        floor_s = simulated.compute_floor(graph, topo)
        mine: dict = {}
        here: list[Row] = []
        for s in systems:
            progress.step(f"{w.name} {s} on {topo.name}")
            here.append(_sim_row(cfg, s, w, graph, topo, floor_s, mine))
        here.append(Row(cfg["name"], w.name, "floor", topo.world_size, w.tokens, floor_s,
                        floor_s=floor_s, note="roofline of 1/N of every op + one launch per op"))
        # several machines in one run: each row names its own, so that two machines of one
        # world size are compared apart (`Row.column`)
        rows += [dataclasses.replace(r, machine=topo.name) for r in here] if len(topos) > 1 \
            else here
        at = "" if len(topos) == 1 else f"@{topo.name}"
        plans.update({k + at: v for k, v in mine.items()})
        layouts.update({k + at: v for k, v in _layout_lines(w, graph, topo, mine, systems).items()})
    text = _table(cfg, rows, f"{cfg['name']}: simulated on {', '.join(t.name for t in topos)}")
    if layouts:
        text += "\n\nwhat each plan splits (mode role, extent / parts):\n" + "\n".join(
            f"  {k}: {v}" for k, v in layouts.items())
    return RunResult(rows, {"plans": plans, "layouts": layouts}, text)


def _layout_lines(w: Workload, graph, topo, plans: dict, systems) -> dict[str, str]:
    """The optimized plan's splits, and those of the sequence-parallel baselines beside it."""
    out = {}
    if w.name in plans and "summary" in plans[w.name]:
        out[f"{w.name} einsummable"] = plans[w.name]["summary"]
    for s in systems:
        if s in ("ulysses", "ring-attention"):
            try:
                named = es_sys.named_plan(graph, topo, simulated.NAMED_LAYOUT[s])
                out[f"{w.name} {s}"] = plan_summary.describe(named)
            except Exception as e:  # a missing piece costs this line only
                out[f"{w.name} {s}"] = f"unavailable: {type(e).__name__}: {e}"
    return out


def _sim_row(cfg, s: str, w: Workload, graph, topo, floor_s: float, plans: dict) -> Row:
    base = dict(config=cfg["name"], workload=w.name, system=s, world=topo.world_size,
                tokens=w.tokens)
    try:
        if s == "einsummable":
            return _einsummable_sim_row(cfg, w, graph, topo, floor_s, plans)
        if s == "vllm":
            return Row(**base, unavailable=_vllm_reason("simulated"))
        if s in cluster_baselines.CLUSTER_SYSTEMS:
            bt = cluster_baselines.simulate_cluster(s, w, topo, cfg.get("steady_state", True),
                                                    cfg.get("model_layers"))
        else:
            bt = simulated.simulate_baseline(s, graph, topo, cfg.get("weights", "sharded"),
                                             cfg.get("steady_state", True))
        return Row(**base, time_s=bt.time_s, floor_s=floor_s, note=bt.note,
                   extra={"compute_s": bt.compute_s, "comm_s": bt.comm_s,
                          "gather_s": bt.gather_s, "at_peak_s": bt.at_peak_s,
                          "simulated": True})
    except Unavailable as e:
        return Row(**base, unavailable=str(e))
    except Exception as e:  # a library error on one row must not lose the others
        return Row(**base, unavailable=f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}")


# ------------------------------------------------------------------------------ measured blocks

# Yardsticks measured in every run: 1/N of the work per rank, nothing to communicate.
FLOORS = ("floor", "floor-fused")


def measured_blocks(cfg: dict, stream=None) -> RunResult:
    from .measure import THREADS_PER_RANK, MeasureRequest, measure
    workloads = _workloads(cfg)
    systems = cfg["systems"]
    worlds = cfg.get("world_sizes", [4])
    progress = Progress(len(workloads) * len(worlds), cfg["name"], stream)
    rows: list[Row] = []
    plans: dict = {}
    for world in worlds:
        topo = cpu_topology(cfg.get("topology", "cpu4"), world, cfg.get("topology_by_world"))
        for w in workloads:
            progress.step(f"{w.name} on {world} ranks")
            reasons: dict[str, str] = {}
            payload: dict[str, str] = {}
            if "vllm" in systems:
                reasons["vllm"] = _vllm_reason("on CPU gloo ranks")
            predicted = _predictions(cfg, w, topo, systems, reasons, payload, plans)
            run = [s for s in systems if s not in reasons] + list(FLOORS)
            timings = measure(MeasureRequest(w, tuple(run), world, cfg.get("warmup", 2),
                                             cfg.get("repeats", 10), cfg.get("weights", "sharded"),
                                             cfg.get("timeout_s", 600),
                                             tuple(payload.items())))
            # The floor is the faster of the module's kernels and einsummable's own.
            floor_s = min((timings[f].median_s for f in FLOORS if timings[f].median_s),
                          default=None)
            for s in systems + list(FLOORS):
                if s in reasons:
                    rows.append(Row(cfg["name"], w.name, s, world, w.tokens, unavailable=reasons[s]))
                    continue
                t = timings[s]
                chosen = plans.get(f"{w.name}@{world}", {}).get("chosen")
                note = f"{t.note}; chosen: {chosen}" if s == "einsummable" and chosen else t.note
                rows.append(Row(cfg["name"], w.name, s, world, w.tokens, t.median_s, t.spread_s,
                                t.p25_s, t.p75_s, floor_s=floor_s, max_abs_err=t.max_abs_err,
                                note=note, unavailable=t.error,
                                extra={"samples_s": list(t.samples_s),
                                       "predicted_s": predicted.get(s)}))
    extra = {"plans": plans, "threads_per_rank": THREADS_PER_RANK,
             "protocol": "gloo on loopback; time inside ranks from a barrier to the output; "
                         "warm-up then interleaved rounds in rotating order; median over rounds "
                         "of the slowest rank; spread = interquartile range"}
    title = (f"{cfg['name']}: measured, gloo ranks on this machine "
             f"({THREADS_PER_RANK} torch thread per rank)")
    return RunResult(rows, extra, _table(cfg, rows, title))


def _predictions(cfg, w: Workload, topo, systems, reasons: dict, payload: dict,
                 plans: dict) -> dict[str, float]:
    """Optimize the einsummable plan for this run (its JSON goes to the ranks) and predict
    every system on the same topology, for the predicted-against-measured figure."""
    predicted: dict[str, float] = {}
    try:
        graph = es_sys.graph_for(w)
    except Unavailable as e:
        reasons.setdefault("einsummable", str(e))
        return predicted
    if "einsummable" in systems:
        try:
            opt = es_sys.optimize(graph, topo, weights=cfg.get("weights", "sharded"),
                                  steady_state=cfg.get("steady_state", True),
                                  select=cfg.get("select", True), **cfg.get("optimize", {}))
            sim = es_sys.simulate(opt.plan)
            payload["einsummable"] = opt.plan.to_json()
            plans[f"{w.name}@{topo.world_size}"] = {**plan_record(opt.plan, sim),
                                                    "chosen": es_sys.chosen_label(opt.plan)}
            predicted["einsummable"] = sim.time_s
        except Unavailable as e:
            reasons["einsummable"] = str(e)
    for s in systems:
        if s in simulated.NAMED_LAYOUT or s == "pytorch":
            predicted[s] = simulated.simulate_baseline(s, graph, topo,
                                                       cfg.get("weights", "sharded"),
                                                       cfg.get("steady_state", True)).time_s
    return predicted


def blocks(cfg: dict, stream=None) -> RunResult:
    if cfg.get("mode", "simulated") == "measured":
        return measured_blocks(cfg, stream)
    return simulated_blocks(cfg, stream)


# -------------------------------------------------------------------------------- random plans

def random_plans(cfg: dict, stream=None) -> RunResult:
    """Uniformly random candidate per op (and per input layout) against the optimized plan,
    every one timed by the same simulator the same way: the block's output left where each
    plan computes it (resident, the steady state), as `einsummable_system.simulate` does."""
    from einsummable.planning.candidates import graph_candidates
    topo = load_topology(cfg["topology"])
    w = _workloads(cfg)[0]
    n = int(cfg.get("samples", 100))
    progress = Progress(n + 1, cfg["name"], stream)
    rng = random.Random(int(cfg.get("seed", 0)))
    rows: list[Row] = []
    graph = es_sys.graph_for(w)
    floor_s = simulated.compute_floor(graph, topo)
    extra: dict = {"workload": w.to_dict(), "floor_s": floor_s}
    try:
        opt = es_sys.optimize(graph, topo, weights=cfg.get("weights", "sharded"),
                              steady_state=cfg.get("steady_state", True), **cfg.get("optimize", {}))
        sim = es_sys.simulate(opt.plan)
        rows.append(Row(cfg["name"], w.name, "einsummable", topo.world_size, w.tokens, sim.time_s,
                        model_s=getattr(opt.plan, "objective_s", None), floor_s=floor_s,
                        note="optimized"))
        extra["plans"] = {w.name: plan_record(opt.plan, sim)}
        optimized_s = sim.time_s
    except Unavailable as e:
        rows.append(Row(cfg["name"], w.name, "einsummable", topo.world_size, w.tokens,
                        unavailable=str(e)))
        optimized_s = None
    progress.step("optimized")
    cands = graph_candidates(graph, topo, weights=cfg.get("weights", "sharded"))
    resident = dataclasses.replace(graph, outputs=())
    times: list[float] = []
    for i in range(n):
        choice = {k: rng.choice(oc.cands) for k, oc in cands.items()}
        t = simulate_choice(resident, choice, topo).time_s
        times.append(t)
        progress.step(f"random plan {i + 1}")
    med = statistics.median(times)
    rows.append(Row(cfg["name"], w.name, "random (median)", topo.world_size, w.tokens, med,
                    floor_s=floor_s, note=f"median of {n} uniformly random plans, output "
                                          "resident as the optimized plan's"))
    extra.update({"random_s": times, "optimized_s": optimized_s, "output": "resident",
                  "median_ratio": med / optimized_s if optimized_s else None,
                  "fraction_within_10pct": (sum(t <= 1.1 * optimized_s for t in times) / n
                                            if optimized_s else None)})
    table = _table(cfg, rows, f"{cfg['name']}: {n} random plans vs optimized on {topo.name}",
                   reference="einsummable")
    if optimized_s:
        table += (f"\nmedian random / optimized = {med / optimized_s:.2f}x; best random "
                  f"{min(times) / optimized_s:.2f}x; worst {max(times) / optimized_s:.2f}x")
    return RunResult(rows, extra, table)


# ------------------------------------------------------------------------------------ exchange

# The exchange table's rows: the plan optimized for its exchange; the plan re-optimized for the
# naive exchange and lowered with it (the fair comparison); the first plan lowered naively
# (the figure the table showed before, kept beside it).
NAIVE = "naive-exchange"
NAIVE_SAME_PLAN = "naive (same plan)"


def exchange(cfg: dict, stream=None) -> RunResult:
    """Per workload, the optimized exchange against the naive one (owner sends to every
    reader), each on the plan the optimizer picks for it, and the old same-plan figure."""
    from .chains import chain_graph
    topo = load_topology(cfg["topology"])
    entries = cfg["workloads"]
    progress = Progress(len(entries), cfg["name"], stream)
    rows: list[Row] = []
    plans: dict = {}
    for entry in entries:
        name = entry["name"]
        progress.step(name)
        row = functools.partial(Row, cfg["name"], name, world=topo.world_size)
        try:
            if "chain" in entry:
                graph, tokens = chain_graph(entry["chain"], entry["shapes"], cfg.get("dtype", "float16")), None
            else:
                w = Workload.from_dict(entry, cfg.get("dtype", "float16"))
                graph, tokens = es_sys.graph_for(w), w.tokens
            # A chain is not a stackable block: there is no steady state to keep.
            steady = cfg.get("steady_state", True) and "chain" not in entry
            options = {"weights": cfg.get("weights", "sharded"), "steady_state": steady,
                       **cfg.get("optimize", {})}
            opt = es_sys.optimize(graph, topo, **options)
            best = es_sys.simulate(opt.plan, mode="optimized")
            same_plan = es_sys.simulate(opt.plan, mode="naive")
        except (Unavailable, EinsummableError) as e:
            for s in ("einsummable", NAIVE, NAIVE_SAME_PLAN):
                rows.append(row(s, unavailable=str(e).splitlines()[0]))
            continue
        plans[name] = plan_record(opt.plan, best)
        floor_s = simulated.compute_floor(graph, topo)
        group = entry.get("group", "transformer" if "chain" not in entry else "chain")
        rows.append(row("einsummable", tokens=tokens, time_s=best.time_s, floor_s=floor_s,
                        note=f"optimized exchange (trees, relays); solve {opt.solve_wall_s:.1f} s",
                        extra={"group": group}))
        try:
            naive_opt = es_sys.optimize(graph, topo, exchange_mode="naive", **options)
            naive = es_sys.simulate(naive_opt.plan, mode="naive")
            plans[f"{name} naive"] = plan_record(naive_opt.plan, naive)
            rows.append(row(NAIVE, tokens=tokens, time_s=naive.time_s, floor_s=floor_s,
                            note="plan re-optimized for the naive exchange; owner sends to "
                                 f"every reader; solve {naive_opt.solve_wall_s:.1f} s",
                            extra={"group": group}))
        except (Unavailable, EinsummableError) as e:
            rows.append(row(NAIVE, tokens=tokens, unavailable=str(e).splitlines()[0]))
        rows.append(row(NAIVE_SAME_PLAN, tokens=tokens, time_s=same_plan.time_s,
                        floor_s=floor_s, note="the optimized exchange's plan lowered naively "
                                              "(the old figure)", extra={"group": group}))
    gains = _exchange_gains(rows)
    table = _table(cfg, rows, f"{cfg['name']}: optimized vs naive exchange on {topo.name}",
                   reference=NAIVE)
    for g, v in sorted(gains.items()):
        if v["geomean_naive_over_optimized"]:
            table += (f"\n{g}: naive (re-optimized plan) / optimized geomean "
                      f"{v['geomean_naive_over_optimized']:.3f}, max "
                      f"{v['max_naive_over_optimized']:.3f}")
        if v["geomean_same_plan_over_optimized"]:
            table += (f"\n{g}: naive (same plan, old figure) / optimized geomean "
                      f"{v['geomean_same_plan_over_optimized']:.3f}, max "
                      f"{v['max_same_plan_over_optimized']:.3f}")
    return RunResult(rows, {"plans": plans, "gains": gains}, table)


def _exchange_gains(rows: list[Row]) -> dict:
    """Per group: geomean and max of naive time over optimized, re-optimized and same plan."""
    ours = {r.workload: r for r in rows if r.system == "einsummable" and r.ok}
    gains: dict = {}
    for group in sorted({r.extra.get("group") for r in ours.values()}):
        entry = {}
        for system, key in ((NAIVE, ""), (NAIVE_SAME_PLAN, "same_plan_")):
            ratios = [r.time_s / ours[r.workload].time_s for r in rows
                      if r.system == system and r.ok and r.workload in ours
                      and ours[r.workload].extra.get("group") == group]
            label = "naive_" if not key else key
            entry[f"geomean_{label}over_optimized"] = harness.geomean(ratios)
            entry[f"max_{label}over_optimized"] = max(ratios) if ratios else None
        gains[group] = entry
    return gains


# ------------------------------------------------------------------------------- matrix chains

def matrix_chains(cfg: dict, stream=None) -> RunResult:
    from .chains import chain_flops, chain_graph
    topo = load_topology(cfg["topology"])
    progress = Progress(len(cfg["chains"]), cfg["name"], stream)
    rows: list[Row] = []
    plans: dict = {}
    for entry in cfg["chains"]:
        name = entry["name"]
        progress.step(name)
        graph = chain_graph(entry["chain"], entry["shapes"], cfg.get("dtype", "float16"))
        floor_s = simulated.compute_floor(graph, topo)
        note = f"{entry['chain']}  {chain_flops(entry['chain'], entry['shapes']) / 1e12:.2f} TFLOP"
        try:
            bt = simulated.simulate_baseline("pytorch", graph, topo)
            rows.append(Row(cfg["name"], name, "pytorch", topo.world_size, time_s=bt.time_s,
                            floor_s=floor_s, note="one device"))
        except Unavailable as e:
            rows.append(Row(cfg["name"], name, "pytorch", topo.world_size, unavailable=str(e)))
        try:
            opt = es_sys.optimize(graph, topo, weights=cfg.get("weights", "sharded"),
                                  steady_state=False, **cfg.get("optimize", {}))
            sim = es_sys.simulate(opt.plan)
            plans[name] = plan_record(opt.plan, sim)
            rows.append(Row(cfg["name"], name, "einsummable", topo.world_size, time_s=sim.time_s,
                            model_s=getattr(opt.plan, "objective_s", None), floor_s=floor_s,
                            note=note))
        except Unavailable as e:
            rows.append(Row(cfg["name"], name, "einsummable", topo.world_size, unavailable=str(e)))
        rows.append(Row(cfg["name"], name, "floor", topo.world_size, time_s=floor_s,
                        floor_s=floor_s, note="roofline of 1/N of every op + one launch per op"))
    return RunResult(rows, {"plans": plans},
                     _table(cfg, rows, f"{cfg['name']}: matrix chains on {topo.name}",
                            reference="pytorch"))


def model_families(cfg: dict, stream=None) -> RunResult:
    """Model families captured from their libraries and planned (`model_families.py`)."""
    return RunResult(*model_families_bench.run(cfg, stream))


def conv_spatial(cfg: dict, stream=None) -> RunResult:
    """Convolution stacks at batch 1: the optimum beside forced spatial and channel splits."""
    return RunResult(*conv_spatial_bench.run(cfg, stream))


def _table(cfg: dict, rows: list[Row], title: str, reference: str | None = None) -> str:
    reference = reference or cfg.get("reference", harness.REFERENCE_SYSTEM)
    text = harness.format_table(rows, reference, title)
    text += "\n\n" + harness.format_summary(harness.summarize(rows, reference), reference)
    pub = cfg.get("published")
    head = harness.format_headline(harness.headline(rows, reference), reference,
                                   (pub or {}).get("einsummable_over_pytorch")
                                   if reference == harness.REFERENCE_SYSTEM else None)
    if head:
        text += "\n\n" + head
    if pub:
        text += "\n\npublished (" + str(pub.get("source", "")) + "): " + "; ".join(
            f"{k} {v}" for k, v in pub.items() if k != "source")
    return text


def exchange_patterns(cfg: dict, stream=None) -> RunResult:
    if cfg.get("mode", "simulated") == "measured":
        from . import gloo_patterns
        return RunResult(*gloo_patterns.runner(cfg, stream))
    from . import patterns
    return RunResult(*patterns.runner(cfg, stream))


RUNNERS: dict[str, Callable[[dict, object], RunResult]] = {
    "blocks": blocks, "random_plans": random_plans, "exchange": exchange,
    "matrix_chains": matrix_chains, "exchange_patterns": exchange_patterns,
    "conv_spatial": conv_spatial,
    "model_families": model_families,
    "training": lambda cfg, stream=None: RunResult(*training_bench.run(cfg, stream)),
}
