"""One function per figure; each takes a results document (or several) and writes one PNG."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from .load import ok_rows  # noqa: E402


def pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def bars(doc: dict, out: Path) -> Path:
    """Time per workload (groups) and system (bars); measured bars carry their IQR."""
    rows = ok_rows(doc)
    worlds = sorted({r["world"] for r in rows})
    world = worlds[-1] if worlds else None
    rows = [r for r in rows if r["world"] == world]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(workloads) + 2), 4))
    width = 0.8 / max(len(systems), 1)
    for i, s in enumerate(systems):
        xs, ys, errs = [], [], []
        for j, w in enumerate(workloads):
            r = next((r for r in rows if r["workload"] == w and r["system"] == s), None)
            if r:
                xs.append(j + i * width)
                ys.append(r["time_s"] * 1e3)
                errs.append((r.get("spread_s") or 0.0) * 1e3 / 2)
        ax.bar(xs, ys, width, yerr=errs if any(errs) else None, label=s, capsize=2)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(workloads))])
    ax.set_xticklabels(workloads, rotation=20, ha="right")
    ax.set_ylabel("ms per block")
    ax.set_yscale("log")
    ax.set_title(f"{doc['config']} ({doc.get('mode', '')}, {world} devices)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out / f"{doc['config']}_bars.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep(doc: dict, out: Path) -> Path:
    """Time against tokens (batch x sequence), one line per system, one panel per world size."""
    rows = [r for r in ok_rows(doc) if r.get("tokens")]
    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(1, max(len(worlds), 1), figsize=(5 * max(len(worlds), 1), 4),
                             squeeze=False)
    for ax, world in zip(axes[0], worlds):
        here = [r for r in rows if r["world"] == world]
        for s in dict.fromkeys(r["system"] for r in here):
            pts = sorted((r["tokens"], r["time_s"] * 1e3) for r in here if r["system"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    linestyle="--" if s.startswith("floor") else "-", label=s)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens (batch x sequence)")
        ax.set_ylabel("ms per block")
        ax.set_title(f"{world} ranks")
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc['config']}: shape sweep")
    fig.tight_layout()
    path = out / f"{doc['config']}_sweep.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def random_distribution(doc: dict, out: Path) -> Path:
    """Histogram of random plans' time over the optimized plan's, with the median marked."""
    opt = doc.get("optimized_s")
    times = doc.get("random_s", [])
    ratios = sorted(t / opt for t in times) if opt else sorted(t * 1e3 for t in times)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(ratios, bins=min(40, max(5, len(ratios) // 4)), color="tab:gray")
    if ratios:
        med = ratios[len(ratios) // 2] if len(ratios) % 2 else \
            (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
        ax.axvline(med, color="tab:red", label=f"median {med:.2f}" + ("x" if opt else " ms"))
    if opt:
        ax.axvline(1.0, color="tab:blue", label="optimized")
        ax.set_xlabel("random plan time / optimized plan time")
    else:
        ax.set_xlabel("random plan time (ms)")
    ax.set_ylabel("plans")
    ax.set_title(f"{doc['config']}: {len(times)} random plans")
    ax.legend()
    fig.tight_layout()
    path = out / f"{doc['config']}_distribution.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def predicted_vs_measured(docs: list[dict], out: Path) -> Path | None:
    """Every measured row that also has a prediction: scatter, y = x line, Pearson r."""
    pts = [(r["extra"]["predicted_s"] * 1e3, r["time_s"] * 1e3, r["system"])
           for d in docs for r in ok_rows(d) if (r.get("extra") or {}).get("predicted_s")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for s in dict.fromkeys(p[2] for p in pts):
        mine = [p for p in pts if p[2] == s]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], label=s, s=18)
    lo = min(min(p[0], p[1]) for p in pts)
    hi = max(max(p[0], p[1]) for p in pts)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    r = pearson([math.log(p[0]) for p in pts], [math.log(p[1]) for p in pts])
    r_lin = pearson([p[0] for p in pts], [p[1] for p in pts])
    ax.set_title(f"predicted vs measured: Pearson r {r_lin:.2f} (log-log {r:.2f})"
                 if r is not None and r_lin is not None else "predicted vs measured")
    ax.set_xlabel("predicted ms (simulator)")
    ax.set_ylabel("measured ms")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "predicted_vs_measured.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plan_picture(name: str, record: dict, out: Path) -> Path | None:
    """Left: per op, its split and the bytes it moves in. Right: device-by-device traffic."""
    ops = record.get("ops") or []
    links = record.get("link_bytes") or []
    if not ops and not links:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, max(4, 0.28 * len(ops) + 1)),
                                   gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"{o['op'][:22]}  [{o.get('split_roles', o['split'])[:34]}]" for o in ops]
    mb = [(o.get("bytes_in") or 0) / 1e6 for o in ops]
    ax1.barh(range(len(ops)), mb, color="tab:orange")
    ax1.set_yticks(range(len(ops)))
    ax1.set_yticklabels(labels, fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xlabel("MB moved into the op")
    ax1.set_title(f"plan for {name}: split per op")
    n = record.get("world") or (1 + max((max(a, b) for a, b, _ in links), default=0))
    grid = [[0.0] * n for _ in range(n)]
    for a, b, nbytes in links:
        grid[a][b] += nbytes / 1e6
    im = ax2.imshow(grid, cmap="viridis")
    ax2.set_xlabel("to device")
    ax2.set_ylabel("from device")
    ax2.set_xticks(range(n))
    ax2.set_yticks(range(n))
    ax2.set_title("traffic (MB), output left in place")
    fig.colorbar(im, ax=ax2, fraction=0.046)
    fig.tight_layout()
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    path = out / f"plan_{safe}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
