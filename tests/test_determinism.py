"""The same graph, topology and options give the same plan bytes in fresh processes, whatever
their string hashing (PYTHONHASHSEED differs per process, so an order that leans on set or
dict-of-hash iteration shows)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys
import einsummable as es
from einsummable.models import preset
module, (x,) = preset("llama-tiny", batch=4, seq=int(sys.argv[2]), device="meta")
plan = es.optimize(es.trace(module, (x,)), sys.argv[1], steady_state=True, cache=False)
sys.stdout.write(plan.to_json())
"""


def _plans_bytes(topology: str, seq: int, seeds: tuple[int, ...]) -> list[str]:
    """Each seed's plan, the processes side by side (the machine's cores, not one at a time)."""
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, topology, str(seq)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)})
             for seed in seeds]
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-2000:]
            outs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    return outs


@pytest.mark.parametrize("topology,seq", [
    ("cpu4", 512), ("a100x8", 2048),
    pytest.param("h100x8x2", 256, marks=pytest.mark.slow)])  # 35 s a process here
def test_plans_are_byte_identical_across_fresh_processes(topology, seq):
    plans = _plans_bytes(topology, seq, (1, 2, 3))
    assert plans[0] and plans[0] == plans[1] == plans[2]
