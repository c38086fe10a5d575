"""A long solve's progress line (`commands/progress.py`): phase, best plan, bound and gap on a
terminal; nothing on a pipe or with --json."""
from __future__ import annotations

import io
import logging

from einsummable.commands.progress import progress
from einsummable.optimizer.api import optimize

from helpers import mlp


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_phases_incumbent_bound_and_gap_on_a_terminal():
    tty = Terminal()
    with progress(True, tty):
        plan = optimize(mlp(1024, d=512, f=2048), "a100x8", cache=False)
    lines = [x for x in tty.getvalue().split("\r\033[K") if x]
    assert any(x.startswith("model built") for x in lines)
    solves = [x for x in lines if x.startswith("solve ")]
    assert solves and "bound" in solves[-1] and "gap" in solves[-1] and "best" in solves[-1]
    assert tty.getvalue().endswith("\r\033[K")  # the line is cleared at the end
    assert plan.objective_s > 0
    assert logging.getLogger("einsummable").level == logging.NOTSET  # left as it was


def test_progress_is_silent_off_a_terminal_or_when_disabled():
    pipe = io.StringIO()
    with progress(True, pipe):
        optimize(mlp(1024, d=512, f=2048), "a100x8", cache=False)
    tty = Terminal()
    with progress(False, tty):
        optimize(mlp(1024, d=512, f=2048), "a100x8", cache=False)
    assert pipe.getvalue() == "" and tty.getvalue() == ""
