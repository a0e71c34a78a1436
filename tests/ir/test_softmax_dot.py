"""softmax(x) @ v -> (exp(x - max x) @ v) / sum(exp(x - max x)) (ir/passes/softmax_dot.py):
what it matches, what it must not, its values against JAX on the CPU, the range plan's bound
of the quotient, and the lowering writing e @ v in fp32 where it could pass fp16."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rockjit.frontend import import_jaxpr
from rockjit.ir.composites import expand
from rockjit.ir.interpreter import run
from rockjit.ir.ops import Op
from rockjit.ir.passes.fuse import fuse
from rockjit.ir.passes.softmax_dot import defer_softmax_division, is_deferred_product
from rockjit.ir.verifier import verify


def _graph(fn, *args):
    return fuse(import_jaxpr(jax.make_jaxpr(fn)(*args)))


def _attention(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def _qkv(rng, b=2, h=3, t=17, d=8):
    return [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(3)]


def test_attention_is_rewritten_and_keeps_its_value() -> None:
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng)
    v[..., 2] *= 500.0                       # a large value channel: the quotient stays exact
    g = _graph(_attention, q, k, v)
    assert g.op_counts().get("softmax") == 1
    r = defer_softmax_division(g)
    verify(r)
    ops = r.op_counts()
    assert "softmax" not in ops and ops.get("dot_general") == 2 and ops.get("div") == 1
    # the division is the graph's result: e @ v divided, the probabilities never formed
    prod, users = r.producers(), r.users()
    div = prod[r.outputs[0].id]
    assert div.op is Op.DIV and is_deferred_product(prod[div.inputs[0].id], prod, users)
    (got,) = run(expand(r), [q, k, v], {})
    want = np.asarray(jax.jit(_attention)(q, k, v))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("case", ["other_user", "other_axis", "lhs_is_v"])
def test_not_rewritten(case: str) -> None:
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, t=8, d=8)

    def other_user(q, k, v):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v), p          # the probabilities are an output

    def other_axis(q, k, v):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-2)   # over queries
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)

    def lhs_is_v(q, k, v):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhkd,bhqk->bhdq", v, p)             # the softmax is the rhs

    fn = {"other_user": other_user, "other_axis": other_axis, "lhs_is_v": lhs_is_v}[case]
    g = _graph(fn, q, k, v)
    assert defer_softmax_division(g) is g


def test_quotient_bound_is_the_value_bound() -> None:
    """The range plan bounds (e @ v) / sum(e) by v's bound (an average of v's entries), not by
    keys x |v| as the product itself; exp(x - max x) by 1 (this bound was lost before: the
    max-subtraction check was handed value-keyed lookups into an id-keyed map)."""
    from rockjit.lowering.fold import fold_consts
    from rockjit.lowering.fp16_range import saturate_consts
    from rockjit.lowering.range_bounds import compute_bounds

    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, b=1, h=2, t=64, d=8)
    r = expand(defer_softmax_division(_graph(_attention, q, k, v)))
    bounds = compute_bounds(r, saturate_consts(fold_consts(r, {}), r), input_bound=300.0)
    prod, users = r.producers(), r.users()
    div = prod[r.outputs[0].id]
    dot = prod[div.inputs[0].id]
    assert bounds[div.out.id] == 300.0
    assert bounds[dot.inputs[0].id] == 1.0       # exp(x - max x) <= 1
    assert bounds[dot.out.id] == 300.0 * 64      # 64 keys: the product itself may pass fp16
    assert is_deferred_product(dot, prod, users)


def test_product_past_fp16_runs_in_fp32_on_the_simulator() -> None:
    """A uniform attention row over 512 keys with values near 300: e @ v reaches ~150000, past
    fp16, while the result (~300) fits. The lowering writes the product in fp32 and divides
    on the host; the simulator's result matches JAX on the CPU within fp16 rounding."""
    import rockjit

    b, h, t, d = 1, 2, 512, 16
    q = np.zeros((b, h, t, d), np.float32)                      # every score 0: uniform rows
    rng = np.random.default_rng(3)
    k = rng.standard_normal((b, h, t, d)).astype(np.float32)
    v = (300.0 + rng.standard_normal((b, h, t, d))).astype(np.float32)
    f = rockjit.compile(_attention, backend="sim")
    got = np.asarray(f(q, k, v))
    want = np.asarray(jax.jit(_attention)(q, k, v))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=2e-3)
    assert f.stats()["range_fp32"] >= 2          # the row sum and the product


def test_row_sums_paired_with_other_rows_are_not_a_deferred_division() -> None:
    """Heads = queries = 4: the row sums transposed the wrong way still type-check, but pair
    head h's query i with head i's query h; no bound or fp32 write may rest on that."""
    from rockjit.ir.graph import Graph, Node, Value
    from rockjit.ir.passes.softmax_dot import deferred_division
    from rockjit.ir.types import TensorType

    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, b=1, h=4, t=4, d=8)
    r = defer_softmax_division(_graph(_attention, q, k, v))
    prod = r.producers()
    div = next(n for n in r.nodes if n.op is Op.DIV)
    assert deferred_division(div, prod) is not None
    bc = prod[div.inputs[1].id]
    s = bc.inputs[0]
    nid = max(v.id for n in r.nodes for v in n.outputs) + 1
    st = Value(nid, TensorType(s.type.dtype, s.type.shape))
    bt = Value(nid + 1, bc.out.type)
    nodes = [n for n in r.nodes if n is not div]
    nodes += [Node(Op.TRANSPOSE, (s,), (st,), {"permutation": (0, 2, 1)}),
              Node(Op.BROADCAST_IN_DIM, (st,), (bt,), dict(bc.attrs)),
              Node(Op.DIV, (div.inputs[0], bt), div.outputs)]
    bad = Graph(r.name, r.inputs, nodes, r.outputs)
    verify(bad)
    assert deferred_division(nodes[-1], bad.producers()) is None
