"""Where a compile spends its time on the resident weights, by bucket, when asked.

``bench/compile_vs_xla.py`` reports the compile without the weight work (issue 9: "excluding
weight packing") and the weight work alone beside a memcpy of the same bytes. Inside
``recording()``, each ``timed(bucket)`` block adds its wall time and the bytes it declares to
the bucket; outside, ``timed`` costs one context-variable read. Buckets (one place each):

    bind    the resident values copied to read-only float32 (api.Lowered.compile)
    fold    norm gains folded into projection weights (gain_fold.py)
    pack    weights and other compile-time constants cast to fp16 and packed into the form
            their reader wants (matmul rule: tile-major weights; residency: constant tensors)
    upload  the packed weights written into the device's weight BOs (runtime LoadedImage)
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

_record: contextvars.ContextVar[dict[str, list[float]] | None] = contextvars.ContextVar(
    "rockjit_weight_timing", default=None)


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
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        e = rec.setdefault(bucket, [0.0, 0])
        e[0] += time.perf_counter() - t0
        e[1] += box[0]
