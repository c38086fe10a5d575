"""Matrix-chain workloads: a parenthesised product such as "(A B) (C D)" as a Graph.

Each letter is an input matrix whose shape the config gives; each product is one `ij,jk->ik`
op. Bushy chains (products of products) are what make exchange between ops matter.
"""
from __future__ import annotations

from einsummable.frontend.builder import Builder
from einsummable.frontend.ir import Graph


def parse_chain(expr: str):
    """ "(A B) C" -> nested tuples ((A, B), C); juxtaposition is left-associative."""
    tokens = expr.replace("(", " ( ").replace(")", " ) ").split()
    pos = 0

    def term():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            node = product()
            if tokens[pos] != ")":
                raise ValueError(f"chain {expr!r}: expected ')' at token {pos}")
            pos += 1
            return node
        if not tok.isalnum():
            raise ValueError(f"chain {expr!r}: unexpected {tok!r}")
        return tok

    def product():
        node = term()
        while pos < len(tokens) and tokens[pos] != ")":
            node = (node, term())
        return node

    tree = product()
    if pos != len(tokens):
        raise ValueError(f"chain {expr!r}: trailing tokens")
    return tree


def chain_graph(expr: str, shapes: dict[str, list[int]], dtype: str = "float16") -> Graph:
    b = Builder(dtype)
    leaves = {name: b.input(name, tuple(shape)) for name, shape in shapes.items()}

    def emit(node):
        if isinstance(node, str):
            return leaves[node]
        return b.einsum("ij,jk->ik", emit(node[0]), emit(node[1]))

    return b.build([emit(parse_chain(expr))])


def chain_flops(expr: str, shapes: dict[str, list[int]]) -> int:
    def walk(node):
        if isinstance(node, str):
            return tuple(shapes[node]), 0
        (m, k), fa = walk(node[0])
        (k2, n), fb = walk(node[1])
        return (m, n), fa + fb + 2 * m * k * n
    return walk(parse_chain(expr))[1]
