"""Reading a folded constant without its repeats.

A constant folded from a broadcast (a mask over every head, a scale over [B, H, S, S], a table
over 12 heads) is a numpy view whose stride-0 axes read the same bytes at every index: index 0
of each such axis holds every value there is, so a scan of that slice answers for the whole
constant at a fraction of its size.
"""
from __future__ import annotations

import numpy as np


def distinct_view(a: np.ndarray, keep_last: bool = False) -> np.ndarray:
    """``a`` with each stride-0 axis cut to index 0 (``keep_last``: the last axis kept whole)."""
    a = np.asarray(a)
    if not a.ndim or 0 not in a.strides:
        return a
    strides = a.strides[:-1] if keep_last else a.strides
    return a[tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)]


def uniform_value(a: np.ndarray) -> float | None:
    """The one value every element of ``a`` holds, or None (an empty array, two values, NaN)."""
    flat = distinct_view(a).reshape(-1)
    if not flat.size:
        return None
    first = flat[0]
    # the last element first: a table (a rotary cos/sin) differs there, without a full scan
    if flat[-1] != first or not np.all(flat == first):
        return None
    return float(first)
