"""Quantities with units, and the names of dtypes and link kinds: "300 GB/s", "400 Gb/s", "312 TFLOP/s", "40 GiB", "5 us".

Plain numbers are taken in base units (B/s, FLOP/s, bytes, seconds). Decimal (k, M, G, T, P)
and binary (Ki .. Pi) prefixes are accepted; network rates may be quoted in bits.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from ..errors import TopologyError

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


_BINARY = {"Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50}


_PREFIXES = {**_DECIMAL, **_BINARY}


# Each unit is (multiplier, divisor): dividing for sub-unit prefixes keeps typed decimals
# exact ("5 us" -> 5e-06, not 4.9999999999999996e-06).
_BITS_PER_BYTE = 8.0


def _unit_table() -> dict[str, dict[str, tuple[float, float]]]:
    bw: dict[str, tuple[float, float]] = {}
    flops: dict[str, tuple[float, float]] = {}
    size: dict[str, tuple[float, float]] = {"bytes": (1.0, 1.0), "byte": (1.0, 1.0)}
    for p, f in _PREFIXES.items():
        bw[f"{p}B/s"] = (f, 1.0)
        for bits in ("b/s", "bit/s", "bps"):  # network links are quoted in bits
            bw[f"{p}{bits}"] = (f, _BITS_PER_BYTE)
        size[f"{p}B"] = (f, 1.0)
        for name in ("FLOP/s", "FLOPS", "flop/s", "FLOPs/s"):
            flops[f"{p}{name}"] = (f, 1.0)
    time = {"s": (1.0, 1.0), "ms": (1.0, 1e3), "us": (1.0, 1e6), "µs": (1.0, 1e6),
            "μs": (1.0, 1e6), "ns": (1.0, 1e9)}
    return {"bandwidth": bw, "flops": flops, "bytes": size, "time": time}


_UNITS = _unit_table()


# kind -> (what it is, an example, the base unit of a plain number)
QUANTITY_KINDS: Mapping[str, tuple[str, str, str]] = {
    "bandwidth": ("bandwidth", "'25 GB/s'", "bytes/s"),
    "flops": ("FLOP rate", "'312 TFLOP/s'", "FLOP/s"),
    "bytes": ("size", "'40 GB'", "bytes"),
    "time": ("duration", "'5 us'", "seconds"),
}


def _expected(kind: str) -> str:
    word, example, base = QUANTITY_KINDS[kind]
    return f"a {word} such as {example} or a number in {base}"


_NUMBER_RE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


def parse_quantity(value: Any, kind: str) -> float:
    """Parse a number or a unit string of ``kind`` (bandwidth, flops, bytes, time) into base
    units. Raises ValueError with a readable reason."""
    table = _UNITS[kind]
    if isinstance(value, bool):
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    m = _NUMBER_RE.match(value)
    if not m:
        raise ValueError(f"expected {_expected(kind)}, got {value!r}")
    number, unit = float(m.group(1)), m.group(2)
    if unit == "":
        return number
    if unit not in table:
        raise ValueError(f"expected {_expected(kind)}, got {value!r} (unknown unit {unit!r})")
    mul, div = table[unit]
    return number * mul / div


# Names the YAML uses for dtypes and link kinds.

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")


DTYPE_ALIASES: Mapping[str, str] = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32", "float": "float32", "f32": "float32",
}


LINK_KINDS: tuple[str, ...] = ("nvlink", "nvswitch", "pcie", "qpi", "ib", "loopback")


def canonical_dtype(dtype: Any) -> str:
    """'fp16', 'half', torch.float16 -> 'float16'."""
    text = str(dtype).removeprefix("torch.")
    text = DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise TopologyError(f"no peak rate for dtype {dtype!r}",
                            fix=f"use one of {', '.join(DTYPES)}")
    return text

