"""Shape/dtype rules: one per op, in the registry ``SHAPE_RULES``.

A rule takes the operand types, the attributes and the caller's result-type hint and returns the
result type, or raises ``VerifyError``.  For ops whose result is not a function of the operands
and attributes (param, iota, reshape, convert, broadcast_in_dim) the hint *is* the result and
the rule only checks that it is legal.  Semantics follow ``jax.lax``; the numpy reference in
``rockjit.ir.reference`` defines the values.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import VerifyError
from .ops import Group, Op
from .rule_checks import (Rule, RuleError, arity, axes_attr, fail, int_attr, ints_attr, is_int,
                          need_hint)
from .type_memo import remembered
from .types import DType, TensorType


# ---------------------------------------------------------------- source ops

def _constant(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
              ) -> TensorType:
    arity(ins, 0)
    value = attrs["value"]
    if not isinstance(value, np.ndarray):
        fail(f"attribute value must be a numpy array, got {type(value).__name__}")
    try:
        t = TensorType.of(value)
    except TypeError as e:
        fail(str(e))
    # The array carries its own type; a hint may only restate it.
    return t


def _param(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
           ) -> TensorType:
    arity(ins, 0)
    name = attrs["name"]
    if not isinstance(name, str) or not name:
        fail(f"attribute name must be a non-empty string, got {name!r}")
    return need_hint(hint, "a param's type is that of the bound weight")


def _iota(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
          ) -> TensorType:
    arity(ins, 0)
    t = need_hint(hint, "iota's shape and dtype")
    d = int_attr(attrs, "dimension")
    if not 0 <= d < t.rank:
        fail(f"dimension {d} is out of range for result {t}")
    if t.dtype is DType.BOOL:
        fail(f"iota needs a numeric result type, got {t}")
    return t


# ---------------------------------------------------------------- element-wise ops

_FLOAT_ONLY_UNARY = {Op.EXP, Op.LOG, Op.TANH, Op.LOGISTIC, Op.ERF, Op.SQRT, Op.RSQRT, Op.SIN,
                     Op.COS, Op.ACTIVATION}


def _unary(op: Op) -> Rule:
    def rule(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
        arity(ins, 1)
        (t,) = ins
        if op in _FLOAT_ONLY_UNARY and not t.dtype.is_float:
            fail(f"needs a floating-point operand, got {t}")
        if t.dtype is DType.BOOL:
            fail(f"needs a numeric operand, got {t}")
        if op is Op.ACTIVATION:
            from .activations import FUSABLE
            if attrs.get("kind") not in FUSABLE:
                fail(f"unknown activation kind {attrs.get('kind')!r}; known: "
                      f"{', '.join(FUSABLE)}")
        if op is Op.INTEGER_POW:
            y = int_attr(attrs, "y")
            if y < 0 and not t.dtype.is_float:
                fail(f"negative exponent y={y} needs a floating-point operand, got {t}")
        return t
    return rule


# Arithmetic on bool has no lax meaning; max/min on bool are or/and and are allowed.
_NO_BOOL_BINARY = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW}


def _binary(op: Op) -> Rule:
    def rule(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
        arity(ins, 2)
        a, b = ins
        if a != b:
            fail(f"operands must have one type (the IR has no implicit broadcasting or "
                  f"promotion), got {a} and {b}")
        if op in _NO_BOOL_BINARY and a.dtype is DType.BOOL:
            fail(f"needs numeric operands, got {a}")
        if op is Op.POW and not a.dtype.is_float:
            fail(f"needs floating-point operands, got {a}")
        return a
    return rule


def _compare(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
    arity(ins, 2)
    a, b = ins
    if a != b:
        fail(f"operands must have one type, got {a} and {b}")
    return TensorType(DType.BOOL, a.shape)


def _select_n(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
              ) -> TensorType:
    if len(ins) < 2:
        fail(f"takes a selector and at least one case, got {len(ins)} operand(s)")
    which, *cases = ins
    if which.dtype not in (DType.BOOL, DType.I32):
        fail(f"selector must be bool or i32, got {which}")
    if which.dtype is DType.BOOL and len(cases) > 2:
        fail(f"a bool selector picks from at most 2 cases, got {len(cases)}")
    first = cases[0]
    for i, c in enumerate(cases[1:], 1):
        if c != first:
            fail(f"all cases must have one type; case 0 is {first}, case {i} is {c}")
    if which.shape != () and which.shape != first.shape:
        fail(f"selector shape {which} must be a scalar or match the cases' shape {first}")
    return first


# ---------------------------------------------------------------- reductions

def _reduce(op: Op) -> Rule:
    def rule(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
        arity(ins, 1)
        (t,) = ins
        axes = axes_attr(attrs, "axes", t.rank)
        if op is Op.REDUCE_SUM and t.dtype is DType.BOOL:
            fail(f"needs a numeric operand, got {t}")
        return TensorType(t.dtype, tuple(d for i, d in enumerate(t.shape) if i not in axes))
    return rule


def _softmax(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    if not t.dtype.is_float:
        fail(f"needs a floating-point operand, got {t}")
    if not axes_attr(attrs, "axes", t.rank):
        fail("needs at least one axis")
    return t


def _layer_norm(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
                ) -> TensorType:
    t = _softmax(ins, attrs, hint)
    eps = attrs.get("eps")
    if not isinstance(eps, float) or not eps >= 0:
        fail(f"eps must be a float >= 0, got {eps!r}")
    return t


def _matmul_epilogue(ins: Sequence[TensorType], attrs: Mapping[str, Any],
                     hint: TensorType | None) -> TensorType:
    flags = [attrs[k] for k in ("bias", "scale", "residual")]
    if not all(isinstance(f, bool) for f in flags):
        fail(f"bias, scale and residual must be booleans, got {flags}")
    arity(ins, 2 + sum(flags))
    dims = {k: attrs[k] for k in ("lhs_contract", "rhs_contract", "lhs_batch", "rhs_batch")}
    t = _dot_general(ins[:2], dims, None)
    if not t.dtype.is_float:
        fail(f"needs floating-point operands, got {t}")
    if t.rank < 1:
        fail("needs an output feature axis (N), got a scalar product")
    rest = list(ins[2:])
    for name, on in zip(("bias", "scale"), flags[:2]):
        if on:
            v = rest.pop(0)
            if v != TensorType(t.dtype, (t.shape[-1],)):
                fail(f"{name} must be {t.dtype.value}[{t.shape[-1]}] (one per output feature), "
                     f"got {v}")
    if flags[2] and rest.pop(0) != t:
        fail(f"residual must have the output's type {t}")
    from .activations import FUSABLE
    if attrs["act"] != "none" and attrs["act"] not in FUSABLE:
        fail(f"act must be 'none' or an activation kind ({', '.join(FUSABLE)}), got "
             f"{attrs['act']!r}")
    return t


def _reduce_window(op: Op) -> Rule:
    def rule(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
        arity(ins, 1)
        (t,) = ins
        window = ints_attr(attrs, "window_dimensions", t.rank)
        strides = ints_attr(attrs, "window_strides", t.rank)
        padding = attrs["padding"]
        if (not isinstance(padding, (tuple, list)) or len(padding) != t.rank
                or not all(isinstance(p, (tuple, list)) and len(p) == 2
                           and all(is_int(x) for x in p) for p in padding)):
            fail(f"attribute padding must be {t.rank} (lo, hi) integer pairs, got {padding!r}")
        if any(w < 1 for w in window) or any(s < 1 for s in strides):
            fail(f"window_dimensions {list(window)} and window_strides {list(strides)} must "
                  f"be >= 1")
        if any(int(x) < 0 for p in padding for x in p):
            fail(f"padding {padding!r} must be >= 0")
        if op is Op.REDUCE_WINDOW_SUM and t.dtype is DType.BOOL:
            fail(f"needs a numeric operand, got {t}")
        shape = tuple(conv_output_size(d, w, s, (int(p[0]), int(p[1])), 1, 1)
                      for d, w, s, p in zip(t.shape, window, strides, padding))
        return TensorType(t.dtype, shape)
    return rule


# ---------------------------------------------------------------- shape ops

def _broadcast_in_dim(ins: Sequence[TensorType], attrs: Mapping[str, Any],
                      hint: TensorType | None) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    out = need_hint(hint, "broadcast_in_dim's result shape")
    if out.dtype != t.dtype:
        fail(f"result dtype {out.dtype.value} differs from operand {t}")
    dims = ints_attr(attrs, "broadcast_dimensions", t.rank)
    for i, (d, size) in enumerate(zip(dims, t.shape)):
        if not 0 <= d < out.rank:
            fail(f"broadcast_dimensions={list(dims)}: {d} is out of range for result {out}")
        if i and d <= dims[i - 1]:
            fail(f"broadcast_dimensions={list(dims)} must be strictly increasing")
        if size != 1 and size != out.shape[d]:
            fail(f"operand dim {i} (size {size}) cannot broadcast to result dim {d} "
                  f"(size {out.shape[d]}) of {out}")
    return out


def _reshape(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    out = need_hint(hint, "reshape's result shape")
    if out.dtype != t.dtype:
        fail(f"result dtype {out.dtype.value} differs from operand {t}")
    if out.size != t.size:
        fail(f"cannot reshape {t} ({t.size} elements) to {out} ({out.size} elements)")
    return out


def _transpose(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
               ) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    perm = ints_attr(attrs, "permutation", t.rank)
    if sorted(perm) != list(range(t.rank)):
        fail(f"permutation={list(perm)} is not a permutation of 0..{t.rank - 1}")
    return TensorType(t.dtype, tuple(t.shape[p] for p in perm))


def _slice(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
           ) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    start = ints_attr(attrs, "start", t.rank)
    limit = ints_attr(attrs, "limit", t.rank)
    strides = ints_attr(attrs, "strides", t.rank)
    shape = []
    for i, (s, l, st, d) in enumerate(zip(start, limit, strides, t.shape)):
        if not 0 <= s <= l <= d:
            fail(f"dim {i}: need 0 <= start ({s}) <= limit ({l}) <= size ({d}) of {t}")
        if st < 1:
            fail(f"dim {i}: stride {st} must be >= 1")
        shape.append(-(-(l - s) // st))
    return TensorType(t.dtype, tuple(shape))


def _concatenate(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
                 ) -> TensorType:
    if not ins:
        fail("takes at least one operand")
    first = ins[0]
    dim = int_attr(attrs, "dimension")
    if not 0 <= dim < first.rank:
        fail(f"dimension {dim} is out of range for rank {first.rank}")
    total = 0
    for i, t in enumerate(ins):
        if t.dtype != first.dtype or t.rank != first.rank or any(
                a != b for j, (a, b) in enumerate(zip(t.shape, first.shape)) if j != dim):
            fail(f"operand {i} ({t}) does not match operand 0 ({first}) outside dimension {dim}")
        total += t.shape[dim]
    shape = list(first.shape)
    shape[dim] = total
    return TensorType(first.dtype, tuple(shape))


def _pad(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
         ) -> TensorType:
    arity(ins, 2)
    t, pv = ins
    if pv != TensorType(t.dtype, ()):
        fail(f"padding value must be a scalar {t.dtype.value}, got {pv}")
    low = ints_attr(attrs, "low", t.rank)
    high = ints_attr(attrs, "high", t.rank)
    interior = ints_attr(attrs, "interior", t.rank)
    shape = []
    for i, (lo, hi, it, d) in enumerate(zip(low, high, interior, t.shape)):
        if it < 0:
            fail(f"dim {i}: interior padding {it} must be >= 0")
        n = lo + hi + d + max(d - 1, 0) * it
        if n < 0:
            fail(f"dim {i}: negative padding ({lo}, {hi}) removes more than the {d} elements")
        shape.append(n)
    return TensorType(t.dtype, tuple(shape))


def _convert(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
             ) -> TensorType:
    arity(ins, 1)
    (t,) = ins
    out = need_hint(hint, "convert's target dtype")
    if out.shape != t.shape:
        fail(f"convert changes only the dtype; operand {t} vs result {out}")
    return out


# ---------------------------------------------------------------- contractions

def _accumulate_dtype(lhs: TensorType, rhs: TensorType, hint: TensorType | None,
                      shape: tuple[int, ...]) -> TensorType:
    """Operands share one dtype; the result has that dtype unless the hint asks for another of
    the same kind (lax's preferred_element_type, e.g. f16 x f16 -> f32)."""
    if lhs.dtype != rhs.dtype:
        fail(f"operands must have one dtype, got {lhs} and {rhs}")
    if lhs.dtype is DType.BOOL:
        fail(f"needs numeric operands, got {lhs}")
    if hint is None:
        return TensorType(lhs.dtype, shape)
    if hint.shape != shape:
        fail(f"the shape rule gives {TensorType(lhs.dtype, shape)} but the result type is "
              f"declared as {hint}")
    if hint.dtype.is_float != lhs.dtype.is_float or hint.dtype is DType.BOOL:
        fail(f"result dtype {hint.dtype.value} is not of the same kind as operands {lhs.dtype.value}")
    return hint


def _dot_general(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
                 ) -> TensorType:
    arity(ins, 2)
    lhs, rhs = ins
    lc = axes_attr(attrs, "lhs_contract", lhs.rank)
    rc = axes_attr(attrs, "rhs_contract", rhs.rank)
    lb = axes_attr(attrs, "lhs_batch", lhs.rank)
    rb = axes_attr(attrs, "rhs_batch", rhs.rank)
    if len(lc) != len(rc):
        fail(f"lhs_contract={list(lc)} and rhs_contract={list(rc)} differ in length")
    if len(lb) != len(rb):
        fail(f"lhs_batch={list(lb)} and rhs_batch={list(rb)} differ in length")
    if set(lc) & set(lb):
        fail(f"lhs axes {sorted(set(lc) & set(lb))} are both batch and contracting")
    if set(rc) & set(rb):
        fail(f"rhs axes {sorted(set(rc) & set(rb))} are both batch and contracting")
    for a, b in zip(lc, rc):
        if lhs.shape[a] != rhs.shape[b]:
            fail(f"contracting lhs dim {a} (size {lhs.shape[a]}) with rhs dim {b} "
                  f"(size {rhs.shape[b]})")
    for a, b in zip(lb, rb):
        if lhs.shape[a] != rhs.shape[b]:
            fail(f"batch lhs dim {a} (size {lhs.shape[a]}) vs rhs dim {b} (size {rhs.shape[b]})")
    lfree = [d for i, d in enumerate(lhs.shape) if i not in lc and i not in lb]
    rfree = [d for i, d in enumerate(rhs.shape) if i not in rc and i not in rb]
    shape = tuple([lhs.shape[a] for a in lb] + lfree + rfree)
    return _accumulate_dtype(lhs, rhs, hint, shape)


def conv_output_size(size: int, k: int, stride: int, pad: tuple[int, int], lhs_dil: int,
                     rhs_dil: int) -> int:
    """One spatial output extent, as XLA computes it (empty if the window does not fit)."""
    dilated_in = (size - 1) * lhs_dil + 1 + pad[0] + pad[1] if size else pad[0] + pad[1]
    dilated_k = (k - 1) * rhs_dil + 1
    if dilated_in < dilated_k:
        return 0
    return (dilated_in - dilated_k) // stride + 1


def _conv(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
          ) -> TensorType:
    arity(ins, 2)
    lhs, rhs = ins
    if lhs.rank < 3 or lhs.rank != rhs.rank:
        fail(f"needs lhs [N,C,*spatial] and rhs [O,I,*kernel] of one rank >= 3, "
              f"got {lhs} and {rhs}")
    ns = lhs.rank - 2
    strides = ints_attr(attrs, "window_strides", ns)
    lhs_dil = ints_attr(attrs, "lhs_dilation", ns)
    rhs_dil = ints_attr(attrs, "rhs_dilation", ns)
    padding = attrs["padding"]
    if (not isinstance(padding, (tuple, list)) or len(padding) != ns
            or not all(isinstance(p, (tuple, list)) and len(p) == 2 and all(is_int(x) for x in p)
                       for p in padding)):
        fail(f"attribute padding must be {ns} (lo, hi) integer pairs, got {padding!r}")
    groups = int_attr(attrs, "feature_group_count")
    if any(s < 1 for s in strides) or any(d < 1 for d in lhs_dil + rhs_dil):
        fail("window_strides and dilations must be >= 1")
    if groups < 1:
        fail(f"feature_group_count {groups} must be >= 1")
    n, c = lhs.shape[:2]
    o, i = rhs.shape[:2]
    if c != i * groups:
        fail(f"lhs has {c} input features but rhs expects {i} x {groups} groups = {i * groups}")
    if o % groups:
        fail(f"rhs output features {o} are not divisible by feature_group_count {groups}")
    spatial = tuple(conv_output_size(s, k, st, (int(p[0]), int(p[1])), ld, rd)
                    for s, k, st, p, ld, rd in zip(lhs.shape[2:], rhs.shape[2:], strides, padding,
                                                    lhs_dil, rhs_dil))
    return _accumulate_dtype(lhs, rhs, hint, (n, o) + spatial)


def _take(ins: Sequence[TensorType], attrs: Mapping[str, Any], hint: TensorType | None
          ) -> TensorType:
    arity(ins, 2)
    t, idx = ins
    if not idx.dtype.is_int:
        fail(f"indices must be integers, got {idx}")
    axis = int_attr(attrs, "axis")
    if not 0 <= axis < t.rank:
        fail(f"axis {axis} is out of range for operand {t}")
    return TensorType(t.dtype, t.shape[:axis] + idx.shape + t.shape[axis + 1:])


# ---------------------------------------------------------------- registry

SHAPE_RULES: dict[Op, Rule] = {
    Op.CONSTANT: _constant,
    Op.PARAM: _param,
    Op.IOTA: _iota,
    Op.SELECT_N: _select_n,
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
for _op in Op:
    if _op.group is Group.UNARY:
        SHAPE_RULES[_op] = _unary(_op)
    elif _op.group is Group.BINARY:
        SHAPE_RULES[_op] = _binary(_op)
    elif _op.group is Group.COMPARE:
        SHAPE_RULES[_op] = _compare
    elif _op.group is Group.REDUCE:
        SHAPE_RULES[_op] = _reduce(_op)
    elif _op.group is Group.WINDOW:
        SHAPE_RULES[_op] = _reduce_window(_op)
_missing = [op.text for op in Op if op not in SHAPE_RULES]
assert not _missing, f"ops without a shape rule: {_missing}"


def check_attr_names(op: Op, attrs: Mapping[str, Any]) -> None:
    """The op's attribute set is exactly ``op.attr_names``."""
    missing = [k for k in op.attr_names if k not in attrs]
    extra = sorted(k for k in attrs if k not in op.attr_names)
    if missing or extra:
        parts = [text for text, bad in ((f"missing attribute(s) {missing}", missing),
                                        (f"unknown attribute(s) {extra}", extra)) if bad]
        raise VerifyError(f"{op.text}: {' and '.join(parts)}; {op.text} takes exactly "
                          f"{list(op.attr_names)}")


@remembered    # layers and the verifier ask the same questions again (type_memo.py)
def infer_type(op: Op, in_types: Sequence[TensorType], attrs: Mapping[str, Any],
               out_type_hint: TensorType | None = None) -> TensorType:
    """The result type of ``op`` applied to operands of ``in_types`` with ``attrs``.

    Raises ``VerifyError`` if the operands or attributes are illegal for the op, if the op
    needs a hint and none was given, or if a given hint disagrees with the rule."""
    check_attr_names(op, attrs)
    try:
        t = SHAPE_RULES[op](list(in_types), attrs, out_type_hint)
    except RuleError as e:
        operands = ", ".join(str(x) for x in in_types) or "no operands"
        raise VerifyError(f"{op.text}({operands}): {e}") from None
    if out_type_hint is not None and t != out_type_hint:
        operands = ", ".join(str(x) for x in in_types) or "no operands"
        raise VerifyError(f"{op.text}({operands}): the shape rule gives {t} but the result type "
                          f"is declared as {out_type_hint}")
    return t
