"""Multi-node launch: `torchrun --nnodes 2 --nproc-per-node 2 -m einsummable.runtime.dist` as
two separate agents (two "nodes" meeting on 127.0.0.1, static rendezvous) runs a plan for a
2 x 2 topology and rank 0's outputs equal the single-device reference; launches that do not
match the plan fail with a named error before any rank connects. Every subprocess runs under a
timeout and is killed, with its ranks, when the test fails."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from einsummable.backend.runtime.launch import Launch, check_launch, from_env
from einsummable.errors import PlanError
from einsummable.frontend.reference import evaluate
from einsummable.optimizer.api import named_plan
from einsummable.topology import load_topology, read_topology

from helpers import llama_tiny, rel_err

ROOT = Path(__file__).resolve().parent.parent
# Seconds the two agents may take together: four ranks import torch on a 2-core machine.
AGENTS_TIMEOUT_S = 240


def _two_nodes_of_two():
    """cpu4's devices and figures, as 2 nodes of 2 ranks (what the launch below starts)."""
    import yaml
    doc = yaml.safe_load((ROOT / "topologies" / "cpu4.yaml").read_text())
    doc["name"] = "cpu2x2"
    doc["nodes"] = {"count": 2, "devices_per_node": 2, "device_type": "cpu"}
    doc["levels"] = [{"name": "node", "groups": "per_node"},
                     {"name": "rank", "groups": "per_device"}]
    return read_topology(doc, "cpu2x2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agents(plan: Path, tmp: Path, nnodes: int, nproc: int, *extra: str) -> list:
    """Start one torchrun agent per node, each in its own process group (so that a failed
    test can kill it with its ranks); returns (process, node rank) pairs."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
               "--nproc-per-node", str(nproc), "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "einsummable.runtime.dist", str(plan), "--backend", "gloo", *extra]
        procs.append(subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return procs


def _finish(procs: list) -> list[tuple[int, str]]:
    """(exit code, output) of each agent; on a timeout every agent's group is killed and the
    test fails with what they printed."""
    out = []
    deadline = time.monotonic() + AGENTS_TIMEOUT_S
    try:
        for p in procs:
            text, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            out.append((p.returncode, text))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        texts = [p.communicate()[0] for p in procs]
        pytest.fail(f"torchrun agents still running after {AGENTS_TIMEOUT_S} s:\n"
                    + "\n---\n".join(t[-3000:] for t in texts))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return out


def test_two_torchrun_agents_of_two_ranks_equal_the_reference(tmp_path):
    g, ins, _ = llama_tiny()
    topo = _two_nodes_of_two()
    plan = named_plan(g, topo, "megatron-tp")
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    torch.save(ins, tmp_path / "in.pt")
    results = _finish(_agents(path, tmp_path, 2, 2, "--inputs", "in.pt", "--out", "out.pt"))
    for node, (code, text) in enumerate(results):
        assert code == 0, f"node {node}'s agent exited {code}:\n{text[-3000:]}"
    got = torch.load(tmp_path / "out.pt")
    want = evaluate(g, ins)[g.outputs[0]]
    assert rel_err(got[g.outputs[0]], want) <= 1e-5


def test_a_launch_of_other_nodes_than_the_plan_fails_naming_both(tmp_path):
    # The plan is for one node of 4 ranks (cpu4); 2 agents of 2 ranks each are refused by
    # every rank before it connects, saying what to launch.
    g, _, _ = llama_tiny()
    path = tmp_path / "plan.json"
    path.write_text(named_plan(g, load_topology("cpu4"), "megatron-tp").to_json())
    results = _finish(_agents(path, tmp_path, 2, 2))
    for code, text in results:
        assert code != 0
        assert "--nnodes 1 --nproc-per-node 4" in text, text[-3000:]


def test_check_launch_rules():
    topo = _two_nodes_of_two()
    check_launch(Launch(rank=3, local_rank=1, world=4, local_world=2, node=1), 4, topo)
    with pytest.raises(PlanError, match="for 4 ranks but torchrun started 6"):
        check_launch(Launch(rank=0, local_rank=0, world=6, local_world=3, node=0), 4, topo)
    with pytest.raises(PlanError, match="--nnodes 2 --nproc-per-node 2"):
        check_launch(Launch(rank=1, local_rank=1, world=4, local_world=4, node=0), 4, topo)
    # a lowered bundle names no topology: only the world size is checked
    check_launch(Launch(rank=1, local_rank=1, world=4, local_world=4, node=0), 4, None)


def test_from_env_names_what_torchrun_did_not_set():
    env = {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1"}
    assert from_env(env) == Launch(rank=2, local_rank=0, world=4, local_world=2, node=1)
    del env["GROUP_RANK"]
    with pytest.raises(PlanError, match="GROUP_RANK not set"):
        from_env(env)
