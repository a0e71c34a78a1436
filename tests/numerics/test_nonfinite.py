"""Non-finite and out-of-range values on the NPU backends (rockjit/lowering/value_checks.py):
a call's float input holding NaN, Inf or |x| > 65504 is refused naming the argument; such a
resident weight is refused at compile time naming the weight; compile-time constants (a
mask's finfo.min) keep their saturation; the interpreter backend propagates NaN like JAX."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rockjit
from rockjit.errors import InputRangeError, WeightError


def _relu_mlp(params, x):
    return jax.nn.relu(x @ params["layers"][0]["w"]) @ params["head"]


def _params(rng) -> dict:
    return {"layers": [{"w": (rng.standard_normal((32, 48)) / 6).astype(np.float32)}],
            "head": (rng.standard_normal((48, 16)) / 7).astype(np.float32)}


@pytest.mark.parametrize("bad,what", [(np.nan, "NaN"), (np.inf, "infinite"),
                                      (-np.inf, "infinite"), (1e5, "beyond")])
def test_bad_input_is_refused_naming_the_argument(bad: float, what: str) -> None:
    rng = np.random.default_rng(0)
    p = _params(rng)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = rockjit.compile(lambda params, inp: _relu_mlp(params, inp["tokens"]),
                        resident_argnums=0, backend="sim")
    good = f(p, {"tokens": x})
    np.testing.assert_allclose(good, _relu_mlp(p, x), atol=0.05)
    x[3, 5] = bad
    with pytest.raises(InputRangeError) as e:
        f(p, {"tokens": x})
    msg = str(e.value)
    assert "argument 1 ('inp') at pytree path ['tokens']" in msg
    assert "[3, 5]" in msg and what in msg and "65504" in msg
    # the same compiled function still runs good inputs afterwards
    x[3, 5] = 0.5
    f(p, {"tokens": x})


def test_bfloat16_input_beyond_fp16_is_refused() -> None:
    f = rockjit.compile(lambda x: x * 2.0, backend="sim")
    x = jnp.ones((4, 32), jnp.bfloat16).at[1, 2].set(1e6)
    with pytest.raises(InputRangeError, match=r"argument 0 \('x'\).*\[1, 2\]"):
        f(x)


def test_fp16_largest_value_is_accepted() -> None:
    f = rockjit.compile(lambda x: x * 0.5, backend="sim")
    x = np.full((4, 32), 65504.0, np.float32)
    np.testing.assert_array_equal(f(x), 32752.0)


def test_integer_inputs_are_not_range_checked() -> None:
    f = rockjit.compile(lambda t, i: jnp.take(t, i, axis=0), backend="sim")
    t = np.arange(40 * 32, dtype=np.float32).reshape(40, 32) / 100
    i = np.array([0, 39, 7], np.int32)
    np.testing.assert_allclose(f(t, i), t[i], rtol=1e-3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -7e4])
@pytest.mark.parametrize("ahead", [True, False], ids=["lower_compile", "first_call"])
def test_bad_weight_is_refused_at_compile_time_naming_it(bad: float, ahead: bool) -> None:
    rng = np.random.default_rng(1)
    p = _params(rng)
    p["layers"][0]["w"][2, 7] = bad
    x = rng.standard_normal((8, 32)).astype(np.float32)
    f = rockjit.compile(_relu_mlp, resident_argnums=0, backend="sim")
    with pytest.raises(WeightError) as e:
        if ahead:
            f.lower(p, jax.ShapeDtypeStruct(x.shape, jnp.float32)).compile()
        else:
            f(p, x)
    msg = str(e.value)
    assert "argument 0 ('params') at pytree path ['layers'][0]['w']" in msg
    assert "'layers.0.w'" in msg and "[2, 7]" in msg and "65504" in msg


def test_mask_constant_beyond_fp16_keeps_its_saturation() -> None:
    """A compile-time constant (not a weight) beyond fp16 is still saturated: a softmax with
    an additive finfo.min mask runs and matches JAX."""
    x = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    bias = np.where(np.arange(32) < 20, 0.0, np.finfo(np.float32).min).astype(np.float32)

    def fn(x):
        return jax.nn.softmax(x + bias, axis=-1)
    got = rockjit.compile(fn, backend="sim")(x)
    np.testing.assert_allclose(got, fn(x), atol=2e-3)


def test_interpreter_backend_propagates_nan_like_jax() -> None:
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.nan
    fn = lambda x: jax.nn.relu(x) + 1.0  # noqa: E731
    got = rockjit.compile(fn, backend="interpreter")(x)
    want = np.asarray(fn(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1, 3])
