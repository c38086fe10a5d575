"""`einsummable-figs` (or `python -m paper_figs.cli`): turn results files into the paper's figures (PNG).

Which figure each results document gives: blocks and chains -> bars per workload and system;
measured sweeps -> the shape sweep; random_plans -> the distribution; every measured row with
a prediction -> predicted against measured with Pearson r; every plan kept in a results file
-> a plan picture (split per op, bytes moved, device-by-device traffic heatmap).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import plots
from .load import load_results

HELP = "draw the figures (PNG) from experiment results"
DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help="directory of results *.json (from `einsummable-bench`)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the PNGs go (default: <results>/figs)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (the written files) on stdout")
    parser.add_argument("--max-plans", type=int, default=3,
                        help="plan pictures per results file")


def draw_all(results: Path, out: Path, max_plans: int = 3) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    docs = load_results(results)
    written: list[Path] = []
    for name, doc in docs.items():
        kind = doc.get("kind", "blocks")
        if kind in ("blocks", "matrix_chains", "exchange"):
            written.append(plots.bars(doc, out))
        if kind == "blocks" and doc.get("mode") == "measured":
            written.append(plots.sweep(doc, out))
        if kind == "random_plans":
            written.append(plots.random_distribution(doc, out))
        for pname, rec in list((doc.get("plans") or {}).items())[:max_plans]:
            p = plots.plan_picture(f"{name}-{pname}", rec, out)
            if p:
                written.append(p)
    measured = [d for d in docs.values() if d.get("mode") == "measured"]
    p = plots.predicted_vs_measured(measured, out)
    if p:
        written.append(p)
    return written


def main(args: argparse.Namespace) -> int:
    out = args.out or args.results / "figs"
    written = draw_all(args.results, out, args.max_plans)
    if args.json:
        json.dump({"figures": [str(p) for p in written]}, sys.stdout)
        sys.stdout.write("\n")
    else:
        for p in written:
            print(p)
        if not written:
            print(f"no results in {args.results}; run `einsummable-bench CONFIG` first",
                  file=sys.stderr)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """The `einsummable-figs` entry point."""
    parser = argparse.ArgumentParser(prog="einsummable-figs", description=HELP)
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
