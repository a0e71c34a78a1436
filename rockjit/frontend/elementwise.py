"""Import rules for element-wise primitives: unary math, binary arithmetic, compares, select,
dtype conversion, and the few primitives that expand into a short exact composition."""
from __future__ import annotations

import math

from ..ir.graph import Value
from ..ir.ops import Op
from ..ir.types import DType
from .context import EqnContext, dtype_of
from .registry import import_rule

_UNARY = {
    "neg": Op.NEG, "abs": Op.ABS, "exp": Op.EXP, "log": Op.LOG, "tanh": Op.TANH,
    "logistic": Op.LOGISTIC, "erf": Op.ERF, "sqrt": Op.SQRT, "rsqrt": Op.RSQRT,
    "sin": Op.SIN, "cos": Op.COS,
}
_BINARY = {
    "add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV, "max": Op.MAX, "min": Op.MIN,
    "pow": Op.POW,
}
_COMPARE = {"eq": Op.EQ, "ne": Op.NE, "lt": Op.LT, "le": Op.LE, "gt": Op.GT, "ge": Op.GE}


def _same_shape(ctx: EqnContext, *vals: Value) -> list[Value]:
    """Operands broadcast to the equation's result shape.

    jax 0.10.2 jaxprs broadcast implicitly inside element-wise equations: rank-0 operands
    (literals as in `mul 0.5:f32[] x`, and scalar variables such as `div x n` inside jnp.var)
    and size-1 dims of equal-rank operands (softmax's `sub f32[2,3] f32[2,1]`).  The IR has
    no implicit broadcasting, so each such operand gets an explicit broadcast_in_dim."""
    shape = ctx.out_types[0].shape
    return [ctx.broadcast_to(v, shape) for v in vals]


def _make_unary(op: Op):
    def rule(ctx: EqnContext, x: Value) -> Value:
        # `accuracy` (exp, tanh, ...) asks XLA for a precision mode; the IR op has one meaning.
        return ctx.add(op, [x])
    return rule


def _make_binary(op: Op):
    def rule(ctx: EqnContext, a: Value, b: Value) -> Value:
        out = ctx.out_type
        # mul's `out_dtype` (new in jax 0.10) and pow's integer exponent make operand dtypes
        # differ from the result; widening the operands first is exact for both.
        a, b = ctx.convert(a, out.dtype), ctx.convert(b, out.dtype)
        a, b = _same_shape(ctx, a, b)
        return ctx.add(op, [a, b])
    return rule


def _make_compare(op: Op):
    def rule(ctx: EqnContext, a: Value, b: Value) -> Value:
        a, b = _same_shape(ctx, a, b)
        return ctx.add(op, [a, b])
    return rule


# One rule per primitive name, each a thin wrapper around its IR op.
for _table, _make in ((_UNARY, _make_unary), (_BINARY, _make_binary), (_COMPARE, _make_compare)):
    for _name, _op in _table.items():
        import_rule(_name)(_make(_op))


@import_rule("integer_pow")
def _integer_pow(ctx: EqnContext, x: Value) -> Value:
    return ctx.add(Op.INTEGER_POW, [x], {"y": int(ctx.params["y"])})


@import_rule("square")
def _square(ctx: EqnContext, x: Value) -> Value:
    # jnp.square / jnp.var emit a `square` primitive since jax 0.4.36.
    return ctx.add(Op.INTEGER_POW, [x], {"y": 2})


@import_rule("erfc")
def _erfc(ctx: EqnContext, x: Value) -> Value:
    # jax.nn.gelu(approximate=False) is written with erfc in jax 0.10.2.  1 - erf(x) loses
    # relative precision only where erfc(x) itself is below float eps (x > ~4), where gelu's
    # factor 0.5*x*erfc(-x/sqrt2) is already exact to the last bit.
    one = ctx.full(1, x.type)
    return ctx.add(Op.SUB, [one, ctx.add(Op.ERF, [x])])


@import_rule("log1p")
def _log1p(ctx: EqnContext, x: Value) -> Value:
    # log(1 + x) alone loses every digit of a tiny x (1 + 1e-10 == 1 in f32). With u = 1 + x
    # and d = u - 1 (both exact roundings), log(u) * x / d corrects the rounding of u to a few
    # ulps (Goldberg, "What every computer scientist should know about floating-point", thm 4);
    # where u rounds to 1 the answer is x itself. jax.nn.softplus (logaddexp) uses log1p.
    one = ctx.full(1, x.type)
    u = ctx.add(Op.ADD, [one, x])
    d = ctx.add(Op.SUB, [u, one])
    corrected = ctx.add(Op.MUL, [ctx.add(Op.LOG, [u]), ctx.add(Op.DIV, [x, d])])
    return ctx.add(Op.SELECT_N, [ctx.add(Op.EQ, [d, ctx.full(0, x.type)]), corrected, x])


@import_rule("exp2")
def _exp2(ctx: EqnContext, x: Value) -> Value:
    ln2 = ctx.full(math.log(2.0), x.type)
    return ctx.add(Op.EXP, [ctx.add(Op.MUL, [x, ln2])])


@import_rule("is_finite")
def _is_finite(ctx: EqnContext, x: Value) -> Value:
    # x - x is 0 for every finite x and NaN for +-inf and NaN; NaN == 0 is false.
    zero = ctx.full(0, x.type)
    return ctx.add(Op.EQ, [ctx.add(Op.SUB, [x, x]), zero])


@import_rule("sign")
def _sign(ctx: EqnContext, x: Value) -> Value:
    t = x.type
    if t.dtype is DType.BOOL or t.dtype in (DType.U8, DType.U32):
        raise ctx.unsupported(f"sign of an unsigned or bool tensor ({t})")
    zero, one = ctx.full(0, t), ctx.full(1, t)
    # x * 0 keeps NaN as NaN and -0.0 as -0.0, matching lax.sign at those points.
    rest = ctx.add(Op.SELECT_N, [ctx.add(Op.LT, [x, zero]), ctx.add(Op.MUL, [x, zero]),
                                 ctx.add(Op.NEG, [one])])
    return ctx.add(Op.SELECT_N, [ctx.add(Op.GT, [x, zero]), rest, one])


@import_rule("clamp")
def _clamp(ctx: EqnContext, lo: Value, x: Value, hi: Value) -> Value:
    lo, x, hi = _same_shape(ctx, lo, x, hi)
    return ctx.add(Op.MIN, [ctx.add(Op.MAX, [lo, x]), hi])


def _bool_only(ctx: EqnContext, *vals: Value) -> None:
    for v in vals:
        if v.type.dtype is not DType.BOOL:
            raise ctx.unsupported(f"bitwise operations on integer tensors ({v.type}) have no IR "
                                  "op; only bool (mask) operands are supported")


@import_rule("not")
def _not(ctx: EqnContext, x: Value) -> Value:
    _bool_only(ctx, x)
    return ctx.add(Op.EQ, [x, ctx.full(False, x.type)])


@import_rule("and")
def _and(ctx: EqnContext, a: Value, b: Value) -> Value:
    _bool_only(ctx, a, b)
    a, b = _same_shape(ctx, a, b)
    return ctx.add(Op.MIN, [a, b])  # on bool, min is logical and


@import_rule("or")
def _or(ctx: EqnContext, a: Value, b: Value) -> Value:
    _bool_only(ctx, a, b)
    a, b = _same_shape(ctx, a, b)
    return ctx.add(Op.MAX, [a, b])  # on bool, max is logical or


@import_rule("select_n")
def _select_n(ctx: EqnContext, which: Value, *cases: Value) -> Value:
    if which.type.dtype not in (DType.BOOL, DType.I32):
        which = ctx.convert(which, DType.I32)
    if which.type.rank:  # the IR takes a scalar selector or one of the result's shape
        (which,) = _same_shape(ctx, which)
    cases = tuple(_same_shape(ctx, *cases))
    return ctx.add(Op.SELECT_N, [which, *cases])


@import_rule("convert_element_type")
def _convert_element_type(ctx: EqnContext, x: Value) -> Value:
    target = dtype_of(ctx.params["new_dtype"], ctx.loc, "the target of convert_element_type")
    # A convert that only drops weak typing is an identity in the IR.
    return ctx.convert(x, target)

