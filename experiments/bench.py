"""`einsummable-bench CONFIG` (or `python -m experiments.bench CONFIG`): run an experiment config, write results, print a table.

Results go to experiments/results/<config name>.json and .csv (or --out DIR). A progress bar
runs on stderr; the table with ratios is printed at the end. With --json, stdout carries one
JSON object (the results document) and nothing else.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from einsummable.errors import EinsummableError

from . import harness, runners

HELP = "run an experiment config (experiments/configs/*.yaml): results JSON/CSV and a table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="config path, or a name under experiments/configs "
                                       "(e.g. llama_blocks_a100)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR,
                        help="directory for <name>.json and <name>.csv")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout and nothing else there")
    parser.add_argument("--repeats", type=int, help="override the config's timed rounds")
    parser.add_argument("--world-sizes", type=int, nargs="+",
                        help="override a measured config's world sizes (e.g. 2)")
    parser.add_argument("--quick", action="store_true",
                        help="use the config's `quick` subset (fewer workloads/samples)")


def run_config(cfg: dict, *, out_dir: Path = harness.RESULTS_DIR, repeats: int | None = None,
               quick: bool = False, progress_stream=None,
               world_sizes: list[int] | None = None) -> dict:
    """Run one config; returns the results document (also written to out_dir)."""
    if quick and cfg.get("quick"):
        cfg = {**cfg, **cfg["quick"]}
    if repeats is not None:
        cfg = {**cfg, "repeats": repeats}
    if world_sizes:
        cfg = {**cfg, "world_sizes": list(world_sizes)}
    kind = cfg.get("kind", "blocks")
    runner = runners.RUNNERS.get(kind)
    if runner is None:
        raise ValueError(f"config {cfg['name']}: unknown kind {kind!r} "
                         f"(one of {', '.join(runners.RUNNERS)})")
    result = runner(cfg, progress_stream)
    doc = {"config": cfg["name"], "kind": kind, "mode": cfg.get("mode", "simulated"),
           "topology": cfg.get("topology"), "created": harness.now_iso(),
           "machine": harness.machine_info(), "published": cfg.get("published", {}),
           "settings": {k: v for k, v in cfg.items()
                        if k not in ("published", "quick") and not k.startswith("_")},
           "summary": harness.summarize(result.rows, cfg.get("reference", harness.REFERENCE_SYSTEM)),
           "headline": harness.headline(result.rows, cfg.get("reference", harness.REFERENCE_SYSTEM)),
           **result.extra}
    jpath, cpath = harness.write_results(cfg["name"], doc, result.rows, out_dir)
    doc["rows"] = [r.to_dict() for r in result.rows]
    doc["files"] = {"json": str(jpath), "csv": str(cpath)}
    doc["_table"] = result.table
    return doc


def main(args: argparse.Namespace) -> int:
    cfg = harness.load_config(args.config)
    doc = run_config(cfg, out_dir=args.out, repeats=args.repeats, quick=args.quick,
                     world_sizes=args.world_sizes)
    table = doc.pop("_table")
    if args.json:
        json.dump(doc, sys.stdout, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(table)
        print(f"\nresults: {doc['files']['json']}  {doc['files']['csv']}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """The `einsummable-bench` entry point."""
    parser = argparse.ArgumentParser(prog="einsummable-bench", description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return main(args)
    except EinsummableError as e:
        print(f"einsummable-bench: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
