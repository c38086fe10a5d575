"""Measured training steps: N gloo ranks on loopback, the protocol of `measure.py` (one torch
thread per rank, a barrier before each timed step, warm-up, interleaved rounds in rotating
order, median of the slowest rank's times), with a training step in place of a forward.

Every system is checked before it is timed against the module trained on one device with
torch.optim (the same hyperparameters): the loss and every parameter after each of
`check_steps` steps, as relative errors (max |a - b| / max |b| per tensor). The baselines
(`baselines/train_*.py`) check their own steps; einsummable's plan (made in the parent, its
JSON the payload) is checked for one step, its program lowered to deliver the loss and the
new parameters to rank 0, and timed lowered with them left where the plan computes them (the
steady state of a training loop whose parameters and state stay on the ranks).
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from einsummable.frontend.optim import Hyper

from .measure import Timing, _agree, percentile, run_ranks, time_rounds
from .workloads import Workload

# Seed of the targets y (the block and x come from the workload's own seed).
TARGET_SEED = 1


@dataclass(frozen=True)
class TrainRequest:
    workload: Workload
    systems: tuple[str, ...]
    world: int
    hyper: Hyper
    warmup: int = 2
    repeats: int = 10
    check_steps: int = 1
    timeout_s: float = 300.0
    payload: tuple[tuple[str, str], ...] = ()  # per system, e.g. einsummable's plan JSON


def inputs(workload: Workload) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(block, x, y), the same on every process."""
    block, x = workload.build()
    gen = torch.Generator().manual_seed(TARGET_SEED)
    return block, x, torch.randn(x.shape, generator=gen, dtype=x.dtype)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def reference(block, x: torch.Tensor, y: torch.Tensor, hyper: Hyper,
              steps: int) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """The module trained on one device with torch.optim: per step, (loss, parameters after)."""
    from .baselines.train_common import make_optimizer
    ref = copy.deepcopy(block)
    opt = make_optimizer(ref.parameters(), hyper)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
        out.append((loss.item(), {n: p.detach().clone() for n, p in ref.named_parameters()}))
    return out


def worst_errors(got: list[tuple[float, dict[str, torch.Tensor]]],
                 want: list[tuple[float, dict[str, torch.Tensor]]]) -> tuple[float, float]:
    """(worst loss error, worst parameter error) over the steps, relative."""
    loss_err = max(abs(g - w) / abs(w) for (g, _), (w, _) in zip(got, want))
    param_err = max(rel(gp[n], wp[n]) for (_, gp), (_, wp) in zip(got, want) for n in wp)
    return loss_err, param_err


def measure_training(request: TrainRequest) -> dict[str, Timing]:
    """Spawn the ranks and return one Timing per system; its note carries the loss's and the
    parameters' errors against torch.optim and its `max_abs_err` field the worse of the two
    (relative, as the module docstring measures them)."""
    got, why, _ = run_ranks(_body, request, request.world, request.timeout_s,
                            f"training steps of {request.workload.name}")
    if got is None:
        return {name: Timing(name, error=why) for name in request.systems}
    return {name: Timing.from_dict(t) for name, t in got.items()}


def _body(rank: int, request: TrainRequest) -> dict:
    block, x, y = inputs(request.workload)
    want = reference(block, x, y, request.hyper, request.check_steps)
    runs: dict = {}
    notes: dict[str, tuple[str, float | None, str | None]] = {}
    for name in request.systems:
        err = note = None
        worst = None
        try:
            run, checked, note = _system(name, block, x, y, rank, request)
            if rank == 0:
                worst = worst_errors(checked, want[:len(checked)])
        except Exception as e:  # reported in the row; a broken system must not stop the others
            err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if not _agree(err is None):
            notes[name] = ("", None, err or "failed on another rank")
            continue
        runs[name] = run
        text = note if worst is None else (f"{note}; vs torch.optim: loss {worst[0]:.1e}, "
                                           f"params {worst[1]:.1e}")
        notes[name] = (text, None if worst is None else max(worst), None)
    rounds = time_rounds(runs, request.warmup, request.repeats, request.world)
    out = {}
    for name in request.systems:
        text, worst, err = notes[name]
        if name not in runs:
            out[name] = Timing(name, error=err).to_dict()
            continue
        xs = rounds[name]
        out[name] = Timing(name, statistics.median(xs), percentile(xs, 0.25),
                           percentile(xs, 0.75), tuple(xs), worst, text).to_dict()
    return out


def _system(name: str, block, x, y, rank: int, request: TrainRequest):
    """(the timed step, per checked step (loss, parameters) on rank 0, note)."""
    from .baselines import TRAIN_BASELINES
    if name == "einsummable":
        from .training_einsummable import rank_train_step
        return rank_train_step(dict(request.payload).get(name), block, x, y, rank,
                               request.world, request.hyper)
    if name not in TRAIN_BASELINES:
        raise ValueError(f"no training system {name!r}: einsummable or one of "
                         f"{', '.join(TRAIN_BASELINES)}")
    system = TRAIN_BASELINES[name](block, x, y, rank, request.world, request.hyper)
    checked = []
    for _ in range(request.check_steps):
        loss = system.whole_loss(system.step())
        checked.append((loss, system.params()))
    return system.step, checked, system.note
