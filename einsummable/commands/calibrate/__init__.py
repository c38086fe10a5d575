"""`einsummable calibrate`: measure this machine and write a topology YAML.

    einsummable calibrate [--world-size 4] [--out topologies/cpu4.yaml] [--quick]
        N gloo ranks on this CPU: rank-local figures with all ranks running (`ranks.py`),
        dependent exchange rounds and the link figures fitted to them (`rounds.py`), written
        as the N-rank CPU topology (`cpu_yaml.py`)
    einsummable calibrate --device cuda [--peak-flops float16=312e12,...] [--mem-bw 1555e9]
        one device's achieved figures: GEMM and SDPA rates over the shapes plans produce,
        memory, launch, copy and the slowdown beside a copy (`device.py`), fitted into a
        device type with an `achieved:` section and written as a one-device topology
        (`device_yaml.py`). `--device cpu` is a legitimate mode: the same measurements at CPU
        sizes, the achieved figures of this CPU. `--device cuda` without a GPU fails and says
        what to do.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from ...errors import PlanError, TopologyError
from ...topology.units import canonical_dtype, parse_quantity
from . import cpu_yaml, device, device_yaml, ranks, rounds
from .clock import check_device
from .fmt import duration, si

HELP = ("measure this machine (gloo ranks, or one device with --device) and write a "
        "topology YAML")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", type=int, default=4, help="gloo ranks to measure with")
    p.add_argument("--out", default=None,
                   help="topology YAML to write (default: print it, do not write)")
    p.add_argument("--name", default=None,
                   help="topology name (default: cpu<world-size>, or the device's kind)")
    p.add_argument("--quick", action="store_true", help="very short measurement (tests)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--device", default=None,
                   help="measure one device instead (cuda, cuda:1 or cpu) and write a "
                        "one-device topology with achieved: curves")
    p.add_argument("--peak-flops", default=None,
                   help="datasheet peaks, e.g. float16=312e12,bfloat16=312 TFLOP/s (default: "
                        "the best measured GEMM rate per dtype)")
    p.add_argument("--mem-bw", default=None,
                   help="datasheet memory bandwidth, e.g. 1555e9 or '1555 GB/s' (default: the "
                        "measured device-to-device copy bandwidth)")
    p.add_argument("--dtypes", default=None,
                   help="dtypes of the achieved curves (default: float16,bfloat16 on cuda, "
                        "float32 on cpu)")


def _peaks(text: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            out[canonical_dtype(key.strip())] = parse_quantity(value.strip(), "flops")
        except (ValueError, TopologyError) as e:
            raise PlanError(f"--peak-flops: cannot read {item!r} ({e})",
                            fix="write dtype=rate pairs, e.g. "
                                "--peak-flops float16=312e12,bfloat16=312e12") from None
    return out


def _mem_bw(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_quantity(text, "bandwidth")
    except ValueError as e:
        raise PlanError(f"--mem-bw: {e}", fix="write e.g. --mem-bw 1555e9 or "
                                              "--mem-bw '1555 GB/s'") from None


def _curve_dtypes(text: str | None, dev: torch.device) -> tuple[str, ...]:
    if text is None:
        return ("float16", "bfloat16") if dev.type == "cuda" else ("float32",)
    try:
        return tuple(canonical_dtype(d.strip()) for d in text.split(",") if d.strip())
    except TopologyError as e:
        raise PlanError(f"--dtypes: {e}", fix="write e.g. --dtypes float16,bfloat16") from None


def _command(args: argparse.Namespace) -> str:
    parts = ["einsummable calibrate"]
    if args.device:
        parts.append(f"--device {args.device}")
        if args.peak_flops:
            parts.append(f"--peak-flops {args.peak_flops}")
        if args.mem_bw:
            parts.append(f"--mem-bw '{args.mem_bw}'")
        if args.dtypes:
            parts.append(f"--dtypes {args.dtypes}")
    else:
        parts.append(f"--world-size {args.world_size}")
    if args.out:
        parts.append(f"--out {args.out}")
    if args.quick:
        parts.append("--quick")
    return " ".join(parts)


def _emit(args: argparse.Namespace, text: str, payload: dict, summary: str) -> None:
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        print(json.dumps({**payload, "out": args.out, "yaml": text}, sort_keys=True))
    elif not args.out:
        print(text, end="")
    else:
        print(f"wrote {args.out}: {summary}")


def main_device(args: argparse.Namespace) -> int:
    sheet = device_yaml.Datasheet(_peaks(args.peak_flops), _mem_bw(args.mem_bw))
    dev = check_device(args.device)
    dtypes = _curve_dtypes(args.dtypes, dev)
    shapes = device.QUICK if args.quick else device.LLAMA_7B if dev.type == "cuda" \
        else device.CPU
    log = (lambda msg: None) if args.json else (lambda msg: print(f"[calibrate] {msg}",
                                                                    file=sys.stderr))
    fig = device.measure_device(dev, shapes, dtypes, log)
    dt = device_yaml.fit_device(fig, sheet, dtypes)
    name = args.name or dev.type
    text = device_yaml.render(fig, dt, name, _command(args), dtypes)
    a = dt.achieved
    payload = {"device": fig.device, "name": fig.name, "peak_flops": dt.peak_flops,
               "peak_source": dt.peak_source, "mem_bw": dt.mem_bw,
               "mem_bw_source": dt.mem_bw_source, "launch_s": dt.launch_s,
               "launch_kernel_s": fig.launch_kernel_s, "achieved": a.to_dict(),
               "gemm_alone_s": fig.gemm_alone_s, "gemm_loaded_s": fig.gemm_loaded_s,
               "points": device_yaml.points_json(fig)}
    _emit(args, text, payload,
          f"{len(a.matmul.points)} matmul and {len(a.attention.points)} attention points, "
          f"memory {a.memory:.3f} of {si(dt.mem_bw, 'B/s')}, launch {duration(dt.launch_s)}, "
          f"transfer_slowdown {a.transfer_slowdown:.3f}")
    return 0


def main_ranks(args: argparse.Namespace) -> int:
    if args.world_size < 1:
        raise PlanError(f"--world-size must be >= 1, got {args.world_size}",
                        fix="pass the number of local ranks, e.g. --world-size 4")
    effort = ranks.QUICK if args.quick else ranks.FULL
    chain_effort = effort.chains
    m = ranks.measure(args.world_size, effort)
    chains = m.chains
    fit = None
    if chains:
        pairs = ranks.pairs_rounds(args.world_size)
        lows = [rounds.chain_program(args.world_size, pairs[0], c.kind, chain_effort)
                for c in chains]
        fit = rounds.fit_links(chains, lows, lambda lat, msg, bw, wait: cpu_yaml.topology(
            m, lat, msg, bw, wait), (m.p2p_latency_s, m.message_s, m.p2p_bw))
    text = cpu_yaml.render(m, chains, fit, args.name or f"cpu{args.world_size}",
                           _command(args), chain_effort.trials)
    latency, message, bw, wait = cpu_yaml.links(m, fit)
    payload = {"measured": asdict(m), "chains": [asdict(c) for c in chains],
               "fit": None if fit is None else asdict(fit),
               "chain_effort": asdict(chain_effort)}
    _emit(args, text, payload,
          f"matmul fp32 {si(m.peak_flops['float32'], 'FLOP/s')}, memory "
          f"{si(m.mem_bw, 'B/s')}, launch {duration(m.launch_s)}, links {si(bw, 'B/s')} / "
          f"{duration(latency)}, {duration(message)} per message, {duration(wait)} per two-way "
          "exchange wait")
    return 0


def main(args: argparse.Namespace) -> int:
    return main_device(args) if args.device else main_ranks(args)
