"""Run a plan under torchrun: every rank reads the plan and runs its own program.

    torchrun --nproc-per-node 8 -m einsummable.backend.runtime.torchrun plan.json \
        [--inputs in.pt] [--out out.pt] [--backend nccl|gloo]

The plan is a lowered program bundle or a Plan JSON; rank 0 writes the outputs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

import torch

from ...errors import RuntimeFault
from ...planning.plan import Plan
from ..lowering import Lowered, lower
from ...frontend.inputs import conform_inputs
from ...frontend.reference import TORCH_DTYPES
from .dist import WAIT_TIMEOUT_S, execute, rank_blocks


def _load_bundle(text: str) -> Lowered:
    d = json.loads(text)
    if "programs" in d:
        return Lowered.from_json(text)
    return lower(Plan.from_json(text))


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist
    ap = argparse.ArgumentParser(prog="python -m einsummable.backend.runtime.torchrun",
                                 description="Run a lowered plan under torchrun.")
    ap.add_argument("plan", help="lowered program bundle or Plan JSON")
    ap.add_argument("--inputs", help="torch.save'd dict of graph inputs (default: seeded randn)")
    ap.add_argument("--out", help="rank 0 writes the outputs here (torch.save)")
    ap.add_argument("--backend", default=None, help="gloo or nccl (default: nccl if CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(args.plan) as f:
        low = _load_bundle(f.read())
    if world != low.world_size:
        print(f"einsummable: the plan is for {low.world_size} ranks but torchrun started "
              f"{world}; fix: --nproc-per-node/--nnodes must give {low.world_size}",
              file=sys.stderr)
        return 2
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device: Any = "cpu"
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=WAIT_TIMEOUT_S))
    if args.inputs:
        inputs = conform_inputs(low.graph, torch.load(args.inputs))
    else:
        gen = torch.Generator().manual_seed(args.seed)
        inputs = {t.name: torch.randn(t.shape, generator=gen).to(TORCH_DTYPES[t.dtype])
                  for t in low.graph.inputs}
    try:
        outs = execute(low, rank, rank_blocks(low, rank, inputs), device)
    except RuntimeFault as e:
        print(f"einsummable: {e}", file=sys.stderr)
        return 3
    if rank == 0 and args.out:
        torch.save({k: v.cpu() for k, v in outs.items()}, args.out)
    dist.destroy_process_group()
    return 0



if __name__ == "__main__":
    sys.exit(main())
