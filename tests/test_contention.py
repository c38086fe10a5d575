"""Contention (`planning/kernel_time.py`): a transfer takes a share of its devices' compute and
memory while it runs; the simulator applies the rule per kernel, the objective in aggregate
(C + s W for weights streamed behind compute), the FSDP baseline as the objective does."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from einsummable.backend.runtime.simulator import block_time, simulate
from einsummable.optimizer.api import named_plan
from einsummable.optimizer.model import build_model, fixed_nodes
from einsummable.optimizer.objective import split
from einsummable.planning.cost import memory_bound_share
from einsummable.planning.kernel_time import KernelTime, contention_share, loaded_s
from einsummable.planning.plan import Options
from einsummable.topology import load_topology
from einsummable.errors import TopologyError
from einsummable.topology.reader import SHIPPED_DIR as SHIPPED, read_topology as topology_from_dict

from helpers import mlp

SLOWDOWN = 0.2


def contended(topo, slowdown: float = SLOWDOWN, memory: float = 1.0):
    devs = tuple(dataclasses.replace(d, achieved=dataclasses.replace(
        d.achieved, transfer_slowdown=slowdown, transfer_memory=memory)) for d in topo.devices)
    return dataclasses.replace(topo, devices=devs)


@pytest.fixture(scope="module")
def a100():
    """a100x8 without contention (the datasheet): the shipped file carries the published
    slowdown, which the tests below replace by their own."""
    return contended(load_topology("a100x8"), 0.0, 0.0)


def test_a_kernel_under_a_transfer_runs_at_the_share_left(a100):
    dev = contended(a100).devices[0]
    launch = dev.launch_s
    gemm = KernelTime(1e-3, 1e-4, launch)
    assert loaded_s(gemm, dev, 0.0, 1.0) == gemm.total_s  # nothing moving: unloaded
    # the transfer outlasts the kernel: all of it at (1 - s) of its rate
    assert loaded_s(gemm, dev, 100e9, 1.0) == pytest.approx(launch + 1e-3 / (1 - SLOWDOWN))
    # the transfer ends 0.1 ms in: s of those 0.1 ms is lost, the rest runs at full rate
    assert loaded_s(gemm, dev, 100e9, 1e-4) == pytest.approx(launch + 1e-3 + SLOWDOWN * 1e-4)
    # a memory-bound kernel loses the memory rate the transfer's bytes take
    copy = KernelTime(0.0, 1e-3, launch)
    rate = 0.25 * dev.mem_bw * dev.achieved.memory
    assert loaded_s(copy, dev, rate, 1.0) == pytest.approx(launch + 1e-3 / 0.75)
    # ... and nothing where the transport's copies are already in the link figures
    fitted = contended(a100, memory=0.0).devices[0]
    assert loaded_s(copy, fitted, rate, 1.0) == pytest.approx(copy.total_s)
    assert loaded_s(gemm, a100.devices[0], rate, 1.0) == gemm.total_s  # the datasheet


def test_shipped_gpu_topologies_carry_the_published_slowdown():
    for name in ("a100x8", "dgx1-v100", "h100x8x2", "pcie4-numa", "a100x8x2", "a100x8x4",
                 "h100x8x4", "h100x8x8", "h100x8x32"):
        dev = load_topology(name).devices[0]
        assert (dev.achieved.transfer_slowdown, dev.achieved.transfer_memory) == (0.159, 1.0)
    assert contention_share(load_topology("cpu2")) == 0.0  # gloo: fitted link figures


def test_objective_charges_the_weight_stream_its_share_of_compute(a100):
    g = mlp(65536)
    hot = contended(a100)
    assert contention_share(hot) == SLOWDOWN and contention_share(a100) == 0.0
    # per second of stream: s of the compute-bound seconds, the memory rate the stream's
    # bytes take (NVSwitch ports full both ways: 600 of 1555 GB/s) of the memory-bound ones
    mu = memory_bound_share(g, hot)
    assert 0 < mu < 1
    kappa = contention_share(hot, mu)
    assert kappa == pytest.approx((1 - mu) * SLOWDOWN + mu * 600e9 / 1555e9)
    plan = named_plan(g, a100, "fsdp", weights="sharded", steady_state=True)
    opts = Options("sharded", True)
    parts = {}
    for name, topo in (("plain", a100), ("hot", hot)):
        model = build_model(g, topo, opts, fixed_nodes(g, topo, opts, plan.chosen))
        parts[name] = split(model, {k: 0 for k in model.nodes})
    plain, hot_parts = parts["plain"], parts["hot"]
    assert hot_parts.weights_s == pytest.approx(plain.weights_s) and plain.weights_s > 0
    assert hot_parts.compute_s == pytest.approx(plain.compute_s + kappa * plain.weights_s)
    assert hot_parts.activations_s == pytest.approx(plain.activations_s)


def test_simulator_and_objective_agree_on_a_contended_weight_stream(a100):
    # 7.4 ms of compute hide 0.79 ms of weights: the stream costs about κ of its seconds in
    # both (the simulator per kernel, the objective in aggregate). Within 7%: the objective
    # charges κ over the whole wire time, the simulator over the kernels that start under
    # running flows (6.1% apart since the readers' own copies overlap the stream).
    g = mlp(65536)
    plain = named_plan(g, a100, "fsdp", weights="sharded", steady_state=True)
    hot = named_plan(g, contended(a100), "fsdp", weights="sharded", steady_state=True)
    extra_obj = hot.objective_s - plain.objective_s
    extra_sim = block_time(hot) - block_time(plain)
    assert extra_obj > 0.1e-3
    assert extra_sim == pytest.approx(extra_obj, rel=0.07)
    # the work is the same: contention shows in the time, not in the compute tally
    assert simulate(hot).compute_s == pytest.approx(simulate(plain).compute_s)


def test_topology_yaml_takes_and_checks_the_contention_figures():
    doc = yaml.safe_load(SHIPPED.joinpath("a100x8.yaml").read_text())
    doc["device_types"]["a100"]["achieved"] = {"transfer_slowdown": 0.15, "transfer_memory": 1}
    topo = topology_from_dict(doc)
    assert topo.devices[0].achieved.transfer_memory == 1.0
    assert topo.to_dict()["devices"][0]["achieved"]["transfer_memory"] == 1.0
    doc["device_types"]["a100"]["achieved"] = {"transfer_memory": 1.5}
    with pytest.raises(TopologyError, match="transfer_memory"):
        topology_from_dict(doc)
