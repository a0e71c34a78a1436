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
