"""Where a compile spends its time on the resident weights, by bucket, when asked.

``bench/compile_vs_xla.py`` reports the compile without the weight work (issue 9: "excluding
weight packing") and the weight work alone beside a memcpy of the same bytes. Inside
``recording()``, each ``timed(bucket)`` block adds its wall time and the bytes it declares to
the bucket; outside, ``timed`` costs one context-variable read. Buckets (one place each):

    bind    the resident values copied to read-only float32 (api.Lowered.compile)
    fold    norm gains folded into projection weights and a norm's bias contracted with
            them into their biases (gain_fold.py), a weight prescaled by a power of two where
            its product could overflow (range_rewrites.py) or by an attention score's scale
            (score_scales.py), and a rotated projection's weight columns permuted and negated
            (rotation_fold.py)
    pack    weights and other compile-time constants cast to fp16 and packed into the form
            their reader wants (matmul rule: tile-major weights; residency: constant tensors)
    upload  the packed weights written into the device's weight BOs (runtime LoadedImage)
    scan    the range plan's and the weight check's reads of every compile-time value: min/max
            (fp16_range.extremes) and the L1 norms of matmul/conv weights (range_bounds.py),
            once per array and compile; O(weight bytes), they change with the weights only

A block inside another ``timed`` block adds its bytes to its own bucket but not its time
(the outer block's time already holds it), so the buckets never count a second twice.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

_record: contextvars.ContextVar[dict[str, list[float]] | None] = contextvars.ContextVar(
    "rockjit_weight_timing", default=None)
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("rockjit_weight_timing_inside",
                                                               default=False)


@contextlib.contextmanager
def recording() -> Iterator[dict[str, list[float]]]:
    """bucket -> [seconds, bytes] for the weight work done inside the block."""
    rec: dict[str, list[float]] = {}
    token = _record.set(rec)
    try:
        yield rec
    finally:
        _record.reset(token)


@contextlib.contextmanager
def timed(bucket: str) -> Iterator[list[int]]:
    """Time the block into ``bucket``; the block sets ``box[0]`` to the bytes it produced."""
    box = [0]
    rec = _record.get()
    if rec is None:
        yield box
        return
    outer = not _inside.get()
    token = _inside.set(True)
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        dt = time.perf_counter() - t0
        _inside.reset(token)
        e = rec.setdefault(bucket, [0.0, 0])
        if outer:
            e[0] += dt
        e[1] += box[0]
