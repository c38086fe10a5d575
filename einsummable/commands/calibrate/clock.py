"""Timing work on one torch device: the clock every calibration and check shares.

    seconds(fn)   median over `trials` of the mean seconds of one call of fn, after `warmup`
                  calls; each trial runs fn `reps` times back to back, reps chosen from one
                  probe call so that a trial lasts at least `min_trial_s` (launch-bound work
                  is timed over many calls, large kernels over few)

On CUDA a trial is timed with CUDA events recorded on the current stream around the loop
(the device's own clock, no host sync inside the loop) and the host waits on the end event;
on the CPU with `time.perf_counter`. `Span` times one region on either: it synchronises the
device first, so a span starts with an idle device and measures what the host issues in it
plus what the device runs for it (the time one instruction of a program costs its rank).
Medians, not means or minima: on shared machines a stray slow trial must not move the figure,
and the runtime sees the typical case.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import RuntimeFault

# Calls per trial are capped so that a launch-bound probe cannot ask for millions.
MAX_REPS = 10_000


@dataclass(frozen=True)
class Budget:
    """How long each timing runs: warm-up calls, trials, the shortest trial."""
    warmup: int = 2
    trials: int = 5
    min_trial_s: float = 0.02


def check_device(device: torch.device | str) -> torch.device:
    """The torch device, or a RuntimeFault saying what to do when it is not usable here."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeFault(f"--device {dev} asks for a CUDA GPU, but torch "
                           f"{torch.__version__} sees none here",
                           fix="run on a machine with an NVIDIA GPU and a CUDA build of "
                               "torch, or pass --device cpu to measure this CPU")
    if dev.type not in ("cuda", "cpu"):
        raise RuntimeFault(f"--device {dev}: only cuda and cpu are supported",
                           fix="pass --device cuda or --device cpu")
    return dev


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trial(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Mean seconds of one call over `reps` back-to-back calls."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def seconds(fn: Callable[[], Any], device: torch.device, budget: Budget = Budget()) -> float:
    """Median seconds of one call of `fn` on `device` (module docstring)."""
    return statistics.median(samples(fn, device, budget))


def samples(fn: Callable[[], Any], device: torch.device, budget: Budget = Budget()
            ) -> list[float]:
    """Seconds of one call per trial (module docstring), for callers that want the spread."""
    for _ in range(budget.warmup):
        fn()
    synchronize(device)
    probe = max(_trial(fn, 1, device), 1e-9)
    reps = int(min(MAX_REPS, max(1, budget.min_trial_s // probe)))
    return [_trial(fn, reps, device) for _ in range(budget.trials)]


class Span:
    """Seconds of one region on `device`: `with Span(dev) as s: ...; s.seconds` (docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Span:
        synchronize(self.device)
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1e3
        else:
            self.seconds = time.perf_counter() - self._t0
