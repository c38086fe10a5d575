"""`einsummable plan | show | run | calibrate`.

Each subcommand lives in its own module under `commands/` exposing `HELP`,
`add_arguments(parser)` and `main(args) -> int`, so this file only dispatches. `--json` makes a
command print one JSON object on stdout and nothing else there. The experiment harness has
entry points of its own (`einsummable-bench`, `einsummable-figs`): the library does not
depend on it.
"""
from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import Sequence

from .commands import calibrate, plan, run, show
from .errors import EinsummableError

COMMANDS: dict[str, ModuleType] = {"plan": plan, "show": show, "run": run,
                                   "calibrate": calibrate}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="einsummable", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, mod in COMMANDS.items():
        p = sub.add_parser(name, help=mod.HELP)
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
