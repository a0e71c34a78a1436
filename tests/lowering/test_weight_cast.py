"""The compile's float32 -> float16 cast of weights (weight_cast.py, through the C host library)
against numpy's cast, and the in-place weight packer (WeightLayout.pack_into) against a
per-element formula of the layout written out here."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rockjit.lowering.layouts import LayoutError, WeightLayout
from rockjit.lowering.weight_cast import cast_into, cast_to, to_float16
from rockjit.runtime.host_threads import set_host_threads

# float32 values at fp16's edges: the largest half, the first value that rounds to inf
# (65520), the ties just below it, the smallest normal and subnormal halves and the ties
# around them, and signed zeros
EDGES = np.array([65504.0, 65519.996, 65520.0, 65519.0, 65505.0, 2.0 ** -14, 2.0 ** -24,
                  2.0 ** -25, 2.0 ** -25 * 1.5, 2.0 ** -26, 3 * 2.0 ** -25, 1.0 + 2.0 ** -11,
                  1.0 + 3 * 2.0 ** -11, 0.0, -0.0, np.inf, -np.inf], np.float32)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    set_host_threads(request.param)
    yield request.param
    set_host_threads(None)


def _random_floats(n: int, seed: int) -> np.ndarray:
    """Every float32 bit pattern but NaN, equally likely, with the edge values mixed in."""
    rng = np.random.default_rng(seed)
    f = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f = np.where(np.isnan(f), np.float32(1.5), f)
    f[rng.integers(0, n, EDGES.size * 4)] = np.tile(np.concatenate([EDGES, -EDGES]), 2)
    return f


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_cast_gives_numpys_bits(threads) -> None:
    f = _random_floats(1 << 20, 0)
    assert np.array_equal(_bits(to_float16(f)), _bits(f.astype(np.float16)))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("view", ["transposed", "every-other", "broadcast", "sliced-3d"])
def test_cast_of_strided_views(view: str, threads) -> None:
    f = _random_floats(1 << 18, 1).reshape(512, 512)
    src = {"transposed": f.T, "every-other": f[::2, 1::2],
           "broadcast": np.broadcast_to(f[0], (64, 512)),
           "sliced-3d": f.reshape(64, 64, 64)[3:60, :, 5:]}[view]
    assert np.array_equal(_bits(to_float16(src)), _bits(src.astype(np.float16)))
    # into a strided destination: the other elements stay as they were
    dst = np.full(src.shape[:-1] + (2 * src.shape[-1],), -7.0, np.float16)
    cast_into(dst[..., ::2], src)
    assert np.array_equal(_bits(dst[..., ::2]), _bits(src.astype(np.float16)))
    assert (dst[..., 1::2] == -7.0).all()


def test_nan_stays_nan() -> None:
    f = np.full(1 << 16, np.nan, np.float32)
    f[::3] = -np.float32(np.nan)
    assert np.isnan(to_float16(f)).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_other_sources_and_small_arrays_are_numpys_cast(dtype) -> None:
    rng = np.random.default_rng(2)
    for n in (7, 1 << 16):
        a = (rng.standard_normal(n) * 1000).astype(dtype)
        assert np.array_equal(_bits(to_float16(a)), _bits(a.astype(np.float16)))
    a = rng.standard_normal((300, 70)).astype(np.float32)
    out = cast_to(a.T, np.float64)
    assert out.flags.c_contiguous and np.array_equal(out, a.T.astype(np.float64))


def test_cast_refuses_a_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"destination shape \(4, 4\) is not the source's"):
        cast_into(np.zeros((4, 4), np.float16), np.zeros((4, 5), np.float32))


def _packed_by_formula(lay: WeightLayout, w: np.ndarray) -> np.ndarray:
    """Element (n, c, y, x) at [n // NG][c // KG][y][x][n % NG][c % KG] of the padded
    kernels x channels, everything else zero (layouts.py's docstring, tile-layouts.md)."""
    kb = lay.padded_channels // lay.k_group
    out = np.zeros(lay.nbytes // lay.dtype.itemsize, lay.dtype)
    n, c, y, x = np.meshgrid(*[np.arange(d) for d in w.shape], indexing="ij")
    at = (((((n // lay.n_group) * kb + c // lay.k_group) * lay.kh + y) * lay.kw + x)
          * lay.n_group + n % lay.n_group) * lay.k_group + c % lay.k_group
    out[at.reshape(-1)] = w.reshape(-1)
    return out.view(np.uint8)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70), k=st.integers(1, 100), kh=st.integers(1, 3), kw=st.integers(1, 3),
       group=st.sampled_from([(16, 32), (32, 32), (8, 16)]), transposed=st.booleans(),
       short=st.tuples(st.integers(0, 20), st.integers(0, 40)), seed=st.integers(0, 2 ** 16))
def test_pack_into_matches_the_layout_formula(n, k, kh, kw, group, transposed, short,
                                              seed) -> None:
    """Whole and ragged groups, kernel taps, a transposed source, and a source smaller than
    the layout (a matmul's last tile past B's edge): the rest is zero, as padding."""
    lay = WeightLayout(n, k, kh, kw, group[0], group[1], np.float16)
    rng = np.random.default_rng(seed)
    rows, cols = max(0, n - short[0]), max(0, k - short[1])
    full = rng.standard_normal((k, n, kh, kw)).astype(np.float16)
    w = full.transpose(1, 0, 2, 3) if transposed else np.ascontiguousarray(
        full.transpose(1, 0, 2, 3))
    w = w[:rows, :cols]
    out = np.full(lay.nbytes, 0xAB, np.uint8)      # stale bytes: padding must be rewritten
    lay.pack_into(w, out)
    assert np.array_equal(out, _packed_by_formula(lay, w))
    if (rows, cols) == (n, k):
        assert np.array_equal(lay.pack(w), out)


def test_pack_into_refuses_what_does_not_fit() -> None:
    lay = WeightLayout(20, 40, 1, 1, 16, 32, np.float16)
    with pytest.raises(LayoutError, match=r"does not fit \(20, 40, 1, 1\)"):
        lay.pack_into(np.zeros((21, 40), np.float16), np.zeros(lay.nbytes, np.uint8))
    with pytest.raises(LayoutError, match=r"destination must be np.uint8\[4096\]"):
        lay.pack_into(np.zeros((20, 40), np.float16), np.zeros(100, np.uint8))
    with pytest.raises(LayoutError, match="expected float16 elements, got float32"):
        lay.pack_into(np.zeros((20, 40), np.float32), np.zeros(lay.nbytes, np.uint8))
