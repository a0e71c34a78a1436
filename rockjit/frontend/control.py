"""Import rules for call-like primitives (inlined) and identities.

Calls are inlined: their inner equations are imported in place, and those without a user
frame of their own (jax's internal helpers) take the call site's location."""
from __future__ import annotations

from typing import Any

from ..ir.graph import Value
from .context import EqnContext
from .registry import import_rule


def _inner_jaxpr(ctx: EqnContext) -> Any:
    # jit/pjit and remat keep it under `jaxpr`; closed_call, core_call, custom_jvp_call and
    # custom_vjp_call under `call_jaxpr`; jax < 0.4.30's custom_vjp_call_jaxpr under `fun_jaxpr`.
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in ctx.params:
            return ctx.params[key]
    raise ctx.unsupported(f"no inner jaxpr among its params {sorted(ctx.params)}")


@import_rule("jit", "pjit", "closed_call", "call", "core_call", "custom_jvp_call",
             "custom_jvp_call_jaxpr", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat2",
             "checkpoint")
def _inline_call(ctx: EqnContext, *args: Value) -> list[Value]:
    # Custom derivative rules only matter under differentiation, which happens before tracing
    # reaches us; the primal computation is the call's own jaxpr.  The operands of
    # custom_jvp_call/custom_vjp_call start with `num_consts` consts that the inner jaxpr also
    # takes as leading invars, so all operands pass through unchanged.
    return ctx.inline(_inner_jaxpr(ctx), args)


@import_rule("stop_gradient", "copy", "copy_p", "device_put", "sharding_constraint",
             "optimization_barrier")
def _identity(ctx: EqnContext, *args: Value) -> list[Value]:
    # Values pass through: these only affect differentiation, buffer aliasing or placement.
    return list(args)
