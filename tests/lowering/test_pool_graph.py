"""Pooling written in JAX (lax.reduce_window) compiled end to end for the simulator: the
windows over H, W of an N,C,H,W tensor run as PPU pools, and the results match JAX on CPU
within tolerance.graph_bound. Windows beyond the PPU's fields go to the host rule (unpadded)
or fail with an UnsupportedError naming the op and the user's line."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import rockjit
from graphs_testutil import assert_npu, check_bound, run_sim
from host_ops_testutil import make_node
from rockjit.ir.ops import Op
from rockjit.ir.reference import REFERENCE
from rockjit.ir.types import DType, TensorType
from rockjit.lowering.host_rules import lower_on_host
from rockjit.lowering.host_run import run_on_host
from rockjit.oracle.tolerance import _pool_recip_error


def conv_maxpool(p, x):
    y = lax.conv_general_dilated(x, p["w"], (1, 1), ((1, 1), (1, 1)))
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "VALID")


def avgpool(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4.0


def avgpool_3x3_padded(x):
    # count-include-pad average over a 3x3 window (a non-power-of-two reciprocal and divisor)
    return lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2),
                             ((0, 0), (0, 0), (1, 1), (1, 1))) / 9.0


def maxpool_same(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 1, 1), "SAME")


def _pool_on_npu(st: dict, rep: str, *ops: str) -> None:
    assert_npu(rep, *ops)
    assert st["npu_steps"] >= 1
    assert st["host_ops"] == 0, rep            # no IR op ran on the host


def test_conv_then_maxpool_3x3_s2() -> None:
    rng = np.random.default_rng(1)
    p = {"w": (rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)}
    x = rng.standard_normal((2, 8, 17, 17)).astype(np.float32)
    got, ref, bound, st, rep = run_sim(conv_maxpool, p, x)
    assert got.shape == (2, 16, 8, 8)
    check_bound(got, ref, bound, "conv -> max pool 3x3/2")
    _pool_on_npu(st, rep, "conv", "reduce_window_max")


@pytest.mark.parametrize("fn,shape", [(avgpool, (1, 16, 12, 10)), (avgpool, (2, 8, 8, 8)),
                                      (avgpool_3x3_padded, (1, 8, 9, 9)),
                                      (maxpool_same, (1, 8, 7, 9))],
                         ids=["avg2x2s2", "avg2x2s2-batch2", "avg3x3s2-pad1", "max3x3-same"])
def test_pools_match_jax(fn, shape) -> None:
    x = np.random.default_rng(2).uniform(-3, 3, shape).astype(np.float32)
    got, ref, bound, st, rep = run_sim(fn, None, x)
    check_bound(got, ref, bound, fn.__name__)
    op = "reduce_window_sum" if fn is not maxpool_same else "reduce_window_max"
    _pool_on_npu(st, rep, op)


def test_avg_bound_states_the_reciprocal_error() -> None:
    """3x3's reciprocals fp16(65536/3) are inexact, 2x2's are exact: the bound says so."""
    node3 = make_node(Op.REDUCE_WINDOW_SUM, [TensorType(DType.F32, (1, 1, 6, 6))],
                      {"window_dimensions": (1, 1, 3, 3), "window_strides": (1, 1, 3, 3),
                       "padding": ((0, 0),) * 4})
    node2 = make_node(Op.REDUCE_WINDOW_SUM, [TensorType(DType.F32, (1, 1, 6, 6))],
                      {"window_dimensions": (1, 1, 2, 2), "window_strides": (1, 1, 2, 2),
                       "padding": ((0, 0),) * 4})
    r3 = float(np.float16(65536 / 3)) ** 2 * 2.0 ** -32 * 9
    assert _pool_recip_error(node3) == pytest.approx(abs(r3 - 1), rel=1e-9)
    assert 0 < _pool_recip_error(node3) < 2.0 ** -10
    assert _pool_recip_error(node2) == 0.0


def test_window_beyond_the_ppu_runs_on_the_host() -> None:
    # a 17-wide window exceeds the PPU's 4-bit kernel field: an unpadded window is a host reduce
    def wide(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 17), (1, 1, 2, 1), "VALID")

    x = np.random.default_rng(3).standard_normal((1, 4, 6, 20)).astype(np.float32)
    f = rockjit.compile(wide, backend="sim")
    got = np.asarray(f(x))
    np.testing.assert_allclose(got, np.asarray(wide(x)), rtol=0, atol=0)
    rep = f.compiled(x)._runner.report()
    line = [ln for ln in rep.splitlines() if "= reduce_window_max" in ln]
    assert line and " host " in line[0], rep


def test_padded_window_beyond_the_ppu_is_a_clear_error() -> None:
    def padded(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 1, 1),
                                 ((0, 0), (0, 0), (8, 8), (0, 0)))

    x = np.ones((1, 2, 5, 5), np.float32)
    with pytest.raises(rockjit.UnsupportedError,
                       match=r"reduce_window_sum at .*test_pool_graph.py:\d+.*padding"):
        rockjit.compile(padded, backend="sim")(x)


@pytest.mark.parametrize("op", [Op.REDUCE_WINDOW_MAX, Op.REDUCE_WINDOW_SUM], ids=lambda o: o.text)
@pytest.mark.parametrize("dtype", [DType.F32, DType.I32], ids=lambda d: d.value)
def test_host_rule_matches_reference(op: Op, dtype: DType) -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(-50, 50, (2, 3, 7, 9)).astype(dtype.to_numpy())
    attrs = {"window_dimensions": (1, 2, 3, 4), "window_strides": (1, 1, 2, 3),
             "padding": ((0, 0),) * 4}
    node = make_node(op, [TensorType(dtype, x.shape)], attrs)
    (got,) = run_on_host(lower_on_host(node), [x])
    want = REFERENCE[op]([x], attrs, node.out.type)
    # a numpy reference of its own: the window reduction written as explicit loops
    loops = np.empty(node.out.type.shape, x.dtype)
    red = np.max if op is Op.REDUCE_WINDOW_MAX else np.sum
    for ix in np.ndindex(*loops.shape):
        sl = tuple(slice(i * s, i * s + w) for i, s, w in
                   zip(ix, attrs["window_strides"], attrs["window_dimensions"]))
        loops[ix] = red(x[sl])
    np.testing.assert_array_equal(want, loops)
    np.testing.assert_array_equal(got, loops)
