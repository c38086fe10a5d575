"""Shared logic of `einsummable-bench`: configs, result rows, summaries, files, the table.

A config (experiments/configs/*.yaml) names a `kind` of experiment; `bench.py` maps kinds to
runners. Every runner returns `Row`s; a row is one (workload, world size, system) with a time
or with the reason it has none. Nothing here invents a number: a row without a measurement or
a prediction says "unavailable: <reason>".
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REFERENCE_SYSTEM = "pytorch-tp"
# The system every table is about, and the yardsticks that are not systems: neither is a
# baseline when a row's best baseline is picked.
OPTIMIZED_SYSTEM = "einsummable"
YARDSTICKS = ("floor", "floor-fused")


@dataclass(frozen=True)
class Row:
    """time_s: measured median or simulated prediction. model_s: the optimizer's cost-model
    objective of the same plan where there is one. floor_s: the workload's floor in the same
    run (measured) or model (simulated). spread_s: interquartile range of measured rounds.
    machine: the topology's name where one run covers several machines (two may have the
    same world size); empty otherwise."""

    config: str
    workload: str
    system: str
    world: int
    tokens: int | None = None
    time_s: float | None = None
    spread_s: float | None = None
    p25_s: float | None = None
    p75_s: float | None = None
    model_s: float | None = None
    floor_s: float | None = None
    max_abs_err: float | None = None
    note: str = ""
    unavailable: str | None = None
    extra: dict = field(default_factory=dict)
    machine: str = ""

    @property
    def ok(self) -> bool:
        return self.unavailable is None and self.time_s is not None

    @property
    def column(self) -> str:
        """The group a row's baselines are compared within: its world size, and its machine
        where the run names one ("16@a100x8x2")."""
        return f"{self.world}@{self.machine}" if self.machine else str(self.world)

    @property
    def key(self) -> tuple[str, str]:
        """(workload, column): the rows one headline ratio compares."""
        return self.workload, self.column

    def to_dict(self) -> dict:
        return asdict(self)


def load_config(path_or_name: str) -> dict:
    """A config by path, or by name under experiments/configs (with or without .yaml)."""
    p = Path(path_or_name)
    if not p.exists():
        p = CONFIG_DIR / (path_or_name if path_or_name.endswith(".yaml") else path_or_name + ".yaml")
    with open(p) as f:
        cfg = yaml.safe_load(f)
    cfg.setdefault("name", p.stem)
    cfg["_path"] = str(p)
    return cfg


def geomean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _columns(rows: Sequence[Row]) -> list[str]:
    """Row columns (`Row.column`) by world size, then machine name."""
    return [c for _, _, c in sorted({(r.world, r.machine, r.column) for r in rows})]


def summarize(rows: Sequence[Row], reference: str = REFERENCE_SYSTEM) -> dict:
    """Per column (world size, and machine where named) and system: geometric mean time, and
    the geometric mean of its per-workload ratio to `reference` and to the floor (over
    workloads where both exist)."""
    out: dict[str, Any] = {}
    for world in _columns(rows):
        here = [r for r in rows if r.column == world]
        ref = {r.workload: r.time_s for r in here if r.system == reference and r.ok}
        per: dict[str, Any] = {}
        for system in dict.fromkeys(r.system for r in here):
            mine = [r for r in here if r.system == system and r.ok]
            if not mine:
                continue
            vs_ref = [r.time_s / ref[r.workload] for r in mine if r.workload in ref]
            vs_floor = [r.time_s / r.floor_s for r in mine if r.floor_s]
            per[system] = {
                "geomean_s": geomean(r.time_s for r in mine),
                f"geomean_ratio_vs_{reference}": geomean(vs_ref),
                "geomean_ratio_vs_floor": geomean(vs_floor),
                "max_ratio_vs_floor": max(vs_floor) if vs_floor else None,
                "workloads": len(mine),
            }
        out[world] = per
    return out


def best_baselines(rows: Sequence[Row], at_peak: bool = False) -> dict[tuple[str, str], Row]:
    """Per (workload, column): the fastest baseline row (every system but the optimized one and
    the yardsticks). at_peak: rank simulated baselines by their time with collectives at the
    links' full rates (`extra["at_peak_s"]`) where they have one."""
    best: dict[tuple[str, str], Row] = {}
    for r in rows:
        if not r.ok or r.system == OPTIMIZED_SYSTEM or r.system in YARDSTICKS:
            continue
        key = r.key
        if key not in best or _time(r, at_peak) < _time(best[key], at_peak):
            best[key] = r
    return best


def _time(r: Row, at_peak: bool) -> float:
    return (r.extra.get("at_peak_s") or r.time_s) if at_peak else r.time_s


def headline(rows: Sequence[Row], reference: str = REFERENCE_SYSTEM) -> dict:
    """Per column (world size, and machine where named): the optimized plan's time over the best baseline of its row (geometric
    mean over workloads, and per workload with the baseline's name), beside its ratio to
    `reference`; where simulated baselines carry a time at the links' full rates, the same
    headline against those too."""
    out: dict[str, Any] = {}
    best, best_peak = best_baselines(rows), best_baselines(rows, at_peak=True)
    ours = {r.key: r for r in rows if r.system == OPTIMIZED_SYSTEM and r.ok}
    ref = {r.key: r.time_s for r in rows if r.system == reference and r.ok}
    for world in _columns(rows):
        keys = [k for k in ours if k[1] == world and k in best]
        if not keys:
            continue
        per = {k[0]: {"best": best[k].system, "best_s": best[k].time_s,
                      "ratio": ours[k].time_s / best[k].time_s} for k in keys}
        entry: dict[str, Any] = {
            "geomean_vs_best": geomean(v["ratio"] for v in per.values()),
            "per_workload": per,
            f"geomean_vs_{reference}": geomean(ours[k].time_s / ref[k] for k in keys if k in ref),
        }
        if any("at_peak_s" in r.extra for r in rows if r.column == world):
            entry["geomean_vs_best_at_peak"] = geomean(
                ours[k].time_s / _time(best_peak[k], True) for k in keys if k in best_peak)
        out[world] = entry
    return out


def format_headline(head: dict, reference: str = REFERENCE_SYSTEM,
                    published: float | None = None) -> str:
    """The headline lines under a table."""
    lines = []
    for world, h in head.items():
        names: dict[str, int] = {}
        for v in h["per_workload"].values():
            names[v["best"]] = names.get(v["best"], 0) + 1
        which = ", ".join(f"{n} {c}x" for n, c in names.items())
        ref = h.get(f"geomean_vs_{reference}")
        line = (f"headline N={world}: {OPTIMIZED_SYSTEM} / best baseline of its row "
                f"{h['geomean_vs_best']:.3f} (geomean; best: {which})")
        if ref is not None and reference != OPTIMIZED_SYSTEM:
            line += f"; / {reference} {ref:.3f}"
            if published is not None:
                line += f" (published {published})"
        lines.append(line)
        if h.get("geomean_vs_best_at_peak") is not None:
            lines.append(f"  with the baselines' collectives at the links' full rates: "
                         f"{h['geomean_vs_best_at_peak']:.3f}")
    return "\n".join(lines)


def machine_info() -> dict:
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpus": os.cpu_count()}


def write_results(name: str, payload: dict, rows: Sequence[Row],
                  out_dir: Path = RESULTS_DIR) -> tuple[Path, Path]:
    """<out_dir>/<name>.json (everything) and <name>.csv (the rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, cpath = out_dir / f"{name}.json", out_dir / f"{name}.csv"
    doc = {**payload, "rows": [r.to_dict() for r in rows]}
    jpath.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    cols = [f for f in Row.__dataclass_fields__ if f != "extra"]
    with open(cpath, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in cols])
    return jpath, cpath


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- presentation

class Progress:
    """A one-line text progress bar on stderr (nothing on stdout, so --json stays clean)."""

    def __init__(self, total: int, label: str, stream=None, width: int = 28) -> None:
        self.total, self.label, self.width, self.done = max(total, 1), label, width, 0
        self.stream = stream or sys.stderr

    def step(self, what: str) -> None:
        self.done += 1
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {what[:40]:<40}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def format_table(rows: Sequence[Row], reference: str = REFERENCE_SYSTEM,
                 title: str = "") -> str:
    """Rows grouped by world size and workload, with ratios to `reference` and to the floor."""
    lines = [title] if title else []
    head = (f"{'workload':<18} {'N':>2} {'system':<16} {'ms':>10} {'±IQR':>8} "
            f"{'/' + reference:>12} {'/floor':>7}  note")
    lines += [head, "-" * len(head)]
    ref = {r.key: r.time_s for r in rows if r.system == reference and r.ok}
    for r in rows:
        if r.unavailable:
            lines.append(f"{r.workload:<18} {r.column:>2} {r.system:<16} {'-':>10} {'':>8} "
                         f"{'':>12} {'':>7}  unavailable: {r.unavailable}")
            continue
        lines.append(f"{r.workload:<18} {r.column:>2} {r.system:<16} {_ms(r.time_s):>10} "
                     f"{_ms(r.spread_s) if r.spread_s is not None else '':>8} "
                     f"{_ratio(r.time_s, ref.get(r.key)):>12} "
                     f"{_ratio(r.time_s, r.floor_s):>7}  {r.note}")
    return "\n".join(lines)


def format_summary(summary: dict, reference: str = REFERENCE_SYSTEM) -> str:
    lines = [f"{'N':>2} {'system':<16} {'geomean ms':>11} {'×' + reference:>12} "
             f"{'×floor':>7} {'max×floor':>9}"]
    for world, per in summary.items():
        for system, s in per.items():
            g = s.get(f"geomean_ratio_vs_{reference}")
            f = s.get("geomean_ratio_vs_floor")
            m = s.get("max_ratio_vs_floor")
            lines.append(f"{world:>2} {system:<16} {_ms(s['geomean_s']):>11} "
                         f"{'-' if g is None else f'{g:.3f}':>12} "
                         f"{'-' if f is None else f'{f:.3f}':>7} "
                         f"{'-' if m is None else f'{m:.3f}':>9}")
    return "\n".join(lines)
