"""The LayerNorm statistics' pass 1 on x (range_rewrites.rewrite_square_sums): the host's bound
V of sum(c^2), c = fp16(x - m~), computed from x's own pass (r1 = sum(fp16(x 2^-s0)^2)) and
the mean's fp32 row sum, must be an upper bound of the sum the NPU really squares -- else a
row scaled by t = ROW_TARGET / sqrt(V) could overflow fp16 in pass 2.

The bound's formula runs here as the rewrite emits it (the same functions, evaluated in
float32 on numpy instead of building IR nodes); the NPU side is emulated independently with
numpy: fp16 inputs, fp16 products and differences, fp32 sums in two different orders, and the
exact reference in float64. Rows: |mean| >> std, huge outliers, tiny values and subnormals.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rockjit.ir.ops import Op
from rockjit.lowering import range_rewrites as rr
from rockjit.lowering.range_bounds import ROW_TARGET

F16, F32 = np.float16, np.float32
_NP = {Op.MUL: np.multiply, Op.ADD: np.add, Op.SUB: np.subtract, Op.MAX: np.maximum,
       Op.ABS: np.abs, Op.SQRT: np.sqrt}


class _NumpyHost:
    """rr._Host's interface evaluated in float32 (the host steps' precision)."""

    def op(self, op: Op, *xs):
        args = [F32(x) if isinstance(x, (int, float)) else np.asarray(x, F32) for x in xs]
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(_NP[op](*args), F32)


def _fp32_sums(a: np.ndarray) -> list[np.ndarray]:
    """Row sums in fp32, sequentially and pairwise (the NPU's order is not ours to assume)."""
    seq = np.zeros(a.shape[:-1], F32)
    for i in range(a.shape[-1]):
        seq = (seq + a[..., i].astype(F32)).astype(F32)
    return [seq, np.sum(a.astype(F32), axis=-1, dtype=F32)]


def _bound_and_exact(x: np.ndarray, s0: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the smallest bound V over the sum orders, the largest exact sum(c^2)."""
    h = x.shape[-1]
    x = x.astype(F16)
    hb = _NumpyHost()
    worst_v = np.full(x.shape[:-1], np.inf)
    exact = np.zeros(x.shape[:-1])
    for sx in _fp32_sums(x):
        x1 = (x.astype(F32) * F32(2.0 ** -s0)).astype(F16)
        q1 = (x1.astype(F32) * x1.astype(F32)).astype(F16)
        for r1 in _fp32_sums(q1):
            worst_v = np.minimum(worst_v, rr._centred_bound(hb, r1, sx, s0, h))
        m = (sx / F32(h)).astype(F32).astype(F16)[..., None]  # the fp16 mean the NPU subtracts
        for c in ((x.astype(np.float64) - m.astype(np.float64)).astype(F16),
                  (x.astype(F32) - m.astype(F32)).astype(F16)):
            exact = np.maximum(exact, np.sum(c.astype(np.float64) ** 2, axis=-1))
    return worst_v, exact


@st.composite
def _row(draw) -> np.ndarray:
    h = draw(st.sampled_from([2, 7, 64, 384, 768]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    kind = draw(st.sampled_from(["normal", "offset", "outlier", "tiny", "subnormal", "const"]))
    mean = draw(st.sampled_from([0.0, 1.0, -3.0, 100.0, 1000.0, -20000.0]))
    std = draw(st.sampled_from([1e-4, 1e-2, 1.0, 30.0, 600.0]))
    x = rng.standard_normal(h) * std + mean
    if kind == "offset":
        x = mean + rng.standard_normal(h) * abs(mean) * 2.0 ** -draw(st.integers(4, 14))
    elif kind == "outlier":
        x[rng.integers(h)] = draw(st.sampled_from([620.0, 3e4, -65000.0]))
    elif kind == "tiny":
        x = rng.standard_normal(h) * 1e-3
    elif kind == "subnormal":
        x = rng.standard_normal(h) * 2.0 ** -20
    elif kind == "const":
        x = np.full(h, mean)
    return np.clip(x, -60000.0, 60000.0)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(_row(), st.sampled_from([0, 3, 8]))
def test_host_bound_covers_the_centred_squares(x: np.ndarray, s0: int) -> None:
    if np.max(np.abs(x)) * 2.0 ** -s0 >= 255.0:
        s0 = rr._prescale_shift(float(np.max(np.abs(x))))   # as the rewrite picks it
    v, exact = _bound_and_exact(x[None, :], s0)
    assert np.all(np.isfinite(v)) and np.all(v > 0)
    assert np.all(v >= exact), (v, exact)


@pytest.mark.parametrize("log2_ratio", [-4, -8, -11, -13, -15])
def test_mean_dominated_rows_keep_their_variance(log2_ratio: int) -> None:
    """|mean| >> std makes V loose (~2^-9 H m^2) and t far below ideal: c t may square into
    fp16's subnormals. Pass 2 emulated with that t (fp16 squares, fp32 sum, / t^2) still gives
    sum(c^2) within 2^-9 relative, down to std = 2^-15 |mean| (below fp16's resolution of x)."""
    rng = np.random.default_rng(0)
    h = 768
    x = (1000.0 + rng.standard_normal((4, h)) * 1000.0 * 2.0 ** log2_ratio).astype(F16)
    v, exact = _bound_and_exact(x, 8)
    assert np.all(v >= exact)
    t = 2.0 ** np.floor(np.log2(ROW_TARGET / np.sqrt(v)))
    m = (np.sum(x.astype(F32), -1, dtype=F32) / F32(h)).astype(F16)[..., None]
    c = (x.astype(F32) - m.astype(F32)).astype(F16)
    c2 = (c.astype(F32) * t[..., None].astype(F32)).astype(F16)
    assert np.all(np.abs(c2.astype(np.float64)) <= ROW_TARGET)
    q2 = (c2.astype(F32) * c2.astype(F32)).astype(F16)
    var = np.sum(q2.astype(F32), -1, dtype=F32).astype(np.float64) / t ** 2
    ref = np.sum(c.astype(np.float64) ** 2, -1)
    assert np.all(np.abs(var - ref) <= 2.0 ** -9 * ref), (var, ref, t)


@pytest.mark.parametrize("mean", [0.0, 1000.0])
def test_layernorm_rows_on_the_simulator_match_numpy(mean: float) -> None:
    """Through the whole pipeline: the rewritten LayerNorm on the simulator against numpy on
    the same fp16 inputs (a row must not turn into the bias)."""
    import rockjit
    from models.layers import layer_norm

    rng = np.random.default_rng(3)
    w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    x = (rng.standard_normal((1, 8, 64)) + mean).astype(np.float16).astype(np.float32)
    out = np.asarray(rockjit.compile(lambda v: layer_norm(v, w, b, 1e-6), backend="sim")(x))
    xd = x.astype(np.float64)
    c = xd - xd.mean(-1, keepdims=True)
    ref = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6) * w + b
    # the NPU subtracts an fp16 mean: |m - m~| <= 2^-11 |m|, in normalised units / std
    tol = 0.02 + 2.0 ** -11 * mean * 1.5
    assert np.abs(out - ref).max() < tol, np.abs(out - ref).max()
