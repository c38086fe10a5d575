"""Candidates: a decomposition of an op plus the device(s) that compute each of its tuples.

This is the vocabulary shared by the optimizer (which chooses one candidate per op), the
exchange synthesiser (which moves blocks between the layouts candidates imply) and lowering.

- A candidate's *output layout* is the set of pieces it leaves behind: for each tuple and each
  device computing it, one block of the output. Tuples that share an output block but differ in
  `slice` hold partial results still to be folded by the op's aggregation.
- A candidate's *needs* are, per input, the (region, device) pairs its tuples read.
- Graph inputs (activations and weights) get a layout too: they are the output of an identity
  "input op" over the tensor's dims, decomposed like any other op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from ..core.geometry import Region
from ..errors import PlanError
from ..frontend.ir import Op, TensorInfo, make_op
from ..frontend.scalar import arg
from .spec import Decomposition, decompositions, is_legal, tuples

INPUT_PREFIX = "input:"


@dataclass(frozen=True)
class Candidate:
    """`devices[t]` lists the devices that compute tuple t (canonical order); more than one
    device means replicated work. `label` says how it was made (e.g. "node: b/2 | gpu: h/4")."""

    parts: tuple[tuple[str, int], ...]
    devices: tuple[tuple[int, ...], ...]
    label: str = ""

    @property
    def dec(self) -> Decomposition:
        return Decomposition(self.parts)

    @property
    def used_devices(self) -> tuple[int, ...]:
        return tuple(sorted({d for ds in self.devices for d in ds}))

    def __str__(self) -> str:
        return self.label or str(self.dec)

    def to_json(self) -> dict:
        return {"parts": [[m, p] for m, p in self.parts],
                "devices": [list(d) for d in self.devices], "label": self.label}

    @staticmethod
    def from_json(d: dict) -> "Candidate":
        return Candidate(tuple((m, int(p)) for m, p in d["parts"]),
                         tuple(tuple(int(x) for x in ds) for ds in d["devices"]), d.get("label", ""))


@dataclass(frozen=True)
class Piece:
    """One block of a tensor on one device; `slice` numbers the partial results of a block."""

    region: Region
    device: int
    slice: int
    n_slices: int


def check_candidate(op: Op, cand: Candidate) -> None:
    part = dict(cand.parts)
    if set(part) - set(op.modes) or not is_legal(op, part):
        raise PlanError(f"decomposition {cand.dec} is not legal for [{op.einsum}]",
                        op=op.name, source=op.source)
    n = math.prod(part.values())
    if len(cand.devices) != n or any(not ds for ds in cand.devices):
        raise PlanError(f"candidate lists devices for {len(cand.devices)} tuples; the "
                        f"decomposition has {n}", op=op.name, source=op.source)


def full_parts(op: Op, parts: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """Parts for every mode of the op, in canonical order (missing modes whole)."""
    return tuple((m, parts.get(m, 1)) for m in op.modes)


def place(op: Op, parts: dict[str, int], devices: Sequence[int], label: str = "") -> Candidate:
    """Canonical placement: tuple t runs on devices[t*r : (t+1)*r] with r = len(devices) // n.

    Tuples are in row-major order over the op's modes, so two ops that split a shared mode the
    same way put the same blocks on the same devices.
    """
    full = full_parts(op, parts)
    n = math.prod(p for _, p in full)
    if len(devices) % n:
        raise PlanError(f"{n} tuples do not spread evenly over {len(devices)} devices", op=op.name)
    r = len(devices) // n
    return Candidate(full, tuple(tuple(devices[t * r:(t + 1) * r]) for t in range(n)), label)


@lru_cache(maxsize=65536)
def output_layout(op: Op, cand: Candidate) -> tuple[Piece, ...]:
    """Every block the candidate leaves behind, partials included."""
    n_slices = math.prod(dict(cand.parts).get(m, 1) for m in op.agg_modes)
    out = []
    for t, devs in zip(tuples(op, cand.dec), cand.devices):
        for d in devs:
            out.append(Piece(t.out_region, d, t.agg_slice, n_slices))
    return tuple(out)


@lru_cache(maxsize=65536)
def input_needs(op: Op, cand: Candidate, index: int) -> tuple[tuple[Region, int], ...]:
    """(region, device) pairs of input `index` that the candidate's tuples read, deduplicated."""
    seen: dict[tuple[Region, int], None] = {}
    for t, devs in zip(tuples(op, cand.dec), cand.devices):
        for d in devs:
            seen.setdefault((t.in_regions[index], d), None)
    return tuple(seen)


def rereads(graph) -> dict[str, str]:
    """Activations that several ops read, each mapped to its first reader in graph order: the
    head. Lowering delivers the head's needs from the producer's layout; every later reader's
    needs come from the head's (`needs_layout`), so a block the head gathered is not sent again,
    and the optimizer prices each later reader from the head's needs, not once per reader from
    the producer. Weights (prefetched on their own queues) and constants are left out, and so
    is a tensor whose head does not read it whole (its needs would not be a layout of it)."""
    readers: dict[str, list[str]] = {}
    heads: dict[str, Op] = {}
    for op in graph.ops:
        for name in dict.fromkeys(op.inputs):
            if graph.tensor(name).kind in ("weight", "constant"):
                continue
            readers.setdefault(name, []).append(op.name)
            heads.setdefault(name, op)
    return {name: heads[name].name for name, ops in readers.items()
            if len(ops) > 1 and _reads_whole(heads[name], name, graph.tensor(name).shape)}


def _reads_whole(op: Op, name: str, shape: tuple[int, ...]) -> bool:
    """Whether op's tuples read every element of input `name` (those of one whole tuple do)
    in blocks that are disjoint or equal: a read through a window overlaps its neighbours'
    (the halo), which is no layout."""
    whole = tuple((0, n) for n in shape)
    (t,) = tuples(op, Decomposition(tuple((m, 1) for m in op.modes)))
    return any(r == whole and not any(m in op.window for g in d for m in g)
               for r, n, d in zip(t.in_regions, op.inputs, op.in_dims) if n == name)


def needs_layout(needs: Sequence[tuple[Region, int]]) -> tuple[Piece, ...]:
    """A reader's needs as a layout: each (region, device) a whole block held there."""
    return tuple(Piece(reg, d, 0, 1) for reg, d in needs)


@lru_cache(maxsize=4096)
def input_op(info: TensorInfo) -> Op:
    """The identity op whose output is a graph input: its layout is decomposed like an op's."""
    letters = "abcdefghijklmnopqrstuvwxyz"[:len(info.shape)]
    op = make_op(INPUT_PREFIX + info.name, f"{letters}->{letters}", [info.name], info.name,
                 {info.name: info.shape}, join=arg(0), source=info.source)
    return op


def _with_inputs(graph, cand, input_cand=None) -> dict[str, Candidate]:
    choice = {op.name: cand(op) for op in graph.ops}
    for info in graph.inputs:
        choice[INPUT_PREFIX + info.name] = (input_cand or cand)(input_op(info))
    return choice


def split_choice(graph, n: int, prefer: Sequence[str],
                 inputs_on: int | None = None) -> dict[str, Candidate]:
    """A hand-made plan: each op (and input) splits the first mode of `prefer` that divides n
    ways, else runs replicated on all n devices; `inputs_on` stores every input on one device."""
    def cand(op: Op) -> Candidate:
        for m in prefer:
            if m in op.modes and op.can_split(m) and op.size[m] % n == 0:
                return place(op, {m: n}, list(range(n)))
        return place(op, {}, list(range(n)))
    on_one = None if inputs_on is None else (lambda op: place(op, {}, [inputs_on]))
    return _with_inputs(graph, cand, on_one)


def random_choice(graph, n: int, rng, *, exact: bool = False,
                  scatter: float = 0.0) -> dict[str, Candidate]:
    """A uniformly random legal plan on n devices (tests and random-plan baselines).

    `exact` prefers decompositions with exactly n tuples; with probability `scatter` a
    candidate's tuples go to arbitrary devices (repeats allowed) instead of a permutation."""
    def cand(op: Op) -> Candidate:
        decs = list(decompositions(op, n))
        if exact:
            decs = [d for d in decs if d.n_tuples == n] or decs
        dec = rng.choice(decs)
        if scatter and rng.random() < scatter:
            devs = [rng.randrange(n) for _ in range(dec.n_tuples)]
        else:
            devs = list(range(n))
            rng.shuffle(devs)
        return place(op, dec.part, devs)
    return _with_inputs(graph, cand)


def one_device_choice(graph, device: int = 0) -> dict[str, Candidate]:
    """Every op and graph input whole on one device: the plan that sends nothing."""
    return _with_inputs(graph, lambda op: place(op, {}, [device], f"whole on device {device}"))
