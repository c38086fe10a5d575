"""Run a plan under torchrun: every rank reads the plan and runs its own program.

    torchrun --nnodes N --nproc-per-node G -m einsummable.runtime.dist plan.json \
        [--inputs in.pt] [--out out.pt] [--backend nccl|gloo]

(`einsummable.runtime.dist` calls `main` here.) The plan is a lowered program bundle or a Plan
JSON; every node needs the plan (and `--inputs`) at the same path; rank 0 writes the outputs.
Rank p runs program p on GPU LOCAL_RANK of its node; a launch whose nodes and ranks per node
are not the plan's is refused before any rank connects (`launch.py`). Every wait has a
timeout: the process group's setup and each receive and send (`dist.WAIT_TIMEOUT_S`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

import torch

from ...errors import EinsummableError, RuntimeFault
from ...planning.plan import Plan
from ..lowering import Lowered, lower
from ...frontend.inputs import conform_inputs
from ...frontend.reference import TORCH_DTYPES
from ...topology import Topology
from .dist import WAIT_TIMEOUT_S, execute, forbid_collectives, rank_blocks
from .launch import check_launch, from_env


def _load_bundle(text: str) -> tuple[Lowered, Topology | None]:
    """The programs, and the topology they were planned on where the file names it."""
    d = json.loads(text)
    if "programs" in d:
        return Lowered.from_json(text), None
    plan = Plan.from_json(text)
    return lower(plan), plan.topology


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchrun ... -m einsummable.runtime.dist",
                                 description="Run a lowered plan under torchrun.")
    ap.add_argument("plan", help="lowered program bundle or Plan JSON")
    ap.add_argument("--inputs", help="torch.save'd dict of graph inputs (default: seeded randn)")
    ap.add_argument("--out", help="rank 0 writes the outputs here (torch.save)")
    ap.add_argument("--backend", default=None, help="gloo or nccl (default: nccl if CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except RuntimeFault as e:  # a peer died or stalled while this rank ran
        print(f"einsummable: {e}", file=sys.stderr)
        return 3
    except EinsummableError as e:  # the launch or the plan is wrong: nothing ran
        print(f"einsummable: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    me = from_env()
    with open(args.plan) as f:
        low, topology = _load_bundle(f.read())
    check_launch(me, low.world_size, topology)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device: Any = "cpu"
    if backend == "nccl":
        device = torch.device("cuda", me.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=WAIT_TIMEOUT_S))
    forbid_collectives()  # exchange programs are point-to-point; a collective is a bug
    if args.inputs:
        inputs = conform_inputs(low.graph, torch.load(args.inputs))
    else:
        gen = torch.Generator().manual_seed(args.seed)
        inputs = {t.name: torch.randn(t.shape, generator=gen).to(TORCH_DTYPES[t.dtype])
                  for t in low.graph.inputs}
    outs = execute(low, me.rank, rank_blocks(low, me.rank, inputs), device)
    if me.rank == 0 and args.out:
        torch.save({k: v.cpu() for k, v in outs.items()}, args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
