"""`einsummable plan | run | bench | show | calibrate`.

Each subcommand lives in its own module (see COMMANDS) exposing `HELP`, `add_arguments(parser)`
and `main(args) -> int`, so this file only dispatches. `--json` makes a command print one JSON
object on stdout and nothing else there.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from .errors import EinsummableError

COMMANDS: dict[str, str] = {
    "plan": "einsummable.commands.plan",
    "show": "einsummable.commands.show",
    "run": "einsummable.commands.run",
    "calibrate": "einsummable.commands.calibrate",
    "bench": "experiments.bench",
    "figs": "paper_figs.cli",
}


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="einsummable", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        mod = _load(module)
        if mod is None:
            continue
        p = sub.add_parser(name, help=getattr(mod, "HELP", None))
        mod.add_arguments(p)
        p.set_defaults(_handler=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._handler(args) or 0)
    except EinsummableError as e:
        print(f"einsummable {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
