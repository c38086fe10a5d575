"""Einsum strings with mode groups: ``"bs(he),hef->bsf"``.

Every tensor dimension of an operand (or of the output) is a *group* of one or more modes,
outermost first; ``(he)`` is one dimension of size h*e. This module parses the strings, prints
them back, and answers the two questions every stage asks of a group list: its modes in order,
and its shape given each mode's size.
"""
from __future__ import annotations

import math

from ..errors import EinsumParseError

Dims = tuple[tuple[str, ...], ...]  # one group of modes per tensor dimension


def _caret(text: str, pos: int) -> str:
    return f"\n    {text}\n    {' ' * pos}^"


def parse_dims(text: str, *, full: str | None = None, offset: int = 0) -> Dims:
    """Parse one operand, e.g. ``bsd`` or ``bs(he)``, into mode groups."""
    full = text if full is None else full
    groups: list[tuple[str, ...]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isalpha():
            groups.append((ch,))
            i += 1
        elif ch == "(":
            close = text.find(")", i)
            if close < 0:
                raise EinsumParseError("unclosed '(' in einsum string" + _caret(full, offset + i),
                                       fix="close the group, e.g. 'bs(he)'")
            inner = text[i + 1:close]
            for j, c in enumerate(inner):
                if not c.isalpha():
                    raise EinsumParseError(f"unexpected {c!r} inside a mode group"
                                           + _caret(full, offset + i + 1 + j),
                                           fix="a group holds mode letters only")
            if not inner:
                raise EinsumParseError("empty mode group" + _caret(full, offset + i))
            groups.append(tuple(inner))
            i = close + 1
        else:
            raise EinsumParseError(f"unexpected character {ch!r} in einsum string"
                                   + _caret(full, offset + i),
                                   fix="modes are single letters a-z, A-Z; operands are separated "
                                       "by ',' and the output follows '->'")
    flat = [m for g in groups for m in g]
    for j, m in enumerate(flat):
        if m in flat[:j]:
            pos = offset + text.index(m, text.index(m) + 1)
            raise EinsumParseError(f"mode {m!r} repeats within one operand" + _caret(full, pos),
                                   fix="take a diagonal explicitly; each operand names a mode once")
    return tuple(groups)


def parse_einsum(spec: str, *, strict: bool = True) -> tuple[tuple[Dims, ...], Dims]:
    """``"bsd,df->bsf"`` -> ((input dims...), output dims). Errors point at the bad character.

    With ``strict=False`` an output mode may be new (a size-1 dim, as keepdim makes).
    """
    text = spec.replace(" ", "")
    if text.count("->") != 1:
        pos = text.find("->", text.find("->") + 1) if text.count("->") > 1 else len(text)
        raise EinsumParseError("an einsum string needs exactly one '->'" + _caret(text, max(pos, 0)),
                               fix="write it as 'ij,jk->ik'")
    lhs, rhs = text.split("->")
    if not lhs:
        raise EinsumParseError("no input operands before '->'" + _caret(text, 0))
    inputs: list[Dims] = []
    offset = 0
    for part in lhs.split(","):
        if not part:
            raise EinsumParseError("empty operand" + _caret(text, offset),
                                   fix="remove the extra ',' or name the operand's modes")
        inputs.append(parse_dims(part, full=text, offset=offset))
        offset += len(part) + 1
    out = parse_dims(rhs, full=text, offset=len(lhs) + 2)
    seen = {m for d in inputs for g in d for m in g}
    for m in (m for g in out for m in g):
        if strict and m not in seen:
            raise EinsumParseError(f"output mode {m!r} appears in no input"
                                   + _caret(text, len(lhs) + 2 + rhs.index(m)),
                                   fix="every output mode must come from an input")
    return tuple(inputs), out


def dims_to_str(dims: Dims) -> str:
    return "".join(g[0] if len(g) == 1 else "(" + "".join(g) + ")" for g in dims)


def flat_modes(dims: Dims) -> tuple[str, ...]:
    return tuple(m for g in dims for m in g)


def dims_shape(dims: Dims, size: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(size[m] for m in g) for g in dims)

