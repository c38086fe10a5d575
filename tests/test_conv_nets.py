"""Convolutional modules captured, planned on cpu4 and run: a ResNet basic block
(conv-bn-relu-conv-bn + residual), a ViT-style patch embedding followed by a transformer
encoder layer, and a small U-Net (conv and max pool down, transposed conv up, a skip
concatenation), on the local backend and on gloo ranks, equal to the module; capture of
conv1d, 'same' padding, pooling, batch norm and upsampling against the module; refusals name
what to change."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from einsummable.backend.lowering import lower
from einsummable.backend.runtime.pool import Pools, run_dist
from einsummable.backend.runtime.local import run_local
from einsummable.errors import UnsupportedOpError
from einsummable.frontend.capture import bind, trace
from einsummable.frontend.reference import evaluate
from einsummable.optimizer.api import optimize
from einsummable.planning.plan import Plan
from einsummable.selection.choose import choose_plan
from einsummable.topology import load_topology

from helpers import rel_err

TOL = 1e-5


class BasicBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)


class PatchViT(nn.Module):
    def __init__(self, c: int = 3, d: int = 16, patch: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Conv2d(c, d, patch, stride=patch)
        self.layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(self.embed(x).flatten(2).transpose(1, 2))


class UNet(nn.Module):
    def __init__(self, c: int = 2, w: int = 4) -> None:
        super().__init__()
        self.down = nn.Conv2d(c, w, 3, padding=1)
        self.mid = nn.Conv2d(w, 2 * w, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.out = nn.Conv2d(2 * w, c, 1)

    def forward(self, x):
        d = F.relu(self.down(x))
        m = F.relu(self.mid(F.max_pool2d(d, 2)))
        return self.out(torch.cat([self.up(m), d], 1))


NETS = {"resnet-block": (BasicBlock, (2, 8, 8, 8)), "vit-patch": (PatchViT, (2, 3, 16, 16)),
        "unet": (UNet, (1, 2, 8, 8))}


def _module(name: str):
    cls, shape = NETS[name]
    torch.manual_seed(0)
    m = cls().eval()
    with torch.no_grad():  # statistics that are not the identity
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-1, 1)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.5, 0.5)
    x = torch.randn(shape)
    g = trace(m, (x,))
    with torch.no_grad():
        want = m(x)
    return g, bind(g, m, (x,)), want


@pytest.fixture(scope="module")
def pools():
    p = Pools()
    yield p
    p.close()


@pytest.mark.parametrize("name", sorted(NETS))
def test_net_plans_run_locally_and_on_gloo(name, pools):
    g, ins, want = _module(name)
    assert any(op.fused == "conv" for op in g.ops)
    assert rel_err(evaluate(g, ins)[g.outputs[0]], want) <= TOL
    topo = load_topology("cpu4")
    chosen = choose_plan(g, topo)  # the fastest simulated plan (one device at these sizes)
    assert rel_err(run_local(lower(chosen), ins)[g.outputs[0]], want) <= TOL
    spread = optimize(g, topo, cache=False)  # the MIP's optimum: every op over every rank
    assert Plan.from_json(spread.to_json()).chosen == spread.chosen  # windows survive JSON
    low = lower(Plan.from_json(spread.to_json()))
    assert rel_err(run_local(low, ins)[g.outputs[0]], want) <= TOL
    got = run_dist(low, ins, backend="gloo", pools=pools, no_collectives=True)
    assert rel_err(got[g.outputs[0]], want) <= TOL


class _Zoo(nn.Module):
    """conv1d (stride, dilation, padding), conv2d 'same' with an even kernel (the odd padding
    row after) and groups, max/avg/adaptive pooling, nearest upsampling, and a transposed
    conv with output padding."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(3, 4, 3, stride=2, dilation=2, padding=1)
        self.same = nn.Conv2d(4, 4, 4, padding="same", groups=2)
        self.t = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x, z):
        y = self.same(x)
        y = F.max_pool2d(y, 3, 2, 1) + F.avg_pool2d(y, 2, 2, count_include_pad=False)[..., :4, :4]
        return (self.c1(z), y, F.adaptive_avg_pool2d(y, 1),
                F.interpolate(y, scale_factor=2, mode="nearest"), self.t(y))


def test_capture_zoo_equals_module():
    torch.manual_seed(1)
    m = _Zoo().eval()
    args = (torch.randn(2, 4, 8, 8), torch.randn(2, 3, 11))
    g = trace(m, args)
    got = evaluate(g, bind(g, m, args))
    with torch.no_grad():
        want = m(*args)
    assert len(g.outputs) == len(want)
    for name, w in zip(g.outputs, want):
        assert got[name].shape == w.shape
        assert rel_err(got[name], w) <= TOL, name


def test_refusals_name_the_fix():
    bn = nn.BatchNorm2d(2).train()
    with pytest.raises(UnsupportedOpError, match="eval"):
        trace(bn, (torch.randn(2, 2, 4, 4),))

    class Ceil(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 2, ceil_mode=True)
    with pytest.raises(UnsupportedOpError, match="ceil_mode"):
        trace(Ceil(), (torch.randn(1, 2, 5, 5),))
