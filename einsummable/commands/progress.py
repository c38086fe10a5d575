"""A long solve's progress on a terminal: one line, rewritten in place, with the phase, the best
plan so far, the proved bound and the gap between them.

The optimizer logs its phases at INFO on the `einsummable` loggers; a record that carries
`extra={"progress": (phase, incumbent_s, bound_s)}` (either figure None where unknown) updates
the line. Nothing is shown unless the stream is a terminal and the command was not asked for
JSON, so pipes, files and `--json` stay clean.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import IO, Iterator

LOGGER = "einsummable"
MS = 1e3


class _Line(logging.Handler):
    def __init__(self, stream: IO[str]) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.best: float | None = None
        self.bound: float | None = None
        self.shown = False

    def emit(self, record: logging.LogRecord) -> None:
        progress = getattr(record, "progress", None)
        if progress is None:
            return
        phase, best, bound = progress
        if best is not None:
            self.best = best if self.best is None else min(self.best, best)
        if bound is not None:
            self.bound = bound if self.bound is None else max(self.bound, bound)
        parts = [phase]
        if self.best is not None:
            parts.append(f"best {self.best * MS:.4g} ms")
        if self.bound is not None:
            parts.append(f"bound {self.bound * MS:.4g} ms")
        if self.best is not None and self.bound is not None and self.best > 0:
            parts.append(f"gap {max(0.0, 1 - self.bound / self.best):.2%}")
        self.stream.write("\r\033[K" + " | ".join(parts))
        self.stream.flush()
        self.shown = True


@contextlib.contextmanager
def progress(enabled: bool, stream: IO[str] | None = None) -> Iterator[None]:
    """Show the optimizer's progress on `stream` (stderr) while the block runs, when
    `enabled` and the stream is a terminal."""
    stream = sys.stderr if stream is None else stream
    if not enabled or not stream.isatty():
        yield
        return
    logger = logging.getLogger(LOGGER)
    handler = _Line(stream)
    level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        if handler.shown:
            stream.write("\r\033[K")
            stream.flush()
