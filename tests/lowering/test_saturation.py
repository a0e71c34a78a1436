"""Which compile-time constants beyond fp16's range are saturated to -2^15 (fp16_range.mask_path):
only a softmax's mask term. Anywhere else the constant keeps its value, and the results match
JAX on CPU."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from graphs_testutil import check_bound, run_sim
from models import layers as L
from rockjit.lowering import fp16_range
from rockjit.lowering.fold import fold_consts

F32_MIN = float(np.finfo(np.float32).min)


def _x(seed: int = 0, scale: float = 500.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((4, 64)) * scale).astype(np.float32)


@pytest.mark.parametrize("fn", [lambda x: x / 1e5 + 1.0, lambda x: (x * 3.0) / 1e5,
                                lambda x: jnp.minimum(x, 1e5) * 1e-5],
                         ids=["div", "mul-div", "min"])
def test_constant_past_fp16_outside_a_mask_keeps_its_value(fn) -> None:
    # 1e5 read as 2^15 made x / 1e5 three times too large (and 3 % off after the + 1)
    got, ref, bound, _, _ = run_sim(fn, None, _x())
    check_bound(got, ref, bound, "x with a constant past fp16")


def test_mask_term_returned_is_not_saturated() -> None:
    def fn(keep):
        return L.mask_bias(keep > 0)
    keep = np.array([[1, 0, 1, 0]], np.float32)
    f = rockjit.compile(fn, backend="sim")
    got = np.asarray(f(keep))
    np.testing.assert_array_equal(got, np.asarray(fn(keep)))
    assert got.min() == F32_MIN


def _saturated(fn, *xs) -> dict[int, bool]:
    """value id -> saturated, for every folded constant of fn's graph that fp16 cannot hold."""
    f = rockjit.compile(fn, backend="interpreter")
    c = f.compiled(*xs)
    consts = fold_consts(c.graph, c.params)
    sat = fp16_range.saturate_consts(consts, c.graph)
    return {k: sat[k] is not v for k, v in consts.items() if fp16_range.needs_saturation(v)}


def test_mask_path_accepts_a_softmax_mask_only() -> None:
    s = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    keep = np.array([[1] * 6 + [0] * 2, [1] * 8], np.float32)

    def masked_softmax(s, keep):
        import jax
        return jax.nn.softmax(s + L.mask_bias(keep > 0), axis=-1)

    def positive(s, keep):
        return jnp.exp(s + jnp.where(keep > 0, 0.0, jnp.inf))

    def mask_then_scale(s, keep):
        import jax
        return jax.nn.softmax((s + L.mask_bias(keep > 0)) * 0.5, axis=-1)

    def scores_too(s, keep):
        import jax
        y = s + L.mask_bias(keep > 0)
        return jax.nn.softmax(y, axis=-1), y

    sat = _saturated(masked_softmax, s, keep)
    assert sat and all(sat.values())
    assert not any(_saturated(scores_too, s, keep).values())     # the masked scores returned
    assert not any(_saturated(positive, s, keep).values())      # +inf is no mask term
    assert not any(_saturated(mask_then_scale, s, keep).values())  # a multiply is off the path
