"""Import rules for contractions: dot_general and conv_general_dilated."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Value
from ..ir.ops import Op
from ..ir.types import DType, TensorType
from .context import EqnContext
from .registry import import_rule


def _operands_for(ctx: EqnContext, lhs: Value, rhs: Value) -> tuple[Value, Value]:
    """Bring both operands to one dtype of the result's kind.

    The IR contracts operands of one dtype into a result of that dtype or of a wider one of the
    same kind (f16 x f16 -> f32, i8 x i8 -> i32).  jax also allows mixed operand dtypes and a
    preferred_element_type of another kind (i8 x i8 -> f32); widening to the result dtype first
    is exact in those cases."""
    out = ctx.out_type.dtype
    if lhs.type.dtype != rhs.type.dtype or lhs.type.dtype.is_float != out.is_float:
        lhs, rhs = ctx.convert(lhs, out), ctx.convert(rhs, out)
    if lhs.type.dtype is DType.BOOL:
        raise ctx.unsupported(f"contraction of bool tensors ({lhs.type}, {rhs.type})")
    return lhs, rhs


@import_rule("dot_general")
def _dot_general(ctx: EqnContext, lhs: Value, rhs: Value) -> Value:
    (lc, rc), (lb, rb) = ctx.params["dimension_numbers"]
    lhs, rhs = _operands_for(ctx, lhs, rhs)
    attrs = {"lhs_contract": tuple(int(a) for a in lc), "rhs_contract": tuple(int(a) for a in rc),
             "lhs_batch": tuple(int(a) for a in lb), "rhs_batch": tuple(int(a) for a in rb)}
    # `precision` only tunes XLA's TPU passes; the result type carries preferred_element_type.
    return ctx.add(Op.DOT_GENERAL, [lhs, rhs], attrs, ctx.out_type)


@import_rule("conv_general_dilated")
def _conv_general_dilated(ctx: EqnContext, lhs: Value, rhs: Value) -> Value:
    p = ctx.params
    if int(p["batch_group_count"]) != 1:
        raise ctx.unsupported(f"batch_group_count={p['batch_group_count']} (the gradient form of "
                              "a grouped conv); only batch_group_count=1 is supported")
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = (tuple(int(d) for d in s)
                                    for s in (dn.lhs_spec, dn.rhs_spec, dn.out_spec))
    lhs, rhs = _operands_for(ctx, lhs, rhs)
    # Each spec lists (batch or out-feature, feature or in-feature, *spatial) as positions in
    # the jax layout, so transposing by the spec yields the IR's N,C,*S / O,I,*K order.
    lhs = ctx.transpose(lhs, lhs_spec)
    rhs = ctx.transpose(rhs, rhs_spec)
    jax_out = ctx.out_type
    canon_shape = tuple(jax_out.shape[d] for d in out_spec)
    attrs = {
        "window_strides": tuple(int(s) for s in p["window_strides"]),
        "padding": tuple((int(lo), int(hi)) for lo, hi in p["padding"]),
        "lhs_dilation": tuple(int(d) for d in p["lhs_dilation"]),
        "rhs_dilation": tuple(int(d) for d in p["rhs_dilation"]),
        "feature_group_count": int(p["feature_group_count"]),
    }
    out = ctx.add(Op.CONV, [lhs, rhs], attrs, TensorType(jax_out.dtype, canon_shape))
    # IR dim i is jax dim out_spec[i]; the inverse permutation restores the jax layout.
    return ctx.transpose(out, tuple(int(i) for i in np.argsort(out_spec)))
