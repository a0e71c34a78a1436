"""Import rules for reductions."""
from __future__ import annotations

from ..ir.graph import Value
from ..ir.ops import Op
from .context import EqnContext
from .registry import import_rule


def _axes(ctx: EqnContext) -> tuple[int, ...]:
    return tuple(int(a) for a in ctx.params["axes"])


@import_rule("reduce_sum")
def _reduce_sum(ctx: EqnContext, x: Value) -> Value:
    # `out_sharding` (jax 0.10) places the result on devices; a single NPU has one placement.
    return ctx.add(Op.REDUCE_SUM, [x], {"axes": _axes(ctx)})


@import_rule("reduce_max")
def _reduce_max(ctx: EqnContext, x: Value) -> Value:
    return ctx.add(Op.REDUCE_MAX, [x], {"axes": _axes(ctx)})


@import_rule("reduce_min")
def _reduce_min(ctx: EqnContext, x: Value) -> Value:
    # min(x) == -max(-x) is exact for floats; for integers the most negative value would wrap.
    if not x.type.dtype.is_float:
        raise ctx.unsupported(f"reduce_min over {x.type} (only floating-point tensors)")
    neg = ctx.add(Op.NEG, [x])
    return ctx.add(Op.NEG, [ctx.add(Op.REDUCE_MAX, [neg], {"axes": _axes(ctx)})])


def _window_attrs(ctx: EqnContext) -> dict:
    p = ctx.params
    # XLA's dilated windows (atrous pooling) and dilated bases have no IR form yet.
    for key in ("base_dilation", "window_dilation"):
        if any(int(d) != 1 for d in p.get(key, ())):
            raise ctx.unsupported(f"{key}={tuple(p[key])} (only undilated windows; rewrite the "
                                  f"pool without dilation)")
    return {"window_dimensions": tuple(int(w) for w in p["window_dimensions"]),
            "window_strides": tuple(int(s) for s in p["window_strides"]),
            "padding": tuple((int(lo), int(hi)) for lo, hi in p["padding"])}


@import_rule("reduce_window_max")
def _reduce_window_max(ctx: EqnContext, x: Value) -> Value:
    return ctx.add(Op.REDUCE_WINDOW_MAX, [x], _window_attrs(ctx))


@import_rule("reduce_window_sum")
def _reduce_window_sum(ctx: EqnContext, x: Value) -> Value:
    return ctx.add(Op.REDUCE_WINDOW_SUM, [x], _window_attrs(ctx))


@import_rule("reduce_window_min")
def _reduce_window_min(ctx: EqnContext, x: Value) -> Value:
    # min == -max(-x) with the -inf padding of the max becoming +inf: exact for floats only.
    if not x.type.dtype.is_float:
        raise ctx.unsupported(f"reduce_window_min over {x.type} (only floating-point tensors)")
    neg = ctx.add(Op.NEG, [x])
    return ctx.add(Op.NEG, [ctx.add(Op.REDUCE_WINDOW_MAX, [neg], _window_attrs(ctx))])


@import_rule("reduce_window")
def _reduce_window_generic(ctx: EqnContext, *operands: Value) -> Value:
    # lax.reduce_window picks reduce_window_{max,min,sum} when the computation is lax.max /
    # lax.min / lax.add and the init value is that monoid's identity; anything else lands here.
    raise ctx.unsupported(
        "lax.reduce_window with a custom computation or a non-identity init value; only "
        "max-pooling (lax.max with init -inf), min-pooling (lax.min with init +inf) and "
        "sum/avg-pooling (lax.add with init 0) windows compile")
