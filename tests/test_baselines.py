"""Each hand-written baseline computes exactly module(x), on 2 gloo ranks."""
from __future__ import annotations

import json

import pytest

from experiments.baselines import BASELINES
from experiments.measure import CHECK_ATOL, MeasureRequest, measure, percentile
from experiments.workloads import Workload

SYSTEMS = tuple(BASELINES)


@pytest.mark.parametrize("workload", [
    Workload("tiny", "llama-tiny", batch=2, seq=16),
    # GQA: 8 query heads over 2 KV heads, so TP splits whole KV groups.
    Workload("gqa", "llama3-8b", batch=2, seq=8, width=0.25),
], ids=lambda w: w.name)
def test_baselines_match_module_on_two_ranks(workload: Workload) -> None:
    result = measure(MeasureRequest(workload, SYSTEMS + ("vllm",), world=2, warmup=0,
                                    repeats=3, weights="sharded", timeout_s=120))
    for name in SYSTEMS:
        t = result[name]
        assert t.error is None, (name, t.error)
        assert t.max_abs_err is not None and t.max_abs_err <= CHECK_ATOL, (name, t.max_abs_err)
        assert t.median_s is not None and t.median_s > 0 and len(t.samples_s) == 3
        assert t.p25_s <= t.median_s <= t.p75_s
    # Never a stand-in under vLLM's name.
    assert result["vllm"].median_s is None and result["vllm"].error


def test_replicated_data_parallel_matches() -> None:
    result = measure(MeasureRequest(Workload("tiny", "llama-tiny", 2, 8), ("data-parallel",),
                                    world=2, warmup=0, repeats=1, weights="replicated",
                                    timeout_s=60))
    assert result["data-parallel"].max_abs_err <= CHECK_ATOL
    assert "full weights" in result["data-parallel"].note


def test_uneven_split_is_reported_not_hung() -> None:
    # 3 query positions cannot be split evenly over 2 ranks for sequence parallelism.
    result = measure(MeasureRequest(Workload("odd", "llama-tiny", 2, 3), ("pytorch-tp-sp",
                                    "pytorch-tp"), world=2, warmup=0, repeats=1, timeout_s=60))
    assert "evenly" in result["pytorch-tp-sp"].error
    assert result["pytorch-tp"].max_abs_err <= CHECK_ATOL


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0


def test_baselines_run_einsummable_kernels_and_match_the_module(monkeypatch) -> None:
    # Kernel parity: attention through torch's sdpa (causal), as einsummable's kernel calls it;
    # the block forward built on it agrees with the module, which spells attention out.
    import torch

    from experiments.baselines import common
    calls = []
    real = common.F.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)
    monkeypatch.setattr(common.F, "scaled_dot_product_attention", spy)
    for w in (Workload("tiny", "llama-tiny", 2, 16), Workload("gqa", "llama3-8b", 2, 8,
                                                               width=0.25)):
        block, x = w.build()
        with torch.no_grad():
            assert (common.block_forward(block, x) - block(x)).abs().max() <= CHECK_ATOL
    assert len(calls) == 2 and all(c["is_causal"] for c in calls)
    assert [c["enable_gqa"] for c in calls] == [False, True]


def test_a_rank_dying_after_the_results_were_written_keeps_them(tmp_path) -> None:
    # gloo now and then aborts a rank as it tears down; rank 0 writes the results only after
    # every rank's timings were gathered, so a whole file means the measurement finished.
    from experiments.measure import Timing, _complete, _read
    path = str(tmp_path / "result.json")
    assert not _complete(path)
    with open(path, "w") as f:
        f.write('{"pytorch": {"system": "pytorch", "median_s": 0.001')  # cut short
    assert not _complete(path)
    with open(path, "w") as f:
        json.dump({"pytorch": Timing("pytorch", median_s=0.001).to_dict()}, f)
    assert _complete(path) and _read(path)["pytorch"].median_s == 0.001
