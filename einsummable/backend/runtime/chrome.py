"""Timelines as Chrome trace JSON (chrome://tracing, Perfetto): one track per rank, a slice per
instruction (kernels, sends, receives, reductions, host steps) and a `wait` slice wherever a
rank reached an instruction before its inputs were there.

Both executors' timelines have one shape, (rank, pc, kind, reached_s, start_s, end_s): the
simulator's (`simulate_programs(..., trace=True)`) and the measured gloo ranks'
(`Pool.trace`, from `dist.execute`'s timeline; a rank's `perf_counter` is the machine's
monotonic clock, so the ranks share a time base). Times are written in microseconds from the
earliest event, as the format wants.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from ...core.program import Compute, Pack, Recv, Reduce, Send, Unpack
from ..lowering import Lowered

Event = tuple[int, int, str, float, float, float]  # rank, pc, kind, reached, start, end
US = 1e6  # the format's unit: microseconds
# Slices shorter than this are host bookkeeping the viewer cannot show; they are kept (the
# file is complete) but not given a wait before them.
MIN_WAIT_S = 1e-9


def _what(low: Lowered, rank: int, pc: int, kind: str) -> tuple[str, str, dict]:
    """(name, category, args) of one instruction."""
    ins = low.programs[rank].instrs[pc]
    if isinstance(ins, Compute):
        return ins.op, "kernel", {"op": ins.op, "ranges": [list(r) for r in ins.ranges]}
    if isinstance(ins, Send):
        return f"send to rank {ins.peer}", "send", {"peer": ins.peer, "tag": ins.tag}
    if isinstance(ins, Recv):
        return f"recv from rank {ins.peer}", "recv", {"peer": ins.peer, "tag": ins.tag,
                                                      "shape": list(ins.shape)}
    if isinstance(ins, Reduce):
        return f"reduce ({ins.agg})", "kernel", {"inputs": len(ins.inputs)}
    if isinstance(ins, (Pack, Unpack)):
        return kind.lower(), "copy", {}
    return kind, "host", {}


def chrome_trace(low: Lowered, events: Iterable[Event], label: str) -> dict:
    """The trace document of `events` (module docstring); `label` names the process track
    (e.g. "simulated on a100x8" or "measured, 4 gloo ranks")."""
    events = list(events)
    t0 = min((e[3] for e in events), default=0.0)
    out: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                        "args": {"name": label}}]
    for r in range(low.world_size):
        out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                    "args": {"name": f"rank {r}"}})
    for rank, pc, kind, reached, start, end in events:
        name, cat, args = _what(low, rank, pc, kind)
        if start - reached > MIN_WAIT_S:
            out.append({"name": "wait", "cat": "wait", "ph": "X", "pid": 0, "tid": rank,
                        "ts": (reached - t0) * US, "dur": (start - reached) * US,
                        "args": {"for": name}})
        out.append({"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": rank,
                    "ts": (start - t0) * US, "dur": max(0.0, end - start) * US,
                    "args": {**args, "pc": pc}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, low: Lowered, events: Iterable[Event], label: str) -> None:
    Path(path).write_text(json.dumps(chrome_trace(low, events, label)))
