"""An activation several ops read is sent once: the optimizer prices each later reader from
the first reader's needs, as lowering sends it (`placement.rereads`)."""
from __future__ import annotations

import pytest

from einsummable.backend.runtime.simulator import block_time
from einsummable.models.llama_ir import llama_block_graph
from einsummable.models.presets import preset_config
from einsummable.optimizer.api import named_plan
from einsummable.optimizer.model import plan_model
from einsummable.planning.placement import rereads
from einsummable.topology import load_topology


@pytest.fixture(scope="module")
def block():
    return llama_block_graph(preset_config("llama-7b"), 4, 2048, "float16", 1)


def test_heads_are_first_readers_of_activations(block):
    heads = rereads(block)
    for name, head in heads.items():
        readers = [op.name for op in block.ops if name in op.inputs]
        assert len(readers) > 1 and readers[0] == head
        assert block.tensor(name).kind not in ("weight", "constant")
    # the attention norm's output feeds the Q, K and V projections
    assert any(len([op for op in block.ops if name in op.inputs]) == 3 for name in heads)
    assert not any(block.tensor(n).kind == "weight" for n in heads)


def test_sequence_parallel_gather_paid_once(block):
    """Megatron TP+SP gathers the norm output once for Q, K and V (and once for gate and up):
    the later readers' edges cost nothing, and the objective meets the simulated time (it was
    0.79 of it when every reader paid the gather)."""
    topo = load_topology("a100x8")
    plan = named_plan(block, topo, "megatron-tp-sp", steady_state=True)
    model = plan_model(plan)
    choice = {k: 0 for k in model.nodes}
    rereading = [e for e in model.edges if e.kind == "reread"]
    assert rereading
    heads = rereads(block)
    gathered = 0
    for e in rereading:
        assert heads[e.tensor] == e.src
        assert e.cost(choice[e.src], choice[e.dst]).seconds == 0.0
        first = next(f for f in model.edges if f.dst == e.src and f.tensor == e.tensor)
        gathered += first.cost(choice[first.src], choice[first.dst]).seconds > 0
    assert gathered >= 2  # the attention and MLP norms' outputs, gathered for their heads
    sim = block_time(plan)
    assert sim == pytest.approx(plan.objective_s, rel=0.10)
