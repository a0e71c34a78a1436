"""Import rules for data-movement primitives: broadcast, reshape, transpose, slicing, padding,
concatenation and iota."""
from __future__ import annotations

from ..ir.graph import Value
from ..ir.ops import Op
from .context import EqnContext
from .registry import import_rule


@import_rule("broadcast_in_dim")
def _broadcast_in_dim(ctx: EqnContext, x: Value) -> Value:
    dims = tuple(int(d) for d in ctx.params["broadcast_dimensions"])
    return ctx.add(Op.BROADCAST_IN_DIM, [x], {"broadcast_dimensions": dims}, ctx.out_type)


@import_rule("reshape")
def _reshape(ctx: EqnContext, x: Value) -> Value:
    # `dimensions` (a transpose folded into the reshape) is deprecated but still legal.
    dims = ctx.params.get("dimensions")
    if dims is not None:
        x = ctx.transpose(x, dims)
    return ctx.add(Op.RESHAPE, [x], {}, ctx.out_type)


@import_rule("squeeze")
def _squeeze(ctx: EqnContext, x: Value) -> Value:
    # x[0] traces to slice + squeeze; dropping unit dims is a reshape in the IR.
    return ctx.add(Op.RESHAPE, [x], {}, ctx.out_type)


@import_rule("transpose")
def _transpose(ctx: EqnContext, x: Value) -> Value:
    return ctx.add(Op.TRANSPOSE, [x], {"permutation": tuple(int(p) for p in
                                                            ctx.params["permutation"])})


@import_rule("slice")
def _slice(ctx: EqnContext, x: Value) -> Value:
    start = tuple(int(s) for s in ctx.params["start_indices"])
    limit = tuple(int(s) for s in ctx.params["limit_indices"])
    strides = ctx.params.get("strides")
    strides = (1,) * len(start) if strides is None else tuple(int(s) for s in strides)
    return ctx.add(Op.SLICE, [x], {"start": start, "limit": limit, "strides": strides})


@import_rule("split")
def _split(ctx: EqnContext, x: Value) -> list[Value]:
    # jnp.split emits one `split` primitive (new in jax 0.4.36); each piece is a slice.
    axis = int(ctx.params["axis"])
    outs, offset = [], 0
    for size in ctx.params["sizes"]:
        start = [0] * x.type.rank
        limit = list(x.type.shape)
        start[axis], limit[axis] = offset, offset + int(size)
        outs.append(ctx.add(Op.SLICE, [x], {"start": tuple(start), "limit": tuple(limit),
                                             "strides": (1,) * x.type.rank}))
        offset += int(size)
    return outs


@import_rule("concatenate")
def _concatenate(ctx: EqnContext, *xs: Value) -> Value:
    return ctx.add(Op.CONCATENATE, list(xs), {"dimension": int(ctx.params["dimension"])})


@import_rule("pad")
def _pad(ctx: EqnContext, x: Value, padding_value: Value) -> Value:
    config = [tuple(int(c) for c in cfg) for cfg in ctx.params["padding_config"]]
    return ctx.add(Op.PAD, [x, padding_value], {"low": tuple(c[0] for c in config),
                                               "high": tuple(c[1] for c in config),
                                               "interior": tuple(c[2] for c in config)})


@import_rule("iota")
def _iota(ctx: EqnContext) -> Value:
    return ctx.add(Op.IOTA, [], {"dimension": int(ctx.params["dimension"])}, ctx.out_type)
