"""Call-like primitives are inlined: nested jit, custom_jvp / custom_vjp, remat, closed_call and
core call.  The imported graph has no trace of the call and computes what JAX computes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import core as jcore_internal

from rockjit.frontend import import_jaxpr
from rockjit.ir.interpreter import run

from .helpers import assert_close, jaxpr_primitives, run_both

X = np.random.default_rng(0).uniform(-3, 3, (3, 5)).astype(np.float32)


def _scale(x):
    return x * 3.0 + 1.0


@jax.custom_jvp
def _softplus(x):
    return jnp.log(1.0 + jnp.exp(x))


_softplus.defjvp(lambda primals, tangents: (_softplus(primals[0]),
                                            tangents[0] * jax.nn.sigmoid(primals[0])))


@jax.custom_vjp
def _clip_grad_identity(x):
    return jnp.tanh(x) * 2.0


_clip_grad_identity.defvjp(lambda x: (_clip_grad_identity(x), None),
                           lambda _, g: (jnp.clip(g, -1.0, 1.0),))


CASES = {
    "nested_jit": (lambda x: jax.jit(lambda y: jax.jit(_scale)(y) - 2.0)(x), {"jit"}),
    "relu_custom_jvp": (jax.nn.relu, {"custom_jvp_call"}),
    "gelu_tanh": (jax.nn.gelu, set()),
    "gelu_exact_erfc": (lambda x: jax.nn.gelu(x, approximate=False), {"erfc"}),
    "silu_jit": (jax.nn.silu, {"jit"}),
    "softmax": (jax.nn.softmax, {"stop_gradient"}),
    "logsumexp": (jax.nn.logsumexp, {"is_finite"}),
    "user_custom_jvp": (_softplus, {"custom_jvp_call"}),
    "user_custom_vjp": (_clip_grad_identity, {"custom_vjp_call"}),
    "checkpoint": (jax.checkpoint(lambda x: jnp.sin(x) * jnp.cos(x)), {"remat2"}),
    "where_jit": (lambda x: jnp.where(x > 0, x, 0.1 * x), {"jit"}),
}
CALLS = {"jit", "pjit", "custom_jvp_call", "custom_vjp_call", "remat2", "closed_call", "call"}


@pytest.mark.parametrize("name", list(CASES))
def test_inlined_call_matches_jax(name: str) -> None:
    fn, expect = CASES[name]
    got, want, graph, closed = run_both(fn, X)
    assert expect <= jaxpr_primitives(closed), f"JAX no longer emits {expect} here"
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not {n.op.text for n in graph.nodes} & CALLS


def test_custom_jvp_gradient_rule_not_used_for_the_primal() -> None:
    # The vjp rule clips gradients; the primal is tanh(x) * 2, which is what must run.
    got, want, _, _ = run_both(_clip_grad_identity, X)
    np.testing.assert_allclose(got[0], np.tanh(X) * 2.0, rtol=1e-6)


def _replace_call(prim, make_params):
    """A jaxpr whose one equation calls _scale through ``prim`` (jax 0.10.2 offers no public
    way to emit closed_call or core call from user code, so the equation is rewritten)."""
    outer = jax.make_jaxpr(lambda x: jax.jit(_scale)(x))(X)
    (eqn,) = outer.jaxpr.eqns
    assert eqn.primitive.name == "jit"
    new = eqn.replace(primitive=prim, params=make_params(eqn.params["jaxpr"]))
    return jcore_internal.ClosedJaxpr(outer.jaxpr.replace(eqns=[new]), outer.consts)


@pytest.mark.parametrize("prim,make_params", [
    (jcore_internal.closed_call_p, lambda cj: {"call_jaxpr": cj}),
    (jcore_internal.call_p, lambda cj: {"call_jaxpr": cj.jaxpr}),
], ids=["closed_call", "core_call"])
def test_closed_call_and_core_call_are_inlined(prim, make_params) -> None:
    closed = _replace_call(prim, make_params)
    assert closed.jaxpr.eqns[0].primitive.name in ("closed_call", "call")
    graph = import_jaxpr(closed)
    (got,) = run(graph, [X], {})
    np.testing.assert_allclose(got, X * np.float32(3.0) + np.float32(1.0), rtol=1e-6)
    assert {n.op.text for n in graph.nodes} == {"constant", "broadcast_in_dim", "mul", "add"}


def test_shared_inner_jaxpr_inlined_twice() -> None:
    # jnp.var's jaxpr refers to one `_where` sub-jaxpr from two call sites in jax 0.10.2.
    fn = lambda x: (jnp.var(x, -1), jnp.var(x * 2.0, 0))  # noqa: E731
    got, want, _, _ = run_both(fn, X)
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_custom_rules_closing_over_traced_values_and_constants() -> None:
    # Closed-over values arrive as the leading `num_consts` operands of the call.
    def outer(x, y):
        @jax.custom_jvp
        def f(a):
            return a * y + np.arange(5, dtype=np.float32)

        f.defjvp(lambda p, t: (f(p[0]), t[0]))

        @jax.custom_vjp
        def g(a):
            return jnp.sin(a) * y

        g.defvjp(lambda a: (g(a), None), lambda _, ct: (ct,))
        return f(x) + g(x)

    y = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    got, want, _, closed = run_both(outer, X, y)
    num_consts = [e.params["num_consts"] for e in closed.jaxpr.eqns
                  if e.primitive.name in ("custom_jvp_call", "custom_vjp_call")]
    assert num_consts and all(n > 0 for n in num_consts)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
