"""Integer rounding for sizes, alignments and tile counts (the lowering's one home for it)."""
from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(x: int, m: int) -> int:
    """The smallest multiple of ``m`` that is >= ``x``."""
    return ceil_div(x, m) * m
