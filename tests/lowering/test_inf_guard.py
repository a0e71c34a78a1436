"""A max/min bound beyond fp16 must not clip an fp16 overflow back into range (inf_guard.py):
the overflow reaches the output check and the call raises, where it used to return the bound
as if it were the answer. Values that do fit, and float32 host values beyond fp16, still give
JAX's result."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.errors import NumericsError


def _run(fn, x: np.ndarray) -> np.ndarray:
    return np.asarray(rockjit.compile(fn, backend="sim")(x))


def _clip(x):
    return jnp.clip(x * 100.0, -1e5, 1e5)


@pytest.mark.parametrize("fn,value", [(_clip, 700.0), (_clip, -700.0),
                                      (lambda x: jnp.maximum(x * 100.0, -1e5), -700.0),
                                      (lambda x: jnp.minimum(x * 100.0, 1e5), 700.0)],
                         ids=["clip-high", "clip-low", "max", "min"])
def test_overflow_behind_a_bound_past_fp16_raises(fn, value) -> None:
    # x * 100 = +-7e4 overflows fp16 on the NPU; JAX gives +-7e4, the bound 1e5 must not hide it
    x = np.full((8, 64), value, np.float32)
    assert abs(float(np.asarray(fn(x))[0, 0])) == 7e4
    with pytest.raises(NumericsError, match="inf/NaN"):
        _run(fn, x)


def test_values_in_range_match_jax() -> None:
    x = np.random.default_rng(0).uniform(-600, 600, (8, 64)).astype(np.float32)
    np.testing.assert_allclose(_run(_clip, x), np.asarray(_clip(x)), rtol=2 ** -10)


def test_binding_bound_past_fp16_still_binds() -> None:
    # max(x, 1e5) is 1e5 for every finite fp16 x: that side keeps its constant
    x = np.random.default_rng(1).uniform(-6, 6, (8, 64)).astype(np.float32)
    fn = lambda x: jnp.maximum(x * 100.0, 1e5)  # noqa: E731
    np.testing.assert_array_equal(_run(fn, x), np.asarray(fn(x)))


def test_float32_host_value_keeps_its_bound() -> None:
    # x ** 3 runs on the host in float32: 2.16e5 is a real value there, and the clip applies
    fn = lambda x: jnp.clip(x ** 3, -1e5, 1e5)  # noqa: E731
    x = np.full((8, 64), 60.0, np.float32)
    x[0, :4] = [-60.0, 10.0, -10.0, 45.0]
    np.testing.assert_allclose(_run(fn, x), np.asarray(fn(x)), rtol=1e-6)
