"""CLI `run` (a tiny plan, checked against the reference, --json); `calibrate` is tested in
tests/test_calibrate.py."""
from __future__ import annotations

import json

import pytest

from einsummable.cli import main as cli
from einsummable.frontend.builder import Builder
from einsummable.optimizer.api import optimize
from einsummable.topology import load_topology


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory) -> str:
    """A tiny plan on the (calibrated) cpu4 topology: a matmul and an elementwise op."""
    b = Builder()
    x = b.input("x", (8, 16))
    w = b.weight("w", (16, 12))
    y = b.einsum("ij,jk->ik", x, w).silu()
    plan = optimize(b.build([y]), load_topology("cpu4"), cache=False)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(plan.to_json())
    return str(path)


@pytest.mark.parametrize("backend", ["local", "gloo"])
def test_run_checks_a_tiny_plan(plan_path, backend, capsys):
    code = cli(["run", plan_path, "--backend", backend, "--check", "--json", "--repeats", "1"])
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object, nothing else
    assert code == 0
    assert out["ok"] and out["max_rel_error"] < 1e-4 and out["time_s"] > 0
    assert out["world_size"] == 4 and out["backend"] == backend


def test_run_rejects_a_world_size_mismatch(plan_path, capsys):
    assert cli(["run", plan_path, "--world-size", "3"]) == 2
    assert "4 ranks" in capsys.readouterr().err


def _check_chrome_trace(path, world: int) -> list[dict]:
    """A Chrome trace document: complete ('X') slices with numeric times on every rank's
    track, and a name for every track."""
    doc = json.loads(open(path).read())
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in slices)
    assert {e["tid"] for e in slices} == set(range(world))
    names = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == set(range(world))
    return slices


def test_show_writes_the_simulated_schedule_as_a_chrome_trace(plan_path, tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert cli(["show", plan_path, "--no-strategies", "--trace", str(out)]) == 0
    slices = _check_chrome_trace(out, 4)
    assert {"kernel"} <= {e["cat"] for e in slices}


def test_run_writes_the_measured_timeline_as_a_chrome_trace(plan_path, tmp_path, capsys):
    out = tmp_path / "measured.json"
    assert cli(["run", plan_path, "--backend", "gloo", "--repeats", "1", "--trace",
                str(out)]) == 0
    slices = _check_chrome_trace(out, 4)
    assert {"kernel"} <= {e["cat"] for e in slices}


def test_run_trace_needs_gloo(plan_path, tmp_path, capsys):
    assert cli(["run", plan_path, "--trace", str(tmp_path / "x.json")]) == 2
    assert "--backend gloo" in capsys.readouterr().err
