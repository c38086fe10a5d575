"""A device type from measured figures (`device.py`): peaks, curves, fractions, and the YAML.

    peak_flops[d]   the datasheet figure the user gives for dtype d, else the best rate
                    measured in d (GEMMs of the plans' shapes and the square one); the file
                    says which
    matmul          points (FLOPs of the call, rate / peak[dtype]) of every GEMM in the curve
                    dtypes, binned at BINS_PER_DECADE per decade of FLOPs (geometric mean of
                    the FLOPs, median of the fractions), then made non-decreasing in FLOPs by
                    pooling adjacent violators (a bigger call of the same kind does not run at
                    a lower fraction; the pooling removes the noise-made dips), fractions
                    clipped to [MIN_FRACTION, 1]
    attention       the same over the causal SDPA points (the LLaMA blocks' attention); the
                    non-causal rates are listed in the header
    memory          median over the elementwise and norm rates / mem_bw, at most 1, where
                    mem_bw is the datasheet figure the user gives, else the measured
                    device-to-device copy bandwidth (bytes read plus written per second)
    launch          seconds per instruction of the local executor on the device
    transfer_slowdown  1 - t(GEMM alone) / t(GEMM beside copies), in [0, MAX_SLOWDOWN]

The file is a whole one-device topology (so `load_topology` reads it and `experiments/
gpu_check.py` simulates on it); its `device_types:` entry is the product, to paste into a
multi-GPU topology.
"""
from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass

import yaml

from ...topology import read_topology
from ...topology.achieved import Achieved, Curve
from .device import ALL_DTYPES, DeviceFigures
from .fmt import duration, fraction, number, si

BINS_PER_DECADE = 4
MIN_FRACTION = 1e-4
MAX_SLOWDOWN = 0.95


@dataclass(frozen=True)
class Datasheet:
    """Figures the user gives (`--peak-flops`, `--mem-bw`); missing ones are measured."""
    peak_flops: dict[str, float]
    mem_bw: float | None = None


@dataclass(frozen=True)
class DeviceType:
    """The fitted device type and where each figure came from."""
    peak_flops: dict[str, float]
    peak_source: dict[str, str]
    mem_bw: float
    mem_bw_source: str
    mem_bytes: float
    launch_s: float
    achieved: Achieved


def _pav(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v1, w1, c1), (v2, w2, c2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2]]
    return [b[0] for b in blocks for _ in range(int(b[2]))]


def curve(points: list[tuple[float, float]]) -> Curve:
    """The curve of (FLOPs, fraction) points (module docstring)."""
    if not points:
        return Curve()
    bins: dict[int, list[tuple[float, float]]] = {}
    for f, v in points:
        bins.setdefault(math.floor(math.log10(f) * BINS_PER_DECADE), []).append((f, v))
    keys = sorted(bins)
    flops = [math.exp(statistics.fmean(math.log(f) for f, _ in bins[k])) for k in keys]
    fracs = [statistics.median(v for _, v in bins[k]) for k in keys]
    fracs = _pav(fracs, [len(bins[k]) for k in keys])
    pts: list[tuple[float, float]] = []
    for f, v in zip(flops, fracs):
        f, v = float(number(f)), float(fraction(min(1.0, max(MIN_FRACTION, v))))
        if not pts or f > pts[-1][0]:  # bins a rounding merged keep their first point
            pts.append((f, v))
    return Curve(tuple(pts))


def fractions(points, peaks: dict[str, float], mem_bw: float, curve_dtypes: tuple[str, ...],
              slowdown: float = 0.0) -> Achieved:
    """matmul, attention, memory and transfer_slowdown of the module docstring, from timed
    calls (`device.Point`s) and the peaks and memory bandwidth they are fractions of."""
    mm = [(p.work, p.rate / peaks[p.dtype]) for p in points
          if p.kind == "gemm" and p.dtype in curve_dtypes]
    att = [(p.work, p.rate / peaks[p.dtype]) for p in points
           if p.kind == "sdpa-causal" and p.dtype in curve_dtypes]
    mem = statistics.median(p.rate for p in points if p.kind in ("elementwise", "norm")) / mem_bw
    return Achieved(curve(mm), curve(att), float(fraction(min(1.0, max(MIN_FRACTION, mem)))),
                    float(fraction(min(MAX_SLOWDOWN, max(0.0, slowdown)))))


def fit_device(fig: DeviceFigures, sheet: Datasheet, curve_dtypes: tuple[str, ...]
               ) -> DeviceType:
    """The device type of the module docstring."""
    peaks, source = {}, {}
    for d in ALL_DTYPES:
        best = max((p.rate for p in fig.of("gemm", "square") if p.dtype == d), default=0.0)
        if d in sheet.peak_flops:
            peaks[d], source[d] = sheet.peak_flops[d], "datasheet (given)"
        else:
            peaks[d], source[d] = best, "best measured GEMM"
    copy = fig.of("copy")[0]
    if sheet.mem_bw is not None:
        mem_bw, mem_source = sheet.mem_bw, "datasheet (given)"
    else:
        mem_bw, mem_source = copy.rate, "measured device-to-device copy (read + written)"
    achieved = fractions(fig.points, peaks, mem_bw, curve_dtypes,
                         1.0 - fig.gemm_alone_s / fig.gemm_loaded_s)
    return DeviceType(peaks, source, mem_bw, mem_source, fig.mem_bytes, fig.launch_runtime_s,
                      achieved)


def curve_yaml(c: Curve) -> str:
    return "[" + ", ".join(f"[{number(f)}, {fraction(v)}]" for f, v in c.points) + "]"


def _header(fig: DeviceFigures, dt: DeviceType, command: str, curve_dtypes: tuple[str, ...]
            ) -> str:
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    lines = [f"One {fig.device} device: {fig.name}, torch {fig.torch_version}.",
             f"MEASURED at {stamp} by: {command}",
             "Timed with " + ("CUDA events" if fig.device.startswith("cuda") else
                              "time.perf_counter") +
             f"; {fig.shapes.budget.warmup} warm-up calls, median of "
             f"{fig.shapes.budget.trials} trials of >= {fig.shapes.budget.min_trial_s * 1e3:g} "
             "ms each (einsummable/commands/calibrate/device.py).",
             (f"Shapes: the LLaMA block at dim {fig.shapes.dim}, FFN {fig.shapes.ffn}, "
              f"{fig.shapes.heads} heads of {fig.shapes.head_dim}, split "
              f"{'/'.join(map(str, fig.shapes.splits))} ways, tokens "
              f"{'/'.join(map(str, fig.shapes.tokens))}; curves over "
              f"{', '.join(curve_dtypes)}.")]
    for d in ALL_DTYPES:
        lines.append(f"peak_flops.{d}: {si(dt.peak_flops[d], 'FLOP/s')}, {dt.peak_source[d]}"
                     + ("; achieved.matmul and attention are fractions of it"
                        if d in curve_dtypes else ""))
    lines.append(f"mem_bw: {si(dt.mem_bw, 'B/s')}, {dt.mem_bw_source}; achieved.memory is the "
                 "median elementwise/norm rate over it.")
    ew = [p.rate for p in fig.of("elementwise")]
    nm = [p.rate for p in fig.of("norm")]
    lines.append(f"elementwise {si(min(ew), 'B/s')} .. {si(max(ew), 'B/s')}, norm "
                 f"{si(min(nm), 'B/s')} .. {si(max(nm), 'B/s')}, copy "
                 f"{si(fig.of('copy')[0].rate, 'B/s')}.")
    lines.append(f"launch: {duration(fig.launch_runtime_s)} per runtime instruction (the figure "
                 f"used); a bare kernel launch {duration(fig.launch_kernel_s)}.")
    lines.append(f"transfer_slowdown: a {fig.shapes.square_n}^3 GEMM alone "
                 f"{fig.gemm_alone_s * 1e3:.4g} ms, beside device-to-device copies on another "
                 f"{'stream' if fig.device.startswith('cuda') else 'thread'} "
                 f"{fig.gemm_loaded_s * 1e3:.4g} ms.")
    nc = sorted(fig.of("sdpa"), key=lambda p: p.work)
    if nc:
        lines.append("attention curve from causal SDPA; non-causal fractions: " + ", ".join(
            f"{p.work:.3g}:{p.rate / dt.peak_flops[p.dtype]:.3f}" for p in nc
            if p.dtype == curve_dtypes[0]))
    return "".join(f"# {ln}\n" for ln in lines)


def render(fig: DeviceFigures, dt: DeviceType, name: str, command: str,
           curve_dtypes: tuple[str, ...]) -> str:
    """The YAML file (module docstring); it is checked to load before it is returned."""
    a = dt.achieved
    pf = ", ".join(f"{d}: {si(dt.peak_flops[d], 'FLOP/s')}" for d in ALL_DTYPES)
    body = (f"name: {name}\n"
            f"source_notes: |\n"
            f"  Measured by `einsummable calibrate --device {fig.device}` on {fig.name}.\n"
            f"  Peaks: " + "; ".join(f"{d} {dt.peak_source[d]}" for d in ALL_DTYPES) + ".\n"
            f"  achieved.memory is relative to mem_bw = {dt.mem_bw_source}.\n"
            f"device_types:\n"
            f"  {name}:\n"
            f"    peak_flops: {{{pf}}}\n"
            f"    mem_bw: {si(dt.mem_bw, 'B/s')}\n"
            f"    mem_bytes: {si(dt.mem_bytes, 'B')}\n"
            f"    launch: {duration(dt.launch_s)}\n"
            + ("    prefetch_stream: true\n" if fig.device.startswith("cuda") else "")
            + f"    achieved:\n"
            f"      matmul: {curve_yaml(a.matmul)}\n"
            f"      attention: {curve_yaml(a.attention)}\n"
            f"      memory: {fraction(a.memory)}\n"
            f"      transfer_slowdown: {fraction(a.transfer_slowdown)}\n"
            f"nodes: {{count: 1, devices_per_node: 1, device_type: {name}}}\n"
            f"links: []\n")
    read_topology(yaml.safe_load(body), "calibrate --device")  # the file we write must load
    return _header(fig, dt, command, curve_dtypes) + body


def points_json(fig: DeviceFigures) -> list[dict]:
    """Every timed call, for --json."""
    return [{"kind": p.kind, "dtype": p.dtype, "shape": list(p.shape), "work": p.work,
             "seconds": p.seconds, "rate": p.rate} for p in fig.points]

