"""One dtype policy for every backend (`frontend/inputs.py`): a tensor in another dtype than
the graph's is cast where no value changes, else refused with a DTypeError before any rank
starts; the answer is the same on the local backend and on gloo ranks."""
from __future__ import annotations

import pytest
import torch

import einsummable as es
from einsummable.errors import DTypeError
from einsummable.frontend.builder import Builder
from einsummable.frontend.inputs import lossless
from einsummable.frontend.reference import evaluate

from helpers import max_rel_err


@pytest.mark.parametrize("values,dtype,ok", [
    (torch.randn(64).half(), torch.float32, True),              # widening
    (torch.randn(64, dtype=torch.float64), torch.float32, False),  # rounding
    (torch.tensor([1.0, float("nan"), -0.0]).half(), torch.float32, True),
    (torch.arange(100), torch.float32, True),                   # whole numbers
    (torch.tensor([2 ** 24 + 1]), torch.float32, False),        # beyond float32's integers
    (torch.tensor([3.0, 7.0]), torch.int64, True),              # token ids given as floats
    (torch.tensor([3.5]), torch.int64, False),
    (torch.tensor([float("inf")]), torch.int64, False),
    (torch.tensor([70000.0]), torch.float16, False),            # overflows float16
])
def test_lossless(values, dtype, ok):
    assert lossless(values, dtype) is ok


@pytest.fixture(scope="module")
def case():
    b = Builder()
    x = b.input("x", (8, 16))
    w = b.weight("w", (16, 12))
    g = b.build([b.einsum("ij,jk->ik", x, w).silu()])
    return g, es.optimize(g, "cpu2", cache=False)


@pytest.mark.parametrize("backend", ["local", "gloo"])
def test_a_lossless_dtype_is_cast_on_every_backend(case, backend):
    g, plan = case
    x, w = torch.randn(8, 16).half(), torch.randn(16, 12)
    want = evaluate(g, {"x": x.float(), "w": w})[g.outputs[0]]
    got = es.run(plan, {"x": x, "w": w}, backend=backend)[g.outputs[0]]
    assert got.dtype == torch.float32 and max_rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("backend", ["local", "gloo"])
def test_a_lossy_dtype_is_refused_before_any_rank_starts(case, backend, monkeypatch):
    g, plan = case
    import einsummable.backend.runtime.pool as pool
    monkeypatch.setattr(pool.Pools, "get", lambda *a, **k: pytest.fail("a rank was started"))
    with pytest.raises(DTypeError, match="weight 'w' is float64 but the graph takes float32"):
        es.run(plan, {"x": torch.randn(8, 16), "w": torch.randn(16, 12, dtype=torch.float64)},
               backend=backend)


def test_an_einsum_of_mixed_dtypes_is_refused_when_built():
    b = Builder()
    x = b.input("x", (4, 8), "float16")
    w = b.weight("w", (8, 3), "float32")
    with pytest.raises(DTypeError, match=r"x float16, w float32"):
        b.einsum("ij,jk->ik", x, w)
