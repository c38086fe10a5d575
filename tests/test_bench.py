"""`einsummable-bench` end to end on a tiny config, and the figures from a small results file."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments import bench, harness
from paper_figs.cli import draw_all

ROOT = Path(__file__).resolve().parent.parent

TINY = {
    "name": "tiny_test", "kind": "blocks", "mode": "measured", "topology": "cpu4",
    "world_sizes": [2], "dtype": "float32", "weights": "sharded", "steady_state": True,
    "systems": ["einsummable", "pytorch", "pytorch-tp", "pytorch-tp-sp", "data-parallel", "vllm"],
    "warmup": 1, "repeats": 3, "timeout_s": 120,
    "workloads": [{"name": "tiny-32", "model": "llama-tiny", "batch": 2, "seq": 16}],
}


def test_tiny_config_end_to_end(tmp_path: Path) -> None:
    cfg_path = tmp_path / "tiny.yaml"
    cfg_path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "experiments.bench", str(cfg_path),
                           "--out", str(out), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert "tiny_test [" in proc.stderr  # the progress bar went to stderr
    by_system = {r["system"]: r for r in doc["rows"]}
    for s in ("pytorch", "pytorch-tp", "pytorch-tp-sp", "data-parallel", "floor", "floor-fused"):
        assert by_system[s]["time_s"] > 0 and by_system[s]["unavailable"] is None, by_system[s]
        assert by_system[s]["max_abs_err"] <= 1e-3
    assert by_system["vllm"]["time_s"] is None and by_system["vllm"]["unavailable"]
    # The run's floor is the faster of the module's kernels and einsummable's own.
    assert by_system["pytorch-tp"]["floor_s"] == min(by_system["floor"]["time_s"],
                                                     by_system["floor-fused"]["time_s"])
    e = by_system["einsummable"]
    assert (e["time_s"] is not None) != (e["unavailable"] is not None)  # a number or a reason
    assert (out / "tiny_test.json").exists()
    with open(out / "tiny_test.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["system"] for r in rows} >= {"pytorch-tp", "floor", "vllm"}

    # The printed table has ratios to pytorch-tp (two systems are enough to show them).
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**TINY, "systems": ["pytorch", "pytorch-tp"]}))
    table = subprocess.run([sys.executable, "-m", "experiments.bench", str(small),
                            "--out", str(out), "--repeats", "2"], cwd=ROOT,
                           capture_output=True, text=True, timeout=240)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "/pytorch-tp" in table.stdout and "1.00" in table.stdout


def _small_results(dir_: Path) -> None:
    rows = []
    for tokens, base in ((128, 1e-3), (512, 3e-3)):
        for s, f in (("pytorch-tp", 1.0), ("einsummable", 0.8), ("floor", 0.7)):
            rows.append(harness.Row("small", f"w{tokens}", s, 4, tokens, base * f, 1e-4,
                                    floor_s=base * 0.7,
                                    extra={"predicted_s": base * f * 1.1}).to_dict())
    doc = {"config": "small", "kind": "blocks", "mode": "measured", "rows": rows,
           "plans": {"w128@4": {"world": 4, "link_bytes": [[0, 1, 1000], [2, 3, 500]],
                                "ops": [{"op": "linear", "split": "gpu: b/4", "bytes_in": 2e6}]}}}
    (dir_ / "small.json").write_text(json.dumps(doc))
    rand = {"config": "rand", "kind": "random_plans", "mode": "simulated",
            "rows": [], "optimized_s": 1e-3, "random_s": [2e-3, 2.5e-3, 3e-3, 1.5e-3]}
    (dir_ / "rand.json").write_text(json.dumps(rand))


def test_figures_render(tmp_path: Path) -> None:
    _small_results(tmp_path)
    written = draw_all(tmp_path, tmp_path / "figs")
    names = {p.name for p in written}
    assert {"small_bars.png", "small_sweep.png", "rand_distribution.png",
            "predicted_vs_measured.png", "plan_small-w128_4.png"} <= names
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_ratios() -> None:
    rows = [harness.Row("c", "w", "pytorch-tp", 4, time_s=2.0, floor_s=1.0),
            harness.Row("c", "w", "einsummable", 4, time_s=1.0, floor_s=1.0),
            harness.Row("c", "w", "vllm", 4, unavailable="vLLM is not installed")]
    s = harness.summarize(rows)["4"]
    assert s["einsummable"]["geomean_ratio_vs_pytorch-tp"] == 1.0 / 2.0
    assert "vllm" not in s
    assert "unavailable: vLLM is not installed" in harness.format_table(rows)


def test_headline_is_optimized_over_the_best_baseline_of_each_row() -> None:
    R = harness.Row
    rows = [R("c", "a", "einsummable", 8, time_s=2.0), R("c", "a", "pytorch-tp", 8, time_s=4.0),
            R("c", "a", "data-parallel", 8, time_s=1.0, extra={"at_peak_s": 0.5}),
            R("c", "a", "floor", 8, time_s=0.1),  # a yardstick, never the best baseline
            R("c", "b", "einsummable", 8, time_s=3.0), R("c", "b", "pytorch-tp", 8, time_s=6.0),
            R("c", "b", "data-parallel", 8, time_s=12.0),
            R("c", "b", "vllm", 8, unavailable="vLLM is not installed")]
    h = harness.headline(rows)["8"]
    assert h["per_workload"]["a"] == {"best": "data-parallel", "best_s": 1.0, "ratio": 2.0}
    assert h["per_workload"]["b"]["best"] == "pytorch-tp"
    assert h["geomean_vs_best"] == pytest.approx((2.0 * 0.5) ** 0.5)
    assert h["geomean_vs_pytorch-tp"] == pytest.approx(0.5)
    assert h["geomean_vs_best_at_peak"] == pytest.approx((4.0 * 0.5) ** 0.5)
    text = harness.format_headline(harness.headline(rows), published=0.66)
    assert "best baseline of its row 1.000" in text and "(published 0.66)" in text


def test_two_machines_of_one_world_size_are_compared_apart() -> None:
    """Rows of a100x8x2 and h100x8x2 (16 GPUs each) in one run: each machine's einsummable
    row is judged against that machine's baselines, not the other's (rows used to be keyed by
    workload and world size, so the later machine overwrote the earlier)."""
    R = harness.Row
    rows = [R("c", "a", "einsummable", 16, time_s=3.0, machine="a100x8x2"),
            R("c", "a", "fsdp", 16, time_s=2.0, machine="a100x8x2"),
            R("c", "a", "einsummable", 16, time_s=0.5, machine="h100x8x2"),
            R("c", "a", "fsdp", 16, time_s=1.0, machine="h100x8x2"),
            R("c", "a", "einsummable", 8, time_s=1.0), R("c", "a", "fsdp", 8, time_s=4.0)]
    h = harness.headline(rows)
    assert list(h) == ["8", "16@a100x8x2", "16@h100x8x2"]
    assert h["16@a100x8x2"]["geomean_vs_best"] == pytest.approx(1.5)
    assert h["16@h100x8x2"]["geomean_vs_best"] == pytest.approx(0.5)
    assert h["8"]["geomean_vs_best"] == pytest.approx(0.25)
    assert list(harness.summarize(rows)) == list(h)
    assert "16@h100x8x2" in harness.format_table(rows)


def test_random_plans_are_simulated_resident_like_the_optimized_plan(monkeypatch) -> None:
    from experiments import runners
    seen = []
    real = runners.simulate_choice

    def spy(graph, choice, topo, **kw):
        seen.append(graph.outputs)
        return real(graph, choice, topo, **kw)
    monkeypatch.setattr(runners, "simulate_choice", spy)
    cfg = {"name": "rp", "kind": "random_plans", "topology": "cpu4", "dtype": "float32",
           "samples": 2, "workloads": [{"name": "t", "model": "llama-tiny", "batch": 4,
                                        "seq": 8}]}
    res = runners.random_plans(cfg, stream=open(os.devnull, "w"))
    assert seen == [(), ()] and res.extra["output"] == "resident"


def test_naive_exchange_row_is_a_plan_reoptimized_for_it(monkeypatch) -> None:
    from experiments import einsummable_system as es_sys
    from experiments import runners
    modes = []
    real = es_sys.optimize

    def spy(graph, topo, **kw):
        modes.append(kw.get("exchange_mode", "optimized"))
        return real(graph, topo, **kw)
    monkeypatch.setattr(es_sys, "optimize", spy)
    cfg = {"name": "ex", "kind": "exchange", "topology": "dgx1-v100", "dtype": "float16",
           "workloads": [{"name": "c", "chain": "(A B) C",
                          "shapes": {"A": [512, 256], "B": [256, 512], "C": [512, 256]}}]}
    res = runners.exchange(cfg, stream=open(os.devnull, "w"))
    assert modes == ["optimized", "naive"]
    by = {r.system: r for r in res.rows}
    assert set(by) == {"einsummable", runners.NAIVE, runners.NAIVE_SAME_PLAN}
    assert all(r.ok for r in res.rows), [r.unavailable for r in res.rows]
    assert "re-optimized" in by[runners.NAIVE].note and "old figure" in by[
        runners.NAIVE_SAME_PLAN].note
    g = res.extra["gains"]["chain"]
    assert g["geomean_naive_over_optimized"] == pytest.approx(
        by[runners.NAIVE].time_s / by["einsummable"].time_s)


def test_shipped_configs_parse() -> None:
    names = {p.stem for p in harness.CONFIG_DIR.glob("*.yaml")}
    assert names >= {"llama_blocks_a100", "llama_blocks_cpu", "long_context", "matrix_chains",
                     "random_plans", "exchange_v100"}
    for n in names:
        cfg = harness.load_config(n)
        assert cfg.get("kind", "blocks") in bench.runners.RUNNERS


def test_a_run_whose_rank_dies_reports_every_system_and_returns(monkeypatch) -> None:
    # A rank that aborts (a signal, no Python exception) must not take the sweep down: each
    # system of that run carries the reason, and the caller goes on with its other runs.
    import torch.multiprocessing as mp
    from experiments import measure as m
    from experiments.workloads import Workload

    class Dead:
        processes: list = []

        def join(self, timeout=None):
            raise mp.ProcessExitedException("process 1 terminated with signal SIGABRT",
                                            error_index=1, error_pid=0, exit_code=-6,
                                            signal_name="SIGABRT")

    starts = []
    monkeypatch.setattr(m.mp, "start_processes", lambda *a, **k: starts.append(1) or Dead())
    req = m.MeasureRequest(Workload("t", "llama-tiny", 1, 8), ("einsummable", "floor"), 2)
    got = m.measure(req)
    assert len(starts) == m.ATTEMPTS  # run once more before the death is reported
    assert set(got) == {"einsummable", "floor"}
    assert all(t.median_s is None and "SIGABRT" in t.error for t in got.values())
