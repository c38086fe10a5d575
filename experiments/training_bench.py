"""`einsummable-bench training`: one training step of a LLaMA block (forward, backward,
SGD or AdamW update), einsummable's plan against hand-written DDP, FSDP and Megatron TP(+SP).

Two tables in one results document:
- measured: the config's `workloads` on `world_sizes` gloo ranks of this machine
  (`training_measure.py`: the protocol of the measured forward benches, every system checked
  against torch.optim on one device before it is timed); einsummable runs the plan
  `compile_train` would choose (`training_einsummable.py`);
- simulated: the config's `simulated_workloads` on `simulated_topology`: einsummable's
  training plan as `python -m experiments.training_plan` makes it (the MIP's optimum, its
  program simulated; its objective beside it), the baselines as `training_simulated.py`
  costs them.
Each table's headline is einsummable over the best baseline of its row.
"""
from __future__ import annotations

from einsummable.backend.runtime.simulator import simulate
from einsummable.frontend.optim import Hyper
from einsummable.topology import load_topology

from . import einsummable_system as es_sys
from . import harness
from .cpu_topologies import cpu_topology
from .harness import Progress, Row
from .training_einsummable import plan_step
from .training_measure import TrainRequest, inputs, measure_training
from .training_plan import plan_training, training_graph
from .training_simulated import simulate_training
from .workloads import Workload

PROTOCOL = ("gloo on loopback; one torch thread per rank; time inside ranks from a barrier "
            "to the end of the step; warm-up then interleaved rounds in rotating order; "
            "median over rounds of the slowest rank; spread = interquartile range")


def _hyper(cfg: dict) -> Hyper:
    return Hyper(cfg.get("optimizer", "adamw"), float(cfg.get("lr", 1e-3)),
                 float(cfg.get("weight_decay", 0.0)))


def measured(cfg: dict, progress: Progress) -> tuple[list[Row], dict]:
    from .measure import THREADS_PER_RANK
    hyper = _hyper(cfg)
    rows: list[Row] = []
    plans: dict = {}
    systems = tuple(cfg["systems"])
    for world in cfg.get("world_sizes", [2]):
        topo = cpu_topology(cfg.get("topology", "cpu4"), world, cfg.get("topology_by_world"))
        for entry in cfg["workloads"]:
            w = Workload.from_dict(entry, cfg.get("dtype", "float32"))
            progress.step(f"{w.name} on {world} ranks")
            payload, predicted = (), None
            if "einsummable" in systems:
                block, x, y = inputs(w)
                plan = plan_step(block, x, y, hyper, topo, **cfg.get("optimize", {}))
                predicted = simulate(plan).time_s
                payload = (("einsummable", plan.to_json()),)
                plans[f"{w.name}@{world}"] = {"chosen": es_sys.chosen_label(plan),
                                              "objective_s": plan.objective_s,
                                              "predicted_s": predicted}
            got = measure_training(TrainRequest(
                w, systems, world, hyper, cfg.get("warmup", 2), cfg.get("repeats", 10),
                cfg.get("check_steps", 1), cfg.get("timeout_s", 600), payload))
            for s in systems:
                t = got[s]
                rows.append(Row(cfg["name"], w.name, s, world, w.tokens, t.median_s,
                                t.spread_s, t.p25_s, t.p75_s, max_abs_err=t.max_abs_err,
                                note=t.note, unavailable=t.error,
                                extra={"samples_s": list(t.samples_s), "measured": True,
                                       "predicted_s": predicted if s == "einsummable" else None,
                                       "max_rel_err_vs_torch_optim": t.max_abs_err}))
    return rows, {"plans": plans, "threads_per_rank": THREADS_PER_RANK, "protocol": PROTOCOL}


def simulated(cfg: dict, progress: Progress) -> tuple[list[Row], dict]:
    topo_name = cfg["simulated_topology"]
    topo = load_topology(topo_name)
    optimizer = cfg.get("optimizer", "adamw")
    dtype = cfg.get("simulated_dtype", "bfloat16")
    rows: list[Row] = []
    plans: dict = {}
    for entry in cfg["simulated_workloads"]:
        w = Workload.from_dict(entry, dtype)
        train = training_graph(w.model, w.batch, w.seq, dtype, optimizer)
        forward = es_sys.graph_for(w)
        for s in cfg["systems"]:
            progress.step(f"{w.name} {s} on {topo_name}")
            base = dict(config=cfg["name"], workload=w.name, system=s,
                        world=topo.world_size, tokens=w.tokens)
            if s == "einsummable":
                got = plan_training(w.model, topo_name, w.batch, w.seq, dtype, optimizer,
                                    cfg.get("time_limit_s"))
                plans[w.name] = got
                rows.append(Row(**base, time_s=got["simulated_ms"] / 1e3,
                                model_s=got["objective_ms"] / 1e3,
                                note=f"MIP optimum of the training graph ({got['ops']} ops), "
                                     f"its program simulated; objective "
                                     f"{got['objective_ms']:.3f} ms, gap {got['gap'] or 0:.1%}, "
                                     f"solved in {got['solve_s']:.1f} s",
                                extra={"simulated": True, **got}))
                continue
            t = simulate_training(s, train, forward, topo)
            rows.append(Row(**base, time_s=t.time_s, note=t.note,
                            extra={"simulated": True, "compute_s": t.compute_s,
                                   "comm_s": t.comm_s, "gather_s": t.gather_s,
                                   "at_peak_s": t.at_peak_s, "layout_s": t.layout_s}))
    return rows, {"simulated_plans": plans}


def run(cfg: dict, stream=None) -> tuple[list[Row], dict, str]:
    n_measured = len(cfg.get("world_sizes", [2])) * len(cfg.get("workloads", []))
    n_sim = len(cfg.get("simulated_workloads", [])) * len(cfg["systems"])
    progress = Progress(n_measured + n_sim, cfg["name"], stream)
    rows, extra = measured(cfg, progress) if cfg.get("workloads") else ([], {})
    sim_rows, sim_extra = simulated(cfg, progress) if cfg.get("simulated_workloads") else ([], {})
    reference = cfg.get("reference", harness.REFERENCE_SYSTEM)
    text = ""
    for these, title in ((rows, f"{cfg['name']}: measured training steps, gloo ranks on this "
                                "machine"),
                         (sim_rows, f"{cfg['name']}: simulated training steps on "
                                    f"{cfg.get('simulated_topology')}")):
        if not these:
            continue
        text += ("\n\n" if text else "") + harness.format_table(these, reference, title)
        text += "\n\n" + harness.format_headline(harness.headline(these, reference), reference)
    return rows + sim_rows, {**extra, **sim_extra, "optimizer": cfg.get("optimizer", "adamw")}, text
