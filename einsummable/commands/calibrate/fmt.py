"""Figures as the topology YAML writes them: SI prefixes and units the reader parses back
(`topology/units.py`), four significant digits (a rounding far below any measurement's noise).
"""
from __future__ import annotations

DIGITS = 4
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, unit: str) -> str:
    """'1.234 GB/s' for si(1.234e9, 'B/s')."""
    for scale, prefix in _PREFIXES:
        if abs(x) >= scale:
            return f"{x / scale:.{DIGITS}g} {prefix}{unit}"
    return f"{x:.{DIGITS}g} {unit}"


def duration(s: float) -> str:
    """Seconds as microseconds: '96.12 us'."""
    return f"{s * 1e6:.{DIGITS}g} us"


def number(x: float) -> str:
    """A plain number that YAML reads back as a float (mantissa with a dot): '1.234e+09'."""
    return f"{x:.{DIGITS - 1}e}"


def fraction(x: float) -> str:
    """A fraction in (0, 1] with four decimals: '0.8123'."""
    return f"{x:.{DIGITS}f}"
