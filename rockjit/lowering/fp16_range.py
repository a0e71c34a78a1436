"""Float constants that fp16 cannot hold: an additive attention mask's "minus infinity".

Encoders build attention masks as ``where(allowed, 0, finfo(f32).min)`` (HF's eager path,
models/layers.mask_bias) or with ``-inf``; JAX's softmax takes ``max(reduce_max(x), -inf)``.
Held in fp16 (the NPU's float) both become -inf, and -inf poisons the softmax on the NPU:
``-inf - max`` stays -inf, and the exp LUT's index of -inf meets the zero out-of-table slope
as ``inf * 0 = NaN`` (lut.c's underflow extrapolation).

So the lowering saturates every compile-time float value outside fp16's finite range (and
every infinity) to ``+-MASK_MAGNITUDE`` before any op sees it. 2^15 is exact in fp16, is
large enough that ``exp(-2^15 + logit - max)`` is 0 in every precision (and lands in the LUT's
clamped underflow region), and leaves 65504 - 32768 = 32736 of headroom, so adding a logit
and subtracting the row max (each far below 2^14 in any real model) stays finite in fp16.
The substitution keeps the meaning of a mask (an added term that removes a key from a
softmax); tolerance.graph_bound applies the same one so the bound describes this program.
"""
from __future__ import annotations

import numpy as np

from ..weight_timing import timed
from .compile_cache import memo_of_array

FP16_MAX = float(np.finfo(np.float16).max)     # 65504
U16 = 2.0 ** -11                               # fp16's unit roundoff (11-bit significand)
MASK_MAGNITUDE = 2.0 ** 15


def extremes(a: np.ndarray) -> tuple[float, float]:
    """(min, max) of a non-empty array (NaN if it holds one), computed once per read-only
    array in a compile (compile_cache.py): weights are scanned by the weight check, every
    constant fold and every bound pass."""
    return memo_of_array("extremes", a, lambda: _scan_extremes(a))


def _scan_extremes(a: np.ndarray) -> tuple[float, float]:
    # a read of the value's bytes: weight work (weight_timing "scan"), one per array. A
    # broadcast constant (a mask, a scale over every head) is a view whose stride-0 axes
    # read the same bytes at every index: index 0 of each holds every value there is
    if isinstance(a, np.ndarray) and 0 in a.strides and a.size:
        a = a[tuple(slice(0, 1) if st == 0 else slice(None) for st in a.strides)]
    with timed("scan") as scanned:
        scanned[0] = a.nbytes
        return float(np.min(a)), float(np.max(a))


def needs_saturation(a: np.ndarray) -> bool:
    """True when float ``a`` holds a value fp16 would turn into an infinity (or one already)."""
    a = np.asarray(a)
    if a.dtype.kind != "f" or a.size == 0:
        return False
    lo, hi = extremes(a)
    if lo >= -FP16_MAX and hi <= FP16_MAX:
        return False          # the common case, without a temporary the size of a weight
    with np.errstate(invalid="ignore"):
        return bool(np.any(np.abs(a) > FP16_MAX))   # NaN compares False: left alone


def saturate(a: np.ndarray) -> np.ndarray:
    """``a`` with every value beyond fp16's finite range (infinities included) replaced by
    +-MASK_MAGNITUDE (module docstring); NaN stays NaN, everything else is unchanged."""
    a = np.asarray(a)
    if not needs_saturation(a):
        return a
    out = np.array(a, copy=True)
    with np.errstate(invalid="ignore"):
        big = np.abs(out) > FP16_MAX
    out[big] = np.sign(out[big]) * MASK_MAGNITUDE
    return out


def saturate_consts(consts: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The compile-time values with fp16-unrepresentable floats saturated (a new dict); each
    read-only value once per compile (the range plan saturates its folds up to five times)."""
    return {k: memo_of_array("saturate", v, lambda v=v: _saturated_copy_read_only(v))
            for k, v in consts.items()}


def _saturated_copy_read_only(a: np.ndarray) -> np.ndarray:
    """``saturate(a)``; a copy it made is marked read-only (so later scans of it are
    memoized too), ``a`` itself is returned untouched."""
    out = saturate(a)
    if out is not a and isinstance(out, np.ndarray):
        out.setflags(write=False)
    return out


# The bound the range plan (range_plan.py) assumes for every float graph input: a float32
# argument's dtype range says nothing useful, and the NPU reads inputs as fp16 anyway, so
# inputs are taken to lie within fp16's finite range (the call-time input check enforces it).
INPUT_BOUND = FP16_MAX
