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

It keeps that meaning only where the value *is* such a term, so it is made only there
(``mask_path``): every out-of-range entry is negative and every use of the value reaches the
argument of an exp (or a softmax) through shape ops, converts, selects, adds, the minuend of a
subtraction and row maxima. Anywhere else -- ``x / 1e5``, ``clip(x, -1e5, 1e5)`` -- 2^15 would
be a different number, so the constant keeps its value: host ops compute with it in f32, and
the NPU rules see a bound beyond fp16 and leave the op to the host.

A row the mask removes entirely is the one case the substitution does not keep: the exact
softmax of ``logits + finfo.min`` is uniform (f32 absorbs the logits), while ``logits - 2^15``
keeps what fp16 or f32 leaves of them.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops import Op
from ..weight_timing import timed
from .compile_cache import memo_of_array
from .const_views import distinct_view

FP16_MAX = float(np.finfo(np.float16).max)     # 65504
U16 = 2.0 ** -11                               # fp16's unit roundoff (11-bit significand)
MASK_MAGNITUDE = 2.0 ** 15


def extremes(a: np.ndarray) -> tuple[float, float]:
    """(min, max) of a non-empty array (NaN if it holds one), computed once per read-only
    array in a compile (compile_cache.py): weights are scanned by the weight check, every
    constant fold and every bound pass."""
    return memo_of_array("extremes", a, lambda: _scan_extremes(a))


def _scan_extremes(a: np.ndarray) -> tuple[float, float]:
    # a read of the value's bytes: weight work (weight_timing "scan"), one per array; a
    # broadcast constant's repeats are not read again (const_views.py)
    if a.size:
        a = distinct_view(a)
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


def saturate_consts(consts: dict[int, np.ndarray], graph: Graph) -> dict[int, np.ndarray]:
    """The compile-time values of ``graph`` with fp16-unrepresentable floats saturated where
    the value is a softmax mask term (``mask_path``; a new dict); each read-only value once
    per compile (the range plan saturates its folds up to five times)."""
    out = dict(consts)
    users: dict[int, list[Node]] | None = None
    outputs: set[int] = set()
    for k, v in consts.items():
        if not needs_saturation(v):
            continue
        if users is None:
            users, outputs = graph.users(), {o.id for o in graph.outputs}
        if mask_path(users, k, v, outputs):
            out[k] = memo_of_array("saturate", v, lambda v=v: _saturated_copy_read_only(v))
    return out


# ops a mask term passes through unchanged in meaning (operand index -> the path continues
# through the result); None: any operand
_CARRY = {Op.BROADCAST_IN_DIM: None, Op.RESHAPE: None, Op.SLICE: None, Op.TRANSPOSE: None,
          Op.CONCATENATE: None, Op.CONVERT: None, Op.ADD: None, Op.MAX: None,
          Op.REDUCE_MAX: None, Op.SELECT_N: "cases", Op.SUB: 0, Op.PAD: None}
_ROW_MAX = frozenset({Op.REDUCE_MAX, Op.MAX})


def mask_path(users: dict[int, list[Node]], vid: int, value: np.ndarray,
              outputs: set[int] | frozenset[int] = frozenset()) -> bool:
    """True when saturating ``value`` (value id ``vid``) to -2^15 keeps every result: its
    out-of-range entries are negative, and every use reaches the argument of an exp or a
    softmax only through ``_CARRY`` ops, as the subtrahend of a subtraction only once it has
    gone through a row max (``x - max(x)``), and never a graph output."""
    a = np.asarray(value)
    with np.errstate(invalid="ignore"):
        if np.any(a > FP16_MAX):
            return False
    seen: set[tuple[int, bool]] = set()
    stack = [(vid, False)]
    while stack:
        v, maxed = stack.pop()
        if (v, maxed) in seen:
            continue
        seen.add((v, maxed))
        nodes = users.get(v)
        if not nodes or v in outputs:
            return False                      # a graph output (or unused): no softmax
        for n in nodes:
            if n.op in (Op.EXP, Op.SOFTMAX):
                continue
            idx = [i for i, x in enumerate(n.inputs) if x.id == v]
            if n.op is Op.SUB and idx != [0]:
                if not maxed or 0 in idx:
                    return False
                stack.append((n.out.id, False))
                continue
            if n.op not in _CARRY:
                return False
            elif _CARRY[n.op] == "cases" and 0 in idx:
                return False                  # a select's predicate
            elif isinstance(_CARRY[n.op], int) and idx != [_CARRY[n.op]]:
                return False
            stack.append((n.out.id, maxed or n.op in _ROW_MAX))
    return True


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
