"""reduce_window_{max,sum,min} import: the IR interpreter against JAX on CPU (max/avg pools)."""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from rockjit import UnsupportedError
from rockjit.ir.ops import Op

from .helpers import assert_close, import_fn, jaxpr_primitives, run_both


def _x(shape: tuple[int, ...], seed: int, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(dtype)


def max_pool_3x3_s2(x: Any) -> Any:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "VALID")


def avg_pool_2x2_s2(x: Any) -> Any:
    return lax.reduce_window(x, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4.0


def max_pool_same(x: Any) -> Any:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")


def sum_pool_padded(x: Any) -> Any:
    return lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 2), (1, 1, 2, 1),
                             ((0, 0), (0, 0), (1, 2), (0, 1)))


def min_pool(x: Any) -> Any:
    return lax.reduce_window(x, jnp.inf, lax.min, (1, 1, 2, 2), (1, 1, 2, 2), "SAME")


CASES: list[tuple[Callable[..., Any], str, tuple[int, ...], Any]] = [
    (max_pool_3x3_s2, "reduce_window_max", (2, 3, 9, 8), np.float32),
    (avg_pool_2x2_s2, "reduce_window_sum", (1, 4, 8, 6), np.float32),
    (max_pool_same, "reduce_window_max", (1, 2, 5, 7), np.float32),
    (sum_pool_padded, "reduce_window_sum", (1, 2, 7, 5), np.float32),
    (min_pool, "reduce_window_min", (1, 3, 5, 5), np.float32),
    (max_pool_3x3_s2, "reduce_window_max", (1, 8, 11, 11), np.float16),
]


@pytest.mark.parametrize("fn,prim,shape,dtype", CASES,
                         ids=[f"{c[0].__name__}-{np.dtype(c[3]).name}" for c in CASES])
def test_reduce_window_matches_jax(fn: Callable[..., Any], prim: str, shape: tuple[int, ...],
                                   dtype: Any) -> None:
    x = _x(shape, 7, dtype)
    got, want, graph, closed = run_both(fn, x)
    assert prim in jaxpr_primitives(closed), f"JAX no longer emits {prim} for {fn.__name__}"
    assert any(n.op in (Op.REDUCE_WINDOW_MAX, Op.REDUCE_WINDOW_SUM) for n in graph.nodes)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    assert_close(got, want, rtol=tol, atol=tol)


def test_custom_window_computation_is_unsupported() -> None:
    def prod_pool(x: Any) -> Any:
        return lax.reduce_window(x, 1.0, lax.mul, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    with pytest.raises(UnsupportedError, match=r"reduce_window.*custom computation") as e:
        import_fn(prod_pool, _x((1, 1, 4, 4), 1))
    assert "test_reduce_window.py" in str(e.value)


def test_dilated_window_is_unsupported() -> None:
    def dilated(x: Any) -> Any:
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 1, 1), "VALID",
                                 window_dilation=(1, 1, 2, 2))

    with pytest.raises(UnsupportedError, match="window_dilation"):
        import_fn(dilated, _x((1, 1, 6, 6), 1))
