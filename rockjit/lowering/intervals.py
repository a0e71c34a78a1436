"""Disjoint sorted integer intervals, joined where one starts at or before another's end, found
by bisection: a merged step's writes per buffer (coalesce.py) and the arena's pinned blocks
(memory.py)."""
from __future__ import annotations

from bisect import bisect_left, bisect_right


class Spans:
    """Sorted, disjoint ``[lo[i], hi[i])`` intervals; ``add`` joins an interval into those it
    meets or touches."""

    __slots__ = ("lo", "hi")

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        i = bisect_left(self.hi, lo)            # first interval ending at or after lo
        j = bisect_right(self.lo, hi)           # intervals starting at or before hi
        if i < j:
            lo, hi = min(lo, self.lo[i]), max(hi, self.hi[j - 1])
        self.lo[i:j] = [lo]
        self.hi[i:j] = [hi]

    def hits(self, lo: int, hi: int) -> bool:
        i = bisect_right(self.lo, hi - 1) - 1   # the last interval starting before hi
        return i >= 0 and self.hi[i] > lo
