"""Helpers the tests share: oracles, builders and fixed topologies that more than one test
file needs. Test files import from here (pytest puts tests/ on sys.path), never from each
other.

Sections:
- oracles: `evaluate_by_tuples` (a decomposition evaluated tuple by tuple), `rel_err` and
  `max_rel_err` (two error measures against a reference), `exhaustive_best` (the least
  objective of an optimizer model by enumeration);
- random programs: `random_graph` (graphs for lowering and executors), `random_choice`,
  `inputs_for`, and for the optimizer `small_random_graph`, `truncate_candidates`;
- fixed workloads: `mlp`, `llama_tiny`, `module_inputs`, `split_plan`, `named_plans`;
- topologies: `WORLD_SIZES`, `TOPOS` (one per world size), `TOPOLOGIES` (the optimizer's set),
  `ring4` (four devices on a ring of slow links, so two of them talk through a relay);
- capture: `capture_check` (trace a module, evaluate the graph, compare with the module),
  `Fn` (a module around a lambda), `rand` (seeded inputs);
- `CollectiveProbe`: a block that calls a torch.distributed collective where a rank uses it.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Callable, Mapping, Sequence

import torch

from einsummable.core.geometry import Region
from einsummable.frontend.builder import Builder
from einsummable.frontend.ir import Op
from einsummable.frontend.reference import evaluate_op
from einsummable.frontend.scalar import combine
from einsummable.planning.spec import Decomposition, tuples
from einsummable.topology import load_topology, synthetic

# ----------------------------------------------------------------------------- oracles


def block_of(t: torch.Tensor, reg: Region) -> torch.Tensor:
    return t[tuple(slice(lo, hi) for lo, hi in reg)]


def evaluate_by_tuples(op: Op, dec: Decomposition, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Evaluate `op` tuple by tuple under `dec` and aggregate the partials (to check a
    decomposition against `evaluate_op` on whole inputs)."""
    out_shape = [math.prod(op.size[m] for m in g) for g in op.out_dims]
    result = torch.empty(out_shape, dtype=blocks[0].dtype if blocks else torch.float32)
    acc: dict[tuple[int, ...], torch.Tensor] = {}
    regions: dict[tuple[int, ...], Region] = {}
    for t in tuples(op, dec):
        part = evaluate_op(op, [block_of(b, r) for b, r in zip(blocks, t.in_regions)],
                           t.range_of(op))
        key = t.out_block
        regions[key] = t.out_region
        if key in acc:
            acc[key] = combine(op.agg, acc[key], part) if op.agg else part
        else:
            acc[key] = part
    for key, val in acc.items():
        result[tuple(slice(lo, hi) for lo, hi in regions[key])] = val
    return result


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / max(‖b‖, 1): outputs that cancel to ~0 (x − x) are compared against the
    unit scale of the inputs."""
    return ((a - b).norm() / b.norm().clamp_min(1.0)).item()


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out − ref| / max(max |ref|, 1e-6), in float64 (elementwise worst case)."""
    ref64 = ref.double()
    return ((out.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1e-6)).item()


def exhaustive_best(model, keep: Callable[[dict], bool] = lambda choice: True) -> float:
    """The least exact objective (`objective_s`: the plain sum, or A + max(C, W) with overlap)
    over every choice of an optimizer model that meets its ties and memory and that `keep`
    accepts; inf where none does."""
    import formulations as fm
    from einsummable.optimizer.objective import objective_s, to_problem
    keys = list(model.nodes)
    problem = to_problem(model)
    best = float("inf")
    for combo in itertools.product(*(range(len(model.nodes[k].cands)) for k in keys)):
        choice = dict(zip(keys, combo))
        if not fm.violations(problem, choice) and keep(choice):
            best = min(best, objective_s(model, choice))
    return best


# ----------------------------------------------------------------------------- topologies

WORLD_SIZES = (1, 2, 3, 4, 6, 8)

# One topology per world size: uniform ones, the calibrated 4-rank CPU machine, two nodes of
# three, and the DGX-1 cube mesh (missing links, relays).
TOPOS = {1: synthetic(1), 2: synthetic(2), 3: synthetic(3), 4: load_topology("cpu4"),
         6: synthetic(6, nodes=2), 8: load_topology("dgx1-v100")}

# The optimizer's test machines, (name, factory): built fresh where a test mutates caches.
TOPOLOGIES = [("synthetic2", lambda: synthetic(2)),
              ("synthetic4x2", lambda: synthetic(4, nodes=2)),
              ("cpu4", lambda: load_topology("cpu4")),
              ("pcie4-numa", lambda: load_topology("pcie4-numa")),
              ("synthetic8", lambda: synthetic(8)), ("dgx1-v100", lambda: load_topology("dgx1-v100"))]

# ----------------------------------------------------------------------------- random programs


def random_graph(rng: random.Random):
    """A small random DAG: matmuls, elementwise maps, reductions, softmax, reshape, permute
    (fp32, uneven sizes 1..7): for lowering and the executors."""
    b = Builder()
    dims = [rng.randint(1, 7) for _ in range(4)]
    x = b.input("x", (dims[0], dims[1]))
    w = b.weight("w", (dims[1], dims[2]))
    live = [x, b.einsum("ij,jk->ik", x, w)]
    for step in range(rng.randint(1, 4)):
        a = rng.choice(live)
        kind = rng.randrange(6)
        if kind == 0:
            v = b.weight(f"v{step}", (a.shape[-1], rng.randint(1, 7)))
            live.append(b.einsum("ij,jk->ik", a, v))
        elif kind == 1:
            live.append((a * 0.5).tanh() + a)
        elif kind == 2:
            live.append(a.amax(1, keepdim=True) + a)
        elif kind == 3:
            live.append(a.softmax(-1))
        elif kind == 4:
            live.append(a.transpose(0, 1).transpose(0, 1) * a)
        else:
            others = [t for t in live if t.shape == a.shape and t is not a]
            live.append(a - others[0] if others else a.sum(0, keepdim=True))
    return b.build([live[-1]])


def random_choice(graph, n: int, rng: random.Random) -> dict:
    """A random (not optimal) plan on n devices, a quarter of the tuples scattered."""
    from einsummable.planning.placement import random_choice as placement_random_choice
    return placement_random_choice(graph, n, rng, scatter=0.25)


def inputs_for(graph, seed: int) -> dict:
    """Seeded standard-normal values for every graph input, in the input's dtype (the
    executors refuse a cast that changes values: `frontend/inputs.py`)."""
    from einsummable.frontend.reference import TORCH_DTYPES
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.randn(t.shape, generator=gen).to(TORCH_DTYPES[t.dtype])
            for t in graph.inputs}


# The optimizer tests enumerate every choice: keep the product of candidate counts near this.
EXHAUSTIVE_LIMIT = 4000
# How far a HiGHS answer may sit from brute force, relative: HiGHS keeps rows feasible to 1e-6
# with the objective scaled to at most 1 per term, so an epigraph bound or incumbent can be off
# by a few parts in a million of the objective (seen: 8e-7 and 2.2e-6).
SOLVER_REL = 1e-5


def small_random_graph(rng: random.Random):
    """Up to 6 ops: matmuls, elementwise maps and reductions over small 2-D fp16 tensors
    (sizes 4, 8, 16): small enough to solve by enumeration."""
    b = Builder("float16")
    sizes = [4, 8, 16]
    m, k = rng.choice(sizes), rng.choice(sizes)
    x = b.input("x", (m, k))
    live = [x]
    n_ops = rng.randint(1, 6)
    while len(b._ops) < n_ops:
        kind = rng.choice(["matmul", "map", "add", "sum"])
        t = rng.choice(live)
        if kind == "matmul":
            w = b.weight(f"w{len(b._ops)}", (t.shape[1], rng.choice(sizes)))
            y = b.einsum("ij,jk->ik", t, w)
        elif kind == "map":
            y = t.relu()
        elif kind == "add":
            same = [u for u in live if u.shape == t.shape]
            y = t + rng.choice(same)
        else:
            y = t.sum(1, keepdim=True) * 1.0 if t.shape[1] > 1 else t.relu()
        live.append(y)
    return b.build([live[-1]])


def truncate_candidates(nodes, rng: random.Random, budget: int = EXHAUSTIVE_LIMIT):
    """Keep a few candidates per node (always the same for a seed) so that enumerating every
    choice stays near `budget`."""
    from einsummable.planning.candidates import OpCandidates
    keys = list(nodes)
    per = max(1, int(budget ** (1 / max(1, len(keys)))))
    out = {}
    for k in keys:
        oc = nodes[k]
        idx = sorted(rng.sample(range(len(oc.cands)), min(len(oc.cands), max(2, per))))
        out[k] = OpCandidates(k, oc.op, tuple(oc.cands[i] for i in idx),
                              tuple(oc.level_parts[i] for i in idx))
    return out


# ----------------------------------------------------------------------------- fixed workloads


def mlp(tokens: int, d: int = 4096, f: int = 16384):
    """x @ w1 ("up"), relu, @ w2 ("down") in fp16: the Megatron / data-parallel test case."""
    b = Builder("float16")
    x = b.input("x", (tokens, d))
    h = b.einsum("td,df->tf", x, b.weight("w1", (d, f)), name="up").relu()
    return b.build([b.einsum("tf,fd->td", h, b.weight("w2", (f, d)), name="down")])


def split_modes(plan, key: str) -> set[str]:
    """The modes a plan's candidate for `key` splits."""
    return {m for m, p in plan.candidate(key).parts if p > 1}


def module_inputs(module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """A LLaMA block graph's inputs from its nn.Module: x and the (detached) parameters."""
    return {"x": x, **{k: v.detach() for k, v in module.named_parameters()}}


def llama_tiny(batch: int = 2, seq: int = 8):
    """(graph, inputs, module output) of the llama-tiny block."""
    from einsummable.models import preset
    from einsummable.models.llama_ir import llama_block_graph
    module, (x,) = preset("llama-tiny", batch=batch, seq=seq)
    g = llama_block_graph(module.config, batch, seq)
    return g, module_inputs(module, x), module(x).detach()


def split_plan(g, n: int, prefer: Sequence[str]) -> dict:
    """Split each op on the first mode of `prefer` it can split n ways, else replicate;
    graph inputs stored on device 0."""
    from einsummable.planning.placement import split_choice
    return split_choice(g, n, prefer, inputs_on=0)


# The optimizer's named strategies that apply to the llama-tiny block on 2 and 4 devices
# (`named_plans` requires each of them).
LLAMA_TINY_STRATEGIES = ("data-parallel", "fsdp", "megatron-tp")


def named_plans(g, topo) -> dict[str, dict]:
    """Hand plans (random, batch- and head-parallel), the optimizer's named strategies
    `LLAMA_TINY_STRATEGIES`, one device, and its optimum; a strategy that fails raises."""
    from einsummable.optimizer.api import named_plan, optimize
    n = topo.world_size
    out = {"one-device": dict(named_plan(g, topo, "one-device").choice),
           "random": random_choice(g, n, random.Random(0)),
           "batch-parallel": split_plan(g, n, ("b",)),
           "head-parallel": split_plan(g, n, ("h", "f", "n", "b"))}
    for name in LLAMA_TINY_STRATEGIES:
        out[name] = dict(named_plan(g, topo, name).choice)
    out["optimized"] = dict(optimize(g, topo).choice)
    return out


# ----------------------------------------------------------------------------- capture

CAPTURE_TOL = 1e-5


def capture_check(module: torch.nn.Module, *args: torch.Tensor, max_ops: int | None = None,
                  kwargs: Mapping[str, torch.Tensor] | None = None):
    """Trace `module(*args, **kwargs)`, evaluate the graph on the module's own weights and hold
    every output to the module's (float32: max relative error <= CAPTURE_TOL; integers and
    booleans exactly); returns the graph."""
    from einsummable.frontend.capture import bind, trace
    from einsummable.frontend.reference import evaluate
    module.eval()
    kwargs = dict(kwargs or {})
    g = trace(module, args, kwargs)
    outs = evaluate(g, bind(g, module, args, kwargs))
    with torch.no_grad():
        ref = module(*args, **kwargs)
    from torch.utils import _pytree as pytree
    refs = [t for t in pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
    assert len(refs) == len(g.outputs)
    for name, want in zip(g.outputs, refs):
        got = outs[name]
        assert tuple(got.shape) == tuple(want.shape), (name, got.shape, want.shape)
        if want.dtype == torch.bool or not want.is_floating_point():
            assert torch.equal(got.to(want.dtype), want)
        else:
            assert max_rel_err(got, want) <= CAPTURE_TOL, (name, max_rel_err(got, want))
    if max_ops is not None:
        assert len(g.ops) <= max_ops, g.summary()
    return g


class Fn(torch.nn.Module):
    """A module around a lambda, with optional parameters."""

    def __init__(self, fn, **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            setattr(self, k, torch.nn.Parameter(v))

    def forward(self, *xs):
        return self.fn(self, *xs)


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


# ----------------------------------------------------------------------------- dist probes


class CollectiveProbe:
    """Stands in for an input block in a worker's job: the rank's Place calls `.to(device)`,
    which all-reduces a one (so it needs every rank's probe) and returns the block scaled by
    the sum (the world size). Where collectives are forbidden the all-reduce raises."""

    def __init__(self, block: torch.Tensor) -> None:
        self.block = block

    def to(self, device) -> torch.Tensor:
        import torch.distributed as dist
        one = torch.ones(1)
        dist.all_reduce(one)
        return self.block.to(device) * one.item()


def probe_blocks(blocks: Mapping) -> dict:
    return {k: CollectiveProbe(v) for k, v in blocks.items()}


def ring4():
    """Devices 0-1-2-3-0 on a ring of 100 MB/s links with 10 us latency (launch 1 us): 0
    reaches 2 only through a relay (1 or 3)."""
    from einsummable.topology import read_topology
    return read_topology({
        "name": "ring4",
        "device_types": {"cpu": {"peak_flops": {"float16": 1e9, "bfloat16": 1e9,
                                                "float32": 1e9},
                                 "mem_bw": 1e10, "mem_bytes": 1e9, "launch": 1e-6}},
        "nodes": {"count": 1, "devices_per_node": 4, "device_type": "cpu"},
        "links": [{"kind": "nvlink", "pairs": [[0, 1], [1, 2], [2, 3], [3, 0]], "bw": 1e8,
                   "latency": 1e-5}]}, "ring4")


class LlamaLayerWithRotary(torch.nn.Module):
    """transformers' LlamaDecoderLayer with its LlamaRotaryEmbedding run in forward."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers.models.llama import modeling_llama as ml
        self.layer = ml.LlamaDecoderLayer(config, 0)
        self.rotary = ml.LlamaRotaryEmbedding(config)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        return self.layer(x, position_embeddings=self.rotary(x, pos), attention_mask=None)
