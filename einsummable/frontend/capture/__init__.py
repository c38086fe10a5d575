"""Capture an unmodified nn.Module into the join-agg IR.

    g = trace(module, (x,))                   # torch.export, then ATen -> join-agg
    inputs = bind(g, module, (x,))            # user inputs + parameters + buffers by name
    reference.evaluate(g, inputs)             # == module(x)

Parameters and buffers become inputs of kind "weight" named by their module path
("layers.0.attention.wq.weight"); user tensors become inputs named like the forward's
arguments. Values that depend on no input are folded into constants (a causal mask stays the
compact `causal_mask` constant at any size). Views are read in place by the op that consumes
them and chains of elementwise ops fuse into one join, so the op count is about that of a
hand-built graph; attention and RMSNorm chains then fuse into single kernels (`fuse=False`
keeps them spelled out). Modules on the meta device capture without allocating weights.

The export keeps high-level ops (linear, matmul, softmax, layer_norm, sdpa); an op with no
mapping is decomposed to core ATen when PyTorch has a decomposition for it, and only an op
that neither maps nor decomposes raises `UnsupportedOpError`, with the op, the user's source
line (the innermost frame outside torch), the submodule and what to do about that op;
`supported_ops()` lists every op that maps. Nothing is returned half-captured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import operator
import os
import re
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ...errors import EinsummableError, UnsupportedOpError
from ..fuse import fuse as fuse_graph
from ..ir import Graph
from . import attention, contractions, conv, fold, shapes  # noqa: F401  (they register handlers)
from .aten import IGNORED, TABLE, Ctx, supported_ops
from .emit import Emitter
from .joint import export_joint
from .values import TENSORISH, Folded, Lazy, SliceVal

__all__ = ["trace", "bind", "supported_ops", "trace_step", "bind_step", "StepGraph"]

_MAX_DECOMPOSITION_ROUNDS = 8


def trace(module: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
          *, fuse: bool = True) -> Graph:
    """Capture `module(*args, **kwargs)` as a Graph (see the module docstring). With `fuse`
    (the default) spelled-out attention and RMSNorm chains become fused kernels
    (`einsummable.frontend.fuse`); `fuse=False` keeps the plain join-agg ops. A module with a
    transformers config is captured without its KV cache: `config.use_cache` is False during
    the export (the forward's outputs without the cache) and restored after."""
    graph = _trace(module, args, kwargs)
    if not fuse:
        return graph
    return fuse_graph(graph)


def _trace(module: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None
           ) -> Graph:
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    try:
        with _without_cache(module):
            ep = torch.export.export(module, args, dict(kwargs or {}), strict=False)
    except EinsummableError:
        raise
    except Exception as e:  # noqa: BLE001 - export failures become library errors
        raise UnsupportedOpError(f"torch.export could not capture the module: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                 op=type(module).__name__,
                                 fix="make forward exportable: no data-dependent control flow, "
                                     "no Python side effects on tensors") from e
    table: dict[Any, Any] = {}
    first: UnsupportedOpError | None = None
    # The training IR is already functional unless it mutates something; decompositions run
    # (and functionalise) only when needed, since they dominate the cost of a trace.
    program = ep if _functional(ep) else ep.run_decompositions(table)
    for _ in range(_MAX_DECOMPOSITION_ROUNDS):
        try:
            return _capture(program)
        except UnsupportedOpError as e:
            first = first or e
            target = getattr(e, "aten_op", None)
            if program is ep:  # composite ops decompose in the standard pass
                program = ep.run_decompositions(table)
                continue
            decomp = _decomposition(target)
            if decomp is None or target in table:
                raise first from (e if e is not first else None)
            table[target] = decomp
            program = ep.run_decompositions(table)
    raise UnsupportedOpError("decomposition did not converge", op=type(module).__name__)


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """One training step's forward and backward as one graph (`trace_step`): `loss` is the
    output holding the loss, `grads` pairs each parameter with the output holding its
    gradient (the graph's outputs are the loss, then the gradients in this order)."""
    graph: Graph
    loss: str
    grads: tuple[tuple[str, str], ...]


class _LossStep(torch.nn.Module):
    """module and loss_fn as one module whose output is the loss: what the joint export
    differentiates. Its inputs are the module's arguments, then the targets."""

    def __init__(self, module: torch.nn.Module, loss_fn: Any, n_args: int) -> None:
        super().__init__()
        self.module = module
        self.n_args = n_args
        object.__setattr__(self, "loss_fn", loss_fn)  # not a submodule: no names of its own

    def forward(self, *inputs: Any) -> torch.Tensor:
        out = self.module(*inputs[:self.n_args])
        return self.loss_fn(out, *inputs[self.n_args:])


def trace_step(module: torch.nn.Module, args: Sequence[Any], loss_fn: Any,
               targets: Sequence[Any], *, fuse: bool = True) -> StepGraph:
    """Capture `loss_fn(module(*args), *targets)` and its gradient with respect to every
    parameter as one graph (torch.export's joint forward-backward, lowered as `trace`
    lowers a forward). The backward's kernels are joins like the forward's: matmuls with
    transposed operands, elementwise derivatives, sums over the batch for the weights'
    gradients; sdpa's backward is fused like its forward (`joint.py`, `attention.py`), and
    with `fuse` so is attention the model spells out (`fuse_grad.py`; `fuse=False` keeps it
    as written, and the forward's chains as `trace` does).
    Inputs: the module's arguments, the targets and the parameters, named as `trace` names
    them; bind them with `bind_step`."""
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
    step = _LossStep(module, loss_fn, len(args))
    try:
        with _without_cache(module):
            ep = torch.export.export(step, args + targets, strict=False)
        joint = export_joint(ep, fuse_spelled=fuse)
    except EinsummableError:
        raise
    except Exception as e:  # noqa: BLE001 - export failures become library errors
        raise UnsupportedOpError(
            f"torch.export could not capture the training step: {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}", op=type(module).__name__,
            fix="the loss must be a scalar tensor computed from the module's output and the "
                "targets; make forward exportable (no data-dependent control flow)") from e
    graph = _capture(joint, strip="module.")
    if fuse:
        graph = fuse_graph(graph)
    from torch.export.graph_signature import OutputKind
    loss, grads = None, []
    for spec, out in zip(joint.graph_signature.output_specs, graph.outputs):
        if spec.kind == OutputKind.LOSS_OUTPUT:
            loss = out
        elif spec.kind == OutputKind.GRADIENT_TO_PARAMETER:
            grads.append((spec.target.removeprefix("module."), out))
    return StepGraph(graph, loss, tuple(grads))


def bind_step(step: StepGraph, module: torch.nn.Module, args: Sequence[Any],
              targets: Sequence[Any], given: Mapping[str, torch.Tensor] | None = None
              ) -> dict[str, torch.Tensor]:
    """The inputs of a `trace_step` graph: the arguments and targets in order, the module's
    parameters and buffers by name. `given`: inputs the caller holds (an optimizer's state
    and step scalars, `training.TrainStep`), taken as they are."""
    given = dict(given or {})
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    targets = tuple(targets) if isinstance(targets, (list, tuple)) else (targets,)
    flat = [t for t in pytree.tree_leaves(args + targets) if isinstance(t, torch.Tensor)]
    user = [t for t in step.graph.inputs if t.kind == "input" and t.name not in given]
    if len(user) != len(flat):
        raise EinsummableError(f"the step takes {len(user)} tensors (arguments, then targets), "
                               f"got {len(flat)}", fix="pass the args and targets it was traced with")
    out = {t.name: v for t, v in zip(user, flat)}
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(dict(module.named_buffers(remove_duplicate=False)))
    for t in step.graph.weights:
        if t.name in given:
            continue
        if t.name not in state:
            raise EinsummableError(f"weight {t.name!r} is not a parameter or buffer of the module",
                                   fix="bind with the module that was traced")
        value = state[t.name]
        # a buffer as it is (a pool sends a weight again when it is another object)
        out[t.name] = value.detach() if value.requires_grad else value
    return {**out, **given}


@contextlib.contextmanager
def _without_cache(module: torch.nn.Module) -> Iterator[None]:
    """A transformers model returns its KV cache (a `DynamicCache`, which torch.export cannot
    output) unless its config says `use_cache=False`; capture is of one forward without a
    cache, so the flag is off while exporting and restored after."""
    config = getattr(module, "config", None)
    if getattr(config, "use_cache", None) is None:
        yield
        return
    saved = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = saved


def _functional(ep: torch.export.ExportedProgram) -> bool:
    sig = ep.graph_signature
    if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
        return False
    return not any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
                   for n in ep.graph.nodes if n.op == "call_function")


def _decomposition(target: Any) -> Any:
    if target is None or not isinstance(target, torch._ops.OpOverload):
        return None
    from torch._decomp import core_aten_decompositions, decomposition_table
    core = core_aten_decompositions()
    if target in core:
        return core[target]
    return decomposition_table.get(target)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n([^\n]*)')
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _source(node: torch.fx.Node) -> tuple[str | None, str]:
    """("file:line", code) of the innermost frame of a node's stack trace outside torch itself
    (the user's own line, not nn.Conv2d's conv.py); torch's own frame when there is no other."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return None, ""
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    path, line, code = (user or frames)[-1]
    return f"{path}:{line}", code.strip()


def _module_of(node: torch.fx.Node) -> str:
    """' in module layers.0.conv (Conv2d)' for the innermost submodule running the node."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    cls = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    return f" in module {path or '(root)'} ({cls.rpartition('.')[2]})"


def _in_module(src: str | None, node: torch.fx.Node) -> str | None:
    """An op's source as the graph keeps it: "file:line in layers.0.attention.wo", the
    innermost submodule that ran it named by its path (none for the root module's own code),
    so errors and plans name both (`optimizer/report.where`)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    if src is None or not path:
        return src
    return f"{src} in {path}"


# What to do about ops with no join-agg mapping, by their ATen name (without the overload).
_ADVICE = {
    **dict.fromkeys(("gt", "lt", "ge", "le", "eq", "ne", "logical_and", "logical_or"),
                    "a comparison of data makes a condition that depends on inputs: build masks "
                    "from constants (triu, tril, arange) or pass an additive float mask in"),
    **dict.fromkeys(("cumsum", "cumprod"),
                    "a running sum has no join-agg form: multiply by a triangular ones matrix "
                    "(x @ torch.ones(n, n).triu()) or compute it outside the traced forward"),
    **dict.fromkeys(("convolution", "conv1d", "conv2d", "conv3d"),
                    "convolution has no mapping here: write it as unfold + matmul, or capture "
                    "the part of the model after it"),
    **dict.fromkeys(("rand", "randn", "randint", "bernoulli", "native_dropout", "normal"),
                    "random ops cannot be planned: call module.eval() and pass random tensors "
                    "in as inputs"),
    **dict.fromkeys(("nonzero", "masked_select", "argmax", "argmin", "sort", "topk", "unique"),
                    "the result's values or size depend on the data: compute it outside the "
                    "traced forward and pass it in"),
    **dict.fromkeys(("index_put", "index_put_", "copy_", "scatter", "scatter_add"),
                    "writes into a tensor have no join-agg form: build the result with cat, "
                    "where or a lookup instead"),
}
_LISTING = "einsummable.frontend.capture.supported_ops() lists every op that maps"


def _fix(target: Any) -> str:
    name = getattr(getattr(target, "_schema", None), "name", str(target)).rpartition("::")[2]
    advice = _ADVICE.get(name) or (f"rewrite this line without {name} (matmuls, einsum, "
                                   "elementwise ops, reductions, views and lookups map), or "
                                   "compute it outside the traced forward")
    return f"{advice}; {_LISTING}"


def _unsupported(node: torch.fx.Node, src: str | None, code: str, why: str) -> UnsupportedOpError:
    text = f"cannot capture ATen op {node.target}{_module_of(node)}: {why}"
    if code:
        text += f"\n    {code}"
    err = UnsupportedOpError(text, op=node.name, source=src, fix=_fix(node.target))
    err.aten_op = node.target
    return err


def _has_tensor(x: Any) -> bool:
    return any(isinstance(v, TENSORISH) and not isinstance(v, Folded)
               for v in pytree.tree_leaves(x))


def _capture(ep: torch.export.ExportedProgram, strip: str = "") -> Graph:
    """The program as a Graph; `strip`: a prefix taken off parameter names (a wrapper's)."""
    sig = ep.graph_signature
    weights = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    lifted = sig.inputs_to_lifted_tensor_constants
    em = Emitter({}, [], {})
    env: dict[torch.fx.Node, Any] = {}
    outputs: list[str] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if node.name in lifted:
                env[node] = fold.real(ep.constants[lifted[node.name]])
            elif not isinstance(val, torch.Tensor):
                env[node] = val
            elif node.name in weights and val.dtype == torch.bool:
                env[node] = _bool_state(ep, weights[node.name], val)
            elif node.name in sig.inputs_to_buffers and val.ndim == 0:
                env[node] = _scalar_buffer(ep, em, weights[node.name], val)
            else:
                kind = "weight" if node.name in weights else "input"
                name = weights.get(node.name, node.name)
                if strip and kind == "weight" and name.startswith(strip):
                    name = name[len(strip):]
                env[node] = em.add_tensor(name, tuple(val.shape), fold.ir_dtype(val.dtype), kind)
            continue
        if node.op == "output":
            src, _ = _source(node)
            em.source = src
            for value in pytree.tree_leaves(node.args[0]):
                v = env[value] if isinstance(value, torch.fx.Node) else value
                outputs.append(em.stored(v).base)
            continue
        if node.op != "call_function":
            raise UnsupportedOpError(f"FX node kind {node.op!r} ({node.target})", op=node.name)
        if node.target in IGNORED:
            continue
        src, code = _source(node)
        em.source, em.stem = _in_module(src, node), node.name
        args = torch.fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
        if node.target is not operator.getitem and (
                not _has_tensor((args, kwargs)) or node.target in fold.LIKE
                or node.target in fold.NEW):
            folded = fold.fold(node.target, args, kwargs, node.meta.get("val"))
            if folded is not None:
                env[node] = folded
                continue
        handler = TABLE.get(node.target)
        if handler is None:
            raise _unsupported(node, src, code, "no join-agg mapping")
        try:
            value = handler(Ctx(em, node), node, list(args), dict(kwargs))
        except EinsummableError as e:
            if not getattr(e, "source", None):
                raise _unsupported(node, src, code, str(e)) from e
            raise
        except Exception as e:  # noqa: BLE001 - a mapping bug must still name the line
            raise _unsupported(node, src, code, f"{type(e).__name__}: {e}") from e
        if isinstance(value, (Lazy, SliceVal)) and value.name is None:
            value = dataclasses.replace(value, name=node.name, source=em.source)
        users = [u for u in node.users if u.target not in IGNORED]
        if isinstance(value, Lazy) and len(users) > 1:
            value = em.view(value)
        env[node] = value
    return _finish(em, outputs)


def _bool_state(ep: torch.export.ExportedProgram, name: str, val: torch.Tensor) -> Folded:
    """A boolean buffer (a mask) is folded: graph tensors are numbers. On the meta device it
    has no values, so it stays opaque and fails where it is used."""
    t = ep.state_dict.get(name, ep.constants.get(name))
    if t is None or t.is_meta:
        return Folded("opaque", tuple(val.shape), val.dtype)
    return fold.real(t)


def _scalar_buffer(ep: torch.export.ExportedProgram, em: Emitter, name: str,
                   val: torch.Tensor) -> Any:
    """A 0-d buffer (Gemma's embedding scale) is a number: folded when it has a value; on the
    meta device a weight of one element (a graph tensor has at least one mode) seen as 0-d."""
    t = ep.state_dict.get(name, ep.constants.get(name))
    if t is not None and not t.is_meta:
        return fold.real(t)
    return em.add_tensor(name, (1,), fold.ir_dtype(val.dtype), "weight").with_([])


def _finish(em: Emitter, outputs: list[str]) -> Graph:
    used = {n for op in em.ops for n in op.inputs} | set(outputs)
    tensors = tuple(t for t in em.tensors.values()
                    if t.kind in ("input", "intermediate") or t.name in used)
    consts = tuple((n, c) for n, c in em.constants.items() if n in used)
    return Graph(tensors, tuple(em.ops), tuple(outputs), consts)


def bind(graph: Graph, module: torch.nn.Module, args: Sequence[Any],
         kwargs: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The inputs `reference.evaluate(graph, ...)` needs: user tensors, parameters, buffers."""
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    kwargs = dict(kwargs or {})
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(dict(module.named_buffers(remove_duplicate=False)))
    by_name: dict[str, torch.Tensor] = {}
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        by_name = {k: v for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)}
    except (TypeError, ValueError):
        pass
    flat = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    user = [t for t in graph.inputs if t.kind == "input"]
    out: dict[str, torch.Tensor] = {}
    for i, t in enumerate(user):
        if t.name in by_name:
            out[t.name] = by_name[t.name]
        elif i < len(flat):
            out[t.name] = flat[i]
    for t in graph.weights:
        if t.name not in state:
            raise EinsummableError(f"weight {t.name!r} is not a parameter or buffer of the module",
                                   fix="bind with the module that was traced")
        value = state[t.name]
        # a buffer as it is (a pool sends a weight again when it is another object)
        out[t.name] = value.detach() if value.requires_grad else value
    return out
