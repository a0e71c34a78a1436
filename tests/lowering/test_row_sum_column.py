"""A deferred softmax's row sum from its value product's ones kernel (rules/row_sum.py): the
attention's ``reduce_sum`` pass over the exp values is gone from the program, and the result
on the strict simulator matches JAX on the CPU within tolerance.graph_bound (the row sum is
the same fp32 accumulation of the fp16 exp values as the feature reduce it replaces)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graphs_testutil import check_bound, run_sim


def _heads(h: int, dh: int):
    def attention(p, x, bias):
        t = x.shape[0]

        def split(y):
            return y.reshape(t, h, dh).transpose(1, 0, 2)

        q, k, v = (x @ p[f"w{n}"] + p[f"b{n}"] for n in "qkv")
        s = jnp.einsum("hqd,hkd->hqk", split(q), split(k)) * dh ** -0.5 + bias
        o = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), split(v))
        return o.transpose(1, 0, 2).reshape(t, h * dh)
    return attention


def _params(rng, d: int) -> dict:
    p = {f"w{n}": (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for n in "qkv"}
    p.update({f"b{n}": (rng.standard_normal(d) * 0.1).astype(np.float32) for n in "qkv"})
    return p


def _assert_row_sum_from_product(rep: str, heads: int = 1) -> None:
    """Every reduce_sum of the program is a ones column of a value product: no feature-reduce
    pass is left, and the product's matmul carries the ones kernel."""
    sums = [ln for ln in rep.splitlines() if "= reduce_sum" in ln]
    assert sums and all("ones column of %" in ln and " npu " in ln for ln in sums), rep
    assert "feature_reduce" not in rep, rep
    dots = [ln for ln in rep.splitlines() if "= dot_general" in ln and "ones kernel" in ln]
    assert len(dots) == len(sums), rep


@pytest.mark.parametrize("h,dh,t", [(2, 64, 40), (3, 33, 36)])
def test_multi_head(h: int, dh: int, t: int) -> None:
    """Heads as batch items; V packed from the projection's cube by the strided pack, which
    also writes the ones kernel. d = 64 (no padding kernels before the ones kernel) and an
    odd d = 33 (the ones kernel after the K atom's padding)."""
    rng = np.random.default_rng(40 + dh)
    x = rng.standard_normal((t, h * dh)).astype(np.float32)
    got, ref, bound, _, rep = run_sim(_heads(h, dh), _params(rng, h * dh), x,
                                      np.zeros((1, 1, t), np.float32))
    check_bound(got, ref, bound, f"attention h={h} d={dh}")
    _assert_row_sum_from_product(rep)


def test_single_head_value_is_a_graph_input() -> None:
    """V arrives row-major (a graph input): the pack_weight path, plus the ones kernel."""
    rng = np.random.default_rng(43)
    q, k, v = (rng.standard_normal((50, 64)).astype(np.float32) for _ in range(3))

    def attention(q, k, v):
        return jax.nn.softmax(q @ k.T * 0.125, axis=-1) @ v

    got, ref, bound, _, rep = run_sim(attention, None, q, k, v)
    check_bound(got, ref, bound, "single-head attention")
    _assert_row_sum_from_product(rep)


def test_value_is_a_resident_weight() -> None:
    """A compile-time value operand: the ones kernel is packed with it at compile time."""
    rng = np.random.default_rng(44)
    p = {"v": rng.standard_normal((40, 24)).astype(np.float32)}
    q, k = (rng.standard_normal((40, 16)).astype(np.float32) for _ in range(2))

    def attention(p, q, k):
        return jax.nn.softmax(q @ k.T * 0.25, axis=-1) @ p["v"]

    got, ref, bound, _, rep = run_sim(attention, p, q, k)
    check_bound(got, ref, bound, "attention over a resident value")
    _assert_row_sum_from_product(rep)


def test_masked_keys_and_a_fully_masked_row() -> None:
    """ModernBERT's additive mask (0 or finfo(f32).min, saturated to fp16's most negative
    value) over padded keys and one query row with no allowed key: masked keys add e = 0 to
    the ones column as to the feature reduce, and the fully masked row is JAX's uniform row."""
    h, dh, t = 2, 64, 48
    rng = np.random.default_rng(45)
    x = rng.standard_normal((t, h * dh)).astype(np.float32)
    allowed = (rng.random((t, t)) > 0.2).astype(np.int32)
    allowed[:, -5:] = 0                   # padding keys
    allowed[7, :] = 0                     # a query that may attend to nothing
    base = _heads(h, dh)

    def attention(p, x, allowed):
        bias = jnp.where(allowed != 0, 0.0, jnp.finfo(jnp.float32).min)[None]
        return base(p, x, bias)

    got, ref, bound, _, rep = run_sim(attention, _params(rng, h * dh), x, allowed)
    check_bound(got, ref, bound, "masked attention")
    _assert_row_sum_from_product(rep)


def test_not_taken_when_the_row_sum_has_another_user() -> None:
    """The column replaces the row sum only where the division is its only reader."""
    from rockjit.frontend import import_jaxpr
    from rockjit.ir.graph import Graph
    from rockjit.ir.ops import Op
    from rockjit.ir.passes.fuse import fuse
    from rockjit.ir.passes.softmax_dot import defer_softmax_division
    from rockjit.lowering.rules.row_sum import row_sum_columns

    def attention(q, k, v):
        return jax.nn.softmax(q @ k.T, axis=-1) @ v

    x = np.ones((8, 4), np.float32)
    g = defer_softmax_division(fuse(import_jaxpr(jax.make_jaxpr(attention)(x, x, x))))
    found = row_sum_columns(g)
    assert len(found) == 1
    s = next(iter(found.values()))
    assert g.producers()[s.id].op is Op.REDUCE_SUM
    extra = Graph(g.name, g.inputs, g.nodes, (*g.outputs, s))
    assert row_sum_columns(extra) == {}
