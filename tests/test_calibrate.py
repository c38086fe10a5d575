"""`einsummable calibrate`: the device mode (cpu here: the same code paths as cuda), the gloo
ranks with their dependent-round link fit, the curve fit, and experiments/gpu_check's CPU mode.

Nothing here depends on this machine's speed: the checks are on structure (files load,
curves are curves, reports have their fields) and on relations (the fit reproduces what it
was fitted on, recovers figures it was made from)."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
import yaml

from einsummable.backend.runtime.local import run_local
from einsummable.backend.runtime.simulator import simulate_programs
from einsummable.cli import main as cli
from einsummable.commands.calibrate import cpu_yaml, device_yaml, ranks, rounds
from einsummable.topology import load_topology, read_topology

CUDA = torch.cuda.is_available()


def _assert_curve(curve) -> None:
    flops = [f for f, _ in curve.points]
    fracs = [v for _, v in curve.points]
    assert all(b > a for a, b in itertools.pairwise(flops))  # a curve over FLOPs
    assert all(b >= a for a, b in itertools.pairwise(fracs))  # pooled: never dips
    assert all(0 < v <= 1 for v in fracs)


# ----------------------------------------------------------------------------- --device cpu

@pytest.fixture(scope="module")
def device_yaml_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("dev") / "cpu_device.yaml"
    assert cli(["calibrate", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    return out


def test_device_cpu_writes_a_loadable_device_type(device_yaml_path):
    topo = load_topology(device_yaml_path)
    assert topo.world_size == 1
    dev = topo.devices[0]
    a = dev.achieved
    assert len(a.matmul.points) >= 2 and len(a.attention.points) >= 2
    _assert_curve(a.matmul)
    _assert_curve(a.attention)
    assert 0 < a.memory <= 1 and 0 <= a.transfer_slowdown < 1
    assert dev.launch_s > 0 and dev.mem_bw > 0 and min(dev.peak_flops.values()) > 0
    text = device_yaml_path.read_text()
    # which reference each fraction is of is written down
    assert "best measured GEMM" in text and "device-to-device copy" in text
    assert text.startswith("#") and "MEASURED" in text
    # the device_types entry is the product: it stands alone in another topology
    entry = yaml.safe_load(text)["device_types"]["cpu"]
    two = read_topology({"name": "two", "device_types": {"cpu": entry},
                         "nodes": {"count": 1, "devices_per_node": 2, "device_type": "cpu"},
                         "links": [{"kind": "pcie", "pairs": "all", "bw": 1e9,
                                    "latency": 1e-5}]})
    assert two.devices[1].achieved == a


def test_device_datasheet_figures_are_used_and_named(tmp_path, capsys):
    out = tmp_path / "d.yaml"
    code = cli(["calibrate", "--device", "cpu", "--quick", "--peak-flops",
                "float32=1e15,fp16=2 PFLOP/s", "--mem-bw", "1 PB/s", "--out", str(out),
                "--json"])
    assert code == 0
    got = json.loads(capsys.readouterr().out)
    assert got["peak_flops"]["float32"] == 1e15 and got["peak_flops"]["float16"] == 2e15
    assert got["peak_source"]["float32"] == "datasheet (given)"
    assert got["peak_source"]["bfloat16"] == "best measured GEMM"
    dev = load_topology(out).devices[0]
    assert dev.mem_bw == pytest.approx(1e15, rel=1e-3)
    # nothing on this machine reaches a petaflop: every measured fraction of it is tiny
    # (written with four decimals, so up to half a unit of the fourth above the measured one)
    best = max(p["rate"] for p in got["points"] if p["kind"] == "gemm")
    written = 0.5e-4
    assert max(v for _, v in dev.achieved.matmul.points) <= max(best / 1e15, 1e-4) + written
    assert "datasheet (given)" in out.read_text()


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_says_what_to_do(capsys):
    assert cli(["calibrate", "--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "--device cpu" in err


@pytest.mark.parametrize("bad, flag", [(["--peak-flops", "float16"], "--peak-flops"),
                                       (["--peak-flops", "fp8=1e12"], "--peak-flops"),
                                       (["--mem-bw", "fast"], "--mem-bw")])
def test_bad_datasheet_figures_are_named(bad, flag, capsys):
    assert cli(["calibrate", "--device", "cpu", "--quick", *bad]) == 2
    assert flag in capsys.readouterr().err


def test_curve_bins_pools_and_clips():
    pts = [(1e6, 0.2), (1.1e6, 0.4), (1e8, 0.1), (1e9, 0.7), (1e10, 1.3), (1e10, 0.9)]
    c = device_yaml.curve(pts)
    _assert_curve(c)
    # 1e6 and 1.1e6 share a bin (median 0.3, two points); the dip at 1e8 (one point) is
    # pooled with it: (2 · 0.3 + 0.1) / 3 each
    assert c.points[0][1] == pytest.approx(0.7 / 3, abs=1e-4)
    assert c.points[1][1] == c.points[0][1]
    assert c.points[-1][1] == 1.0  # the median of 1.3 and 0.9 is over peak: clipped
    assert len(c.points) == 4


# ----------------------------------------------------------------------------- chains, fit

def test_chain_programs_run_and_deliver_the_block():
    effort = rounds.ChainEffort(hops=4, multi=3, large_bytes=64, trials=1)
    for world in (2, 3, 4):
        for rnd in ranks.pairs_rounds(world) + [[(1, 0)]]:
            for kind in rounds.CHAINS:
                low = rounds.chain_program(world, rnd, kind, effort)
                inputs = rounds.chain_inputs(low)
                x = torch.arange(low.graph.tensor("x").shape[0], dtype=torch.float32)
                assert torch.equal(run_local(low, {**inputs, "x": x})["y"], x)
                assert simulate_programs(low, load_topology("cpu4") if world == 4
                                         else _cpu_topo(world, 1e-4, 2e-5, 1e9)).time_s > 0


def _measured(world: int) -> ranks.Measured:
    return ranks.Measured(world, 1, {"float16": 1e9, "bfloat16": 1e9, "float32": 3e10}, 1e10,
                          1e9, 3e-5, 2e9, 8e-5, 4e-5)


def _cpu_topo(world: int, lat: float, msg: float, bw: float, wait: float = 0.0):
    return cpu_yaml.topology(_measured(world), lat, msg, bw, wait)


@pytest.mark.parametrize("world", [2, 4])
def test_the_fit_recovers_the_figures_a_chain_was_made_with(world):
    effort = rounds.ChainEffort(hops=8, multi=4, large_bytes=1 << 16, trials=1)
    lows = [rounds.chain_program(world, ranks.pairs_rounds(world)[0], k, effort)
            for k in rounds.CHAINS]
    truth = (3e-4, 5e-5, 7e8, 6e-4)
    made = [simulate_programs(low, _cpu_topo(world, *truth)).time_s for low in lows]
    chains = tuple(rounds.ChainTime(k, effort.hops, 1, 1, t, 0.0, 1)
                   for k, t in zip(rounds.CHAINS, made))
    fit = rounds.fit_links(chains, lows, lambda *x: _cpu_topo(world, *x), (1e-5, 1e-6, 1e10))
    assert fit.latency_s == pytest.approx(truth[0], rel=1e-3)
    assert fit.message_s == pytest.approx(truth[1], rel=1e-3)
    assert fit.bw == pytest.approx(truth[2], rel=1e-3)
    assert fit.exchange_wait_s == pytest.approx(truth[3], rel=1e-3)
    assert fit.max_rel_error < 1e-3 and not fit.bounded


def test_only_crossing_messages_pay_the_exchange_wait():
    # duplex's messages cross (both ranks send at once): each hop pays the wait; the one-way
    # chains' replies leave after the request arrived: none of their hops does
    effort = rounds.ChainEffort(hops=8, multi=4, large_bytes=1 << 16, trials=1)
    for kind in rounds.CHAINS:
        low = rounds.chain_program(2, [(0, 1)], kind, effort)
        base = simulate_programs(low, _cpu_topo(2, 1e-4, 1e-5, 1e9)).time_s
        waited = simulate_programs(low, _cpu_topo(2, 1e-4, 1e-5, 1e9, 1e-3)).time_s
        expected = effort.hops * 1e-3 if kind == "duplex" else 0.0
        assert waited - base == pytest.approx(expected, abs=1e-9), kind


def test_the_fit_holds_an_impossible_figure_at_its_bound():
    # multi faster than tiny (noise can do that): no message cost explains it; message -> 0
    effort = rounds.ChainEffort(hops=8, multi=4, large_bytes=1 << 16, trials=1)
    lows = [rounds.chain_program(2, [(0, 1)], k, effort) for k in rounds.CHAINS]
    chains = tuple(rounds.ChainTime(k, 8, 1, 1, t, 0.0, 1)
                   for k, t in zip(rounds.CHAINS, (0.004, 0.003, 0.02, 0.01)))
    fit = rounds.fit_links(chains, lows, lambda *x: _cpu_topo(2, *x), (1e-4, 1e-5, 1e9))
    assert fit.message_s == 0.0 and "message" in fit.bounded
    assert fit.latency_s > 0 and math.isfinite(fit.bw) and fit.bw > 0


def test_bounded_solve_is_exact_when_it_can_be():
    a = np.array([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])
    x = np.array([0.5, 0.25, 1.0])
    got, held = rounds._bounded_solve(a, a @ x, np.zeros(3))
    assert np.allclose(got, x) and held == ()


# ----------------------------------------------------------------------------- gloo ranks

@pytest.fixture(scope="module")
def ranks_run(tmp_path_factory):
    """One `calibrate --world-size 2 --quick` run shared by the tests below."""
    out = tmp_path_factory.mktemp("ranks") / "cpu2.yaml"
    efforts = []
    real = ranks.measure
    with pytest.MonkeyPatch.context() as mp, _Capture() as cap:
        mp.setattr(ranks, "measure", lambda world, effort: efforts.append(effort)
                   or real(world, effort))
        code = cli(["calibrate", "--world-size", "2", "--quick", "--out", str(out), "--json"])
    return code, efforts, json.loads(cap.text), out


class _Capture:
    """stdout of a block, for a module-scoped fixture (capsys is per test)."""

    def __enter__(self):
        import contextlib
        import io
        self._buf = io.StringIO()
        self._cm = contextlib.redirect_stdout(self._buf)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        self.text = self._buf.getvalue()


def test_calibrate_quick_writes_a_loadable_topology(ranks_run):
    code, efforts, got, out = ranks_run
    assert code == 0 and efforts == [ranks.QUICK]
    text = out.read_text()
    assert text.startswith("#") and "MEASURED" in text and "FITTED to dependent" in text
    assert "Independent batches" in text  # the old figures, kept for comparison
    topo = read_topology(yaml.safe_load(text))
    assert topo.world_size == 2
    assert topo.devices[0].launch_s > 0 and topo.devices[0].peak("float32") > 1e6
    # the topology holds the fitted link figures (written to four digits)
    fit = got["fit"]
    assert topo.link(0, 1).bw == pytest.approx(fit["bw"], rel=1e-3)
    assert topo.link(0, 1).latency_s == pytest.approx(fit["latency_s"], rel=1e-3, abs=1e-9)
    assert topo.devices[0].message_s == pytest.approx(fit["message_s"], rel=1e-3, abs=1e-9)
    assert topo.devices[0].exchange_wait_s == pytest.approx(fit["exchange_wait_s"], rel=1e-3,
                                                            abs=1e-9)
    # the achieved curves fitted to the kernels every rank timed with all ranks running
    a = topo.devices[0].achieved
    _assert_curve(a.matmul)
    _assert_curve(a.attention)
    assert len(a.matmul.points) >= 2 and 0 < a.memory <= 1
    assert got["measured"]["kernels"]


def test_the_written_topology_reproduces_the_chains_it_was_fitted_on(ranks_run):
    _, _, got, out = ranks_run
    topo = load_topology(out)
    effort = rounds.ChainEffort(**got["chain_effort"])
    pairs = ranks.pairs_rounds(2)[0]
    for chain, fitted in zip(got["chains"], got["fit"]["simulated_s"]):
        low = rounds.chain_program(2, pairs, chain["kind"], effort)
        sim = simulate_programs(low, topo).time_s
        assert sim == pytest.approx(fitted, rel=0.01)          # the file holds the fit
        # and the fit meets the measurement: exactly at its median where no bound binds;
        # where one does (noisy quick chains can contradict each other), the least-squares
        # compromise and its worst mismatch are written down
        if not got["fit"]["bounded"]:
            assert sim == pytest.approx(chain["measured_s"], rel=0.01)
    if got["fit"]["bounded"]:
        text = out.read_text()
        assert "held at a bound" in text
        assert f"{got['fit']['max_rel_error'] * 100:.2f}%" in text


# ----------------------------------------------------------------------------- gpu_check

def test_gpu_check_cpu_mode_writes_its_report(tmp_path, device_yaml_path, capsys):
    from experiments import gpu_check
    out = tmp_path / "report.json"
    code = gpu_check.main(["--device", "cpu", "--tokens", "8", "--plans", "tp1,tp2,seq2",
                           "--repeats", "1", "--device-yaml", str(device_yaml_path),
                           "--out", str(out)])
    assert code == 0
    rep = json.loads(out.read_text())
    for key in ("device", "device_name", "torch", "dtype", "model", "topology", "dist",
                "programs", "kernels", "pearson", "skipped", "all_ok", "notes"):
        assert key in rep, key
    assert rep["all_ok"] and rep["dist"]["backend"] == "gloo"
    assert [p["plan"] for p in rep["programs"]] == ["tp1", "tp2", "seq2"]
    for p in rep["programs"]:
        assert p["ok"] and p["measured_s"] > 0 and p["simulated_s"] > 0 and p["dist_s"] > 0
        assert p["kernels"] == sum(1 for k in rep["kernels"] if k["plan"] == p["plan"])
    split = {p["plan"]: p["instructions"] for p in rep["programs"]}
    assert split["tp2"] > split["tp1"]  # the split plans run more, smaller kernels
    kinds = {k["class"] for k in rep["kernels"]}
    assert {"matmul", "attention"} <= kinds
    assert set(rep["pearson"]) == {"programs", "kernels", "kernels_log"}
    assert rep["topology"]["name"] == "cpux1"
    assert "pearson r" in capsys.readouterr().out


def test_gpu_check_cuda_without_a_gpu_says_what_to_do(capsys):
    if CUDA:
        pytest.skip("this machine has a GPU")
    from experiments import gpu_check
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_local_executor_runs_on_the_device_it_is_given():
    from einsummable.backend.lowering import lower
    from einsummable.frontend.builder import Builder
    from einsummable.frontend.reference import evaluate
    from einsummable.planning.placement import split_choice
    from einsummable.topology import synthetic
    b = Builder()
    x, w = b.input("x", (6, 8)), b.weight("w", (8, 4))
    g = b.build([b.einsum("ij,jk->ik", x, w).silu()])
    low = lower(g, split_choice(g, 2, "ij"), synthetic(2))
    ins = {"x": torch.randn(6, 8), "w": torch.randn(8, 4)}
    want = evaluate(g, ins)
    name = g.outputs[0]
    for dev in ("cpu", torch.device("cpu")) + (("cuda",) if CUDA else ()):
        got = run_local(low, ins, device=dev)[name]
        assert got.device.type == torch.device(dev).type
        assert torch.allclose(got.cpu(), want[name], atol=1e-5)
