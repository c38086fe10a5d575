"""`make demo`: the main job end to end.

Stage 1 describes the LLaMA-7B block as join-agg ops: op count, FLOPs, bytes, and how many
decompositions each op exposes on 8 devices.
"""
from __future__ import annotations

import sys

from einsummable.models import preset
from einsummable.spec import decompositions

DEVICES = 8


def describe_block(name: str = "llama-7b", batch: int = 4, seq: int = 2048) -> None:
    module, args = preset(name, batch=batch, seq=seq, device="meta")
    graph = load_graph(module, args, name, batch, seq)
    print(f"== {name} block, batch {batch}, sequence {seq}, fp16 ==")
    print(f"ops {len(graph.ops)}   FLOPs {graph.flops / 1e12:.2f} T   "
          f"bytes {graph.bytes / 1e9:.2f} GB")
    print(f"{'op':<22} {'einsum':<28} {'kind':<22} decompositions@{DEVICES}")
    total = 0
    for op in graph.ops:
        n = len(decompositions(op, DEVICES))
        total += n
        kind = f"fused:{op.fused}" if op.fused else ("view" if op.is_view else
                                                    f"{op.join.fn}/{op.agg or '-'}")
        print(f"{op.name:<22} {op.einsum:<28} {kind[:22]:<22} {n}")
    print(f"total decompositions over all ops: {total}")


def load_graph(module, args, name: str, batch: int, seq: int):
    """Capture the module; fall back to the hand-built IR block only if capture is missing."""
    try:
        from einsummable.capture import trace
    except ImportError:
        from einsummable.models.llama_ir import llama_block_graph
        print("(capture unavailable: using the builder's IR block)")
        return llama_block_graph(module.config, batch, seq, dtype="float16")
    return trace(module, args).with_dtype("float16")


def main() -> int:
    describe_block()
    return 0


if __name__ == "__main__":
    sys.exit(main())
