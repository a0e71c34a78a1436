"""The numpy reference that defines each op's values: the registry ``REFERENCE``.

``REFERENCE[op](inputs, attrs, out_type)`` returns an array of exactly ``out_type``.  The aim is
XLA-on-CPU semantics (what ``jax.lax`` gives on CPU): f16/bf16 element-wise math is computed in
f32 and rounded once, dot/conv/reduce_sum accumulate f16/bf16 in f32, integer arithmetic wraps,
integer division truncates toward zero with XLA's results for x/0 and INT_MIN/-1, and
float->int conversion saturates with NaN -> 0.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.special

from .ops import Op
from .types import DType, TensorType

RefFn = Callable[[Sequence[np.ndarray], Mapping[str, Any], TensorType], np.ndarray]


def _wide(dt: np.dtype) -> np.dtype:
    """The dtype arithmetic is carried out in: f16/bf16 go through f32, the rest stay."""
    if dt.kind == "f" or dt.name == "bfloat16":
        return np.dtype(np.float32) if dt.itemsize < 4 else dt
    return dt


def _cast(x: np.ndarray | np.generic, t: TensorType) -> np.ndarray:
    return np.asarray(x).astype(t.dtype.to_numpy(), copy=False).reshape(t.shape)


# ---------------------------------------------------------------- sources

def _constant(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    return np.array(attrs["value"], copy=True)


def _param(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    # A param's value lives outside the graph; the interpreter binds it by name.
    raise LookupError(f"param {attrs['name']!r} has no value inside the graph; bind it through "
                      "interpreter.run(..., params={name: array})")


def _iota(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    d = attrs["dimension"]
    ramp = np.arange(t.shape[d]).reshape([-1 if i == d else 1 for i in range(t.rank)])
    return _cast(np.broadcast_to(ramp, t.shape), t)


# ---------------------------------------------------------------- element-wise

def _float_unary(f: Callable[[np.ndarray], np.ndarray]) -> RefFn:
    def ref(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
        (x,) = ins
        return _cast(f(x.astype(_wide(x.dtype))), t)
    return ref


def _activation(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                ) -> np.ndarray:
    from .activations import activation

    (x,) = ins
    return _cast(activation(attrs["kind"]).reference(x.astype(np.float64)), t)


def _softmax(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    (x,) = ins
    axes = tuple(attrs["axes"])
    if x.size == 0:   # an empty row has no maximum; the result is as empty as the input
        return _cast(x, t)
    x = x.astype(np.float64)
    e = np.exp(x - np.max(x, axis=axes, keepdims=True))
    return _cast(e / np.sum(e, axis=axes, keepdims=True), t)


def _layer_norm(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                ) -> np.ndarray:
    (x,) = ins
    axes = tuple(attrs["axes"])
    if x.size == 0:
        return _cast(x, t)
    c = x.astype(np.float64) - np.mean(x.astype(np.float64), axis=axes, keepdims=True)
    return _cast(c / np.sqrt(np.mean(c * c, axis=axes, keepdims=True) + attrs["eps"]), t)


def _integer_pow(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                 ) -> np.ndarray:
    # Square-and-multiply like XLA's expansion of integer_pow; ints wrap.
    (x,) = ins
    y = int(attrs["y"])
    base = x.astype(_wide(x.dtype))
    acc = np.ones_like(base)
    n = abs(y)
    while n:
        if n & 1:
            acc = acc * base
        base = base * base
        n >>= 1
    if y < 0:
        acc = np.ones_like(acc) / acc
    return _cast(acc, t)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero; x/0 = -1 (all ones) and INT_MIN/-1 = INT_MIN,
    as XLA's CPU emitter defines them."""
    safe_b = np.where(b == 0, 1, b).astype(a.dtype)
    if a.dtype.kind == "i":
        overflow = (a == np.iinfo(a.dtype).min) & (safe_b == -1)
        safe_b = np.where(overflow, 1, safe_b).astype(a.dtype)
        q = a // safe_b  # floors; step back toward zero where a remainder is left
        q = q + (((a % safe_b) != 0) & ((a < 0) != (safe_b < 0))).astype(a.dtype)
    else:
        q = a // safe_b
    q = np.where(b == 0, ~np.zeros((), a.dtype), q)  # all ones: -1 signed, max unsigned
    return q.astype(a.dtype)


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> RefFn:
    """Arithmetic and comparisons alike: both operands widened, ``f`` applied, the result cast
    to the node's type (the operand dtype, or bool for a comparison)."""
    def ref(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
        a, b = ins
        w = _wide(a.dtype)
        return _cast(f(a.astype(w), b.astype(w)), t)
    return ref


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    return a / b


def _select_n(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    which, *cases = ins
    idx = which.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(cases)):
        raise IndexError(f"select_n selector holds {int(idx.min())}..{int(idx.max())} but there "
                         f"are only {len(cases)} cases")
    return _cast(np.choose(np.broadcast_to(idx, t.shape), cases), t)


# ---------------------------------------------------------------- reductions

def _reduce_sum(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    (x,) = ins
    w = _wide(x.dtype)
    return _cast(np.sum(x.astype(w), axis=tuple(attrs["axes"]), dtype=w), t)


def _max_identity(dtype: np.dtype) -> Any:
    """The identity of max over ``dtype``: what an empty reduction or a padded window gives."""
    if dtype == np.bool_:
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _reduce_max(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    (x,) = ins
    w = _wide(x.dtype)
    return _cast(np.max(x.astype(w), axis=tuple(attrs["axes"]), initial=_max_identity(x.dtype)), t)


def _windows(x: np.ndarray, attrs: Mapping[str, Any], fill: Any) -> np.ndarray:
    """Every window of the padded operand as the trailing axes: [*out, *window]."""
    pad = [(int(lo), int(hi)) for lo, hi in attrs["padding"]]
    xp = np.pad(x, pad, constant_values=fill) if pad else x
    win = tuple(int(w) for w in attrs["window_dimensions"])
    v = np.lib.stride_tricks.sliding_window_view(xp, win)
    return v[tuple(slice(None, None, int(s)) for s in attrs["window_strides"])]


def _reduce_window_max(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                       ) -> np.ndarray:
    (x,) = ins
    w = _wide(x.dtype)
    if 0 in t.shape:
        return np.zeros(t.shape, t.dtype.to_numpy())
    v = _windows(x.astype(w), attrs, _max_identity(x.dtype))
    return _cast(v.max(axis=tuple(range(x.ndim, 2 * x.ndim))), t)


def _reduce_window_sum(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                       ) -> np.ndarray:
    (x,) = ins
    acc = _acc_dtype(x.dtype) if x.dtype.kind in "iu" else _wide(x.dtype)
    if 0 in t.shape:
        return np.zeros(t.shape, t.dtype.to_numpy())
    v = _windows(x.astype(acc), attrs, 0)
    return _cast(v.sum(axis=tuple(range(x.ndim, 2 * x.ndim)), dtype=acc), t)


# ---------------------------------------------------------------- shape ops

def _broadcast_in_dim(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                      ) -> np.ndarray:
    (x,) = ins
    shape = [1] * t.rank
    for src, dst in enumerate(attrs["broadcast_dimensions"]):
        shape[dst] = x.shape[src]
    return np.array(np.broadcast_to(x.reshape(shape), t.shape))


def _reshape(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    return ins[0].reshape(t.shape)


def _transpose(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    return np.array(np.transpose(ins[0], attrs["permutation"]), order="C")


def _slice(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    sl = tuple(slice(s, l, st) for s, l, st in zip(attrs["start"], attrs["limit"],
                                                   attrs["strides"]))
    return np.array(ins[0][sl])


def _concatenate(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                 ) -> np.ndarray:
    return np.concatenate(list(ins), axis=attrs["dimension"])


def pad_array(x: np.ndarray, value: Any, low: Sequence[int], high: Sequence[int],
              interior: Sequence[int]) -> np.ndarray:
    """lax.pad: interior padding first, then edge padding; negative edges crop."""
    shape = [d + max(d - 1, 0) * it for d, it in zip(x.shape, interior)]
    spread = np.full(shape, value, dtype=x.dtype)
    spread[tuple(slice(None, None, it + 1) for it in interior)] = x
    grown = [max(lo, 0) + n + max(hi, 0) for lo, hi, n in zip(low, high, shape)]
    out = np.full(grown, value, dtype=x.dtype)
    out[tuple(slice(max(lo, 0), max(lo, 0) + n) for lo, n in zip(low, shape))] = spread
    crop = tuple(slice(max(-lo, 0), g - max(-hi, 0)) for lo, hi, g in zip(low, high, grown))
    return np.array(out[crop])


def _pad(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    x, v = ins
    return _cast(pad_array(x, v[()], attrs["low"], attrs["high"], attrs["interior"]), t)


def convert_array(x: np.ndarray, t: TensorType) -> np.ndarray:
    """lax.convert_element_type on CPU: float->int truncates, saturates, and maps NaN to 0;
    anything->bool is `!= 0`; int->int wraps; float->float rounds to nearest even."""
    dst = t.dtype.to_numpy()
    if t.dtype is DType.BOOL:
        return _cast(x != 0, t)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        if t.dtype.is_int:
            info = np.iinfo(dst)
            f = x.astype(np.float64)
            f = np.where(np.isnan(f), 0.0, np.trunc(f))
            # Clip in float64, then exact integer clip (float64 cannot hold int64's max).
            f = np.clip(f, float(info.min), float(info.max))
            big = f >= float(info.max)
            ints = np.where(big, 0, f).astype(np.int64 if info.min < 0 else np.uint64)
            ints = np.where(big, info.max, ints)
            return _cast(ints, t)
        if x.dtype != np.float32 and dst.itemsize < 4 and x.dtype.itemsize < 4:
            # f16 <-> bf16 goes through f32, which holds both exactly.
            return _cast(x.astype(np.float32), t)
    return _cast(x, t)


def _convert(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    return convert_array(ins[0], t)


# ---------------------------------------------------------------- contractions

def _acc_dtype(dt: np.dtype) -> np.dtype:
    if dt.kind in "iu" or dt == np.bool_:
        # Wrapping in 64 bits and truncating gives the same low bits as wrapping in 32.
        return np.dtype(np.uint64 if dt.kind == "u" else np.int64)
    return np.dtype(np.float32) if dt.itemsize <= 4 else dt


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _contract(lhs: np.ndarray, rhs: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """dot_general in the accumulation dtype (unrounded)."""
    lc, rc, lb, rb = (attrs[k] for k in ("lhs_contract", "rhs_contract", "lhs_batch",
                                         "rhs_batch"))
    letters = iter(_LETTERS)
    ls = [next(letters) for _ in range(lhs.ndim)]
    rs = [next(letters) for _ in range(rhs.ndim)]
    for a, b in zip(lc, rc):
        rs[b] = ls[a]
    for a, b in zip(lb, rb):
        rs[b] = ls[a]
    out = ([ls[a] for a in lb] + [ls[i] for i in range(lhs.ndim) if i not in lc and i not in lb]
           + [rs[i] for i in range(rhs.ndim) if i not in rc and i not in rb])
    acc = _acc_dtype(lhs.dtype)
    return np.einsum(f"{''.join(ls)},{''.join(rs)}->{''.join(out)}", lhs.astype(acc),
                     rhs.astype(acc), optimize=True)


def _dot_general(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                 ) -> np.ndarray:
    return _cast(_contract(ins[0], ins[1], attrs), t)


def _matmul_epilogue(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType
                     ) -> np.ndarray:
    """act(lhs . rhs * scale + bias + residual) in float64, rounded once to the result type."""
    y = _contract(np.asarray(ins[0], np.float64), np.asarray(ins[1], np.float64), attrs)
    rest = [np.asarray(a, np.float64) for a in ins[2:]]
    if attrs["scale"]:
        s = rest.pop(1 if attrs["bias"] else 0)
        y = y * s
    if attrs["bias"]:
        y = y + rest.pop(0)
    if attrs["residual"]:
        y = y + rest.pop(0)
    if attrs["act"] != "none":
        from .activations import ACTIVATIONS
        y = ACTIVATIONS[attrs["act"]].reference(y)
    return _cast(y, t)


def _conv(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    """Direct convolution (cross-correlation, like lax.conv_general_dilated): dilate and pad
    the input, gather one strided view per kernel tap, and contract taps x features."""
    lhs, rhs = ins
    acc = _acc_dtype(lhs.dtype)
    strides, padding = attrs["window_strides"], attrs["padding"]
    lhs_dil, rhs_dil = attrs["lhs_dilation"], attrs["rhs_dilation"]
    g = attrs["feature_group_count"]
    n, c = lhs.shape[:2]
    o = rhs.shape[0]
    ksize = rhs.shape[2:]
    ns = len(ksize)
    x = pad_array(lhs.astype(acc), 0, [0, 0] + [p[0] for p in padding],
                  [0, 0] + [p[1] for p in padding], [0, 0] + [d - 1 for d in lhs_dil])
    out_sp = t.shape[2:]
    taps = []
    for k in np.ndindex(*ksize):
        sl = tuple(slice(ki * rd, ki * rd + (osz - 1) * st + 1, st) if osz else slice(0, 0)
                   for ki, rd, st, osz in zip(k, rhs_dil, strides, out_sp))
        taps.append(x[(slice(None), slice(None)) + sl])
    patches = np.stack(taps, axis=2) if taps else np.zeros((n, c, 0) + tuple(out_sp), acc)
    # patches [N, C, P, *out] -> [N, G, C/G, P, *out]; weights [G, O/G, C/G, P]
    patches = patches.reshape((n, g, c // g, len(taps)) + tuple(out_sp))
    w = rhs.astype(acc).reshape((g, o // g, c // g, -1))
    sp = _LETTERS[:ns]
    res = np.einsum(f"ngcp{sp},gocp->ngo{sp}", patches, w, optimize=True)
    return _cast(res.reshape((n, o) + tuple(out_sp)), t)


def _take(ins: Sequence[np.ndarray], attrs: Mapping[str, Any], t: TensorType) -> np.ndarray:
    x, idx = ins
    axis = attrs["axis"]
    size = x.shape[axis]
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise IndexError(f"take: index {int(idx.max() if idx.max() >= size else idx.min())} "
                         f"is out of range for axis {axis} of size {size}")
    return _cast(np.take(x, idx.astype(np.int64), axis=axis), t)


# ---------------------------------------------------------------- registry

def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.ones_like(x) / np.sqrt(x)


REFERENCE: dict[Op, RefFn] = {
    Op.CONSTANT: _constant,
    Op.PARAM: _param,
    Op.IOTA: _iota,
    Op.NEG: _float_unary(np.negative),
    Op.ABS: _float_unary(np.abs),
    Op.EXP: _float_unary(np.exp),
    Op.LOG: _float_unary(np.log),
    Op.TANH: _float_unary(np.tanh),
    Op.LOGISTIC: _float_unary(scipy.special.expit),
    Op.ERF: _float_unary(scipy.special.erf),
    Op.SQRT: _float_unary(np.sqrt),
    Op.RSQRT: _float_unary(_rsqrt),
    Op.SIN: _float_unary(np.sin),
    Op.COS: _float_unary(np.cos),
    Op.INTEGER_POW: _integer_pow,
    Op.ACTIVATION: _activation,
    Op.ADD: _binary(np.add),
    Op.SUB: _binary(np.subtract),
    Op.MUL: _binary(np.multiply),
    Op.DIV: _binary(_div),
    Op.MAX: _binary(np.maximum),
    Op.MIN: _binary(np.minimum),
    Op.POW: _binary(np.power),
    Op.EQ: _binary(np.equal),
    Op.NE: _binary(np.not_equal),
    Op.LT: _binary(np.less),
    Op.LE: _binary(np.less_equal),
    Op.GT: _binary(np.greater),
    Op.GE: _binary(np.greater_equal),
    Op.SELECT_N: _select_n,
    Op.REDUCE_SUM: _reduce_sum,
    Op.REDUCE_MAX: _reduce_max,
    Op.REDUCE_WINDOW_MAX: _reduce_window_max,
    Op.REDUCE_WINDOW_SUM: _reduce_window_sum,
    Op.BROADCAST_IN_DIM: _broadcast_in_dim,
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice,
    Op.CONCATENATE: _concatenate,
    Op.PAD: _pad,
    Op.CONVERT: _convert,
    Op.DOT_GENERAL: _dot_general,
    Op.CONV: _conv,
    Op.TAKE: _take,
    Op.SOFTMAX: _softmax,
    Op.LAYER_NORM: _layer_norm,
    Op.MATMUL_EPILOGUE: _matmul_epilogue,
}
_missing = [op.text for op in Op if op not in REFERENCE]
assert not _missing, f"ops without a numpy reference: {_missing}"


def evaluate(op: Op, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_type: TensorType
             ) -> np.ndarray:
    """Run one op's reference and check it produced exactly ``out_type``."""
    with np.errstate(all="ignore"):  # inf/NaN results are defined values, not errors
        res = REFERENCE[op](inputs, attrs, out_type)
    if res.dtype != out_type.dtype.to_numpy() or res.shape != out_type.shape:
        raise AssertionError(f"reference of {op.text} returned {res.dtype}{list(res.shape)}, "
                             f"expected {out_type}: a bug in rockjit.ir.reference")
    return res
