"""rockjit.quant.QConv2d on the simulator vs TFLite's int8 arithmetic in numpy (tflite_int8.py,
written from TFLite's reference kernels): bit for bit, direct and depthwise, strides 1/2,
padding, several channel counts, asymmetric zero points."""
from __future__ import annotations

import numpy as np
import pytest

import tflite_int8 as T
from rockjit.quant import (QConv2d, QuantError, QuantParams, representable_output_scale,
                           requant_for)

try:
    import rockjit._rjc  # noqa: F401
except ImportError:
    pytest.skip("the simulator (rockjit._rjc) is not built", allow_module_level=True)


CASES = [
    # id, C, O, H, W, K, stride, pad, depthwise, x_zp, w_zp, y_zp, batch
    ("direct-3x3-s1-p1", 32, 32, 6, 5, 3, (1, 1), ((1, 1), (1, 1)), False, 37, 25, -20, 1),
    ("direct-3x3-s2-p1-zw", 64, 32, 7, 6, 3, (2, 2), ((1, 1), (1, 1)), False, -2, -62, 5, 1),
    ("direct-1x1-c40-o48", 40, 48, 5, 4, 1, (1, 1), ((0, 0), (0, 0)), False, -128, 0, 127, 1),
    ("direct-3x3-c20-nopad", 20, 16, 6, 7, 3, (1, 1), ((0, 0), (0, 0)), False, 11, 3, 0, 2),
    # 20 channels in a 32-channel cube, weight zero point and padding: the padding channels
    # are packed with the input zero point and their CPEND share folded into the BS vector
    ("direct-3x3-c20-pad-zw", 20, 32, 6, 6, 3, (1, 1), ((1, 1), (1, 1)), False, 40, 7, -5, 1),
    ("direct-5x5-asym-pad-s2", 32, 40, 9, 8, 5, (2, 1), ((2, 1), (0, 2)), False, -50, 0, -7, 1),
    ("dw-3x3-s1-p1", 64, 64, 6, 5, 3, (1, 1), ((1, 1), (1, 1)), True, -100, 90, 3, 1),
    ("dw-3x3-s2-p1-c32", 32, 32, 8, 7, 3, (2, 2), ((1, 1), (1, 1)), True, 5, -1, -60, 1),
    ("dw-5x5-c100", 100, 100, 7, 6, 5, (1, 1), ((2, 2), (2, 2)), True, 0, 0, 10, 1),
]


def _run(C, O, H, W, K, stride, pad, dw, x_zp, w_zp, y_zp, batch, seed, **caps):
    rng = np.random.default_rng(seed)
    xq = QuantParams(0.02, x_zp)
    wq = QuantParams(0.004, w_zp)
    x = rng.integers(-128, 128, (batch, C, H, W)).astype(np.int8)
    ws = (C, 1, K, K) if dw else (O, C, K, K)
    w = rng.integers(max(-128, w_zp - 100), min(128, w_zp + 100), ws).astype(np.int8)
    b = rng.integers(-20000, 20000, O).astype(np.int32)
    # an output scale that spreads the accumulators over most of int8 (as calibration would)
    acc = T.accumulate(x, w, b, x_zp, w_zp, stride, pad, dw)
    yq = QuantParams(representable_output_scale(xq, wq, xq.scale * wq.scale * acc.std() / 40),
                     y_zp)
    qc = QConv2d(w, b, xq, wq, yq, input_hw=(H, W), batch=batch, stride=stride, padding=pad,
                 groups=C if dw else 1, **caps)
    got = qc(x)
    want = T.conv_int8(x, w, b, (xq.scale, x_zp), (wq.scale, w_zp), (yq.scale, y_zp), stride,
                       pad, dw, rounding="single")
    return got, want, (x, w, b, xq, wq, yq)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_qconv_matches_tflite_int8_bit_for_bit(case):
    _id, *args = case
    got, want, _ = _run(*args, seed=len(_id) * 7919)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # the data spreads over the int8 range (y_zp = 127 leaves only the lower half)
    assert len(np.unique(want)) > 60


def test_negative_ties_are_rounded_up_like_tflite():
    """A power-of-two multiplier makes exact ties common; half away from zero (OUT_CVT's rule
    without the range offset) would differ from TFLite's half up on every negative tie."""
    rng = np.random.default_rng(3)
    xq, wq = QuantParams(0.5, 0), QuantParams(2.0**-6, 0)
    yq = QuantParams(1.0, 0)            # multiplier 2^-7: acc / 128, ties at acc = 64 mod 128
    x = rng.integers(-128, 128, (1, 32, 6, 6)).astype(np.int8)
    w = rng.integers(-20, 20, (32, 32, 1, 1)).astype(np.int8)
    b = np.zeros(32, np.int32)
    got = QConv2d(w, b, xq, wq, yq, input_hw=(6, 6))(x)
    acc = T.accumulate(x, w, b, 0, 0, (1, 1), ((0, 0), (0, 0)), False)
    q31, shift = T.quantize_multiplier(2.0**-7)
    want = np.clip(T.mbqm_single(acc, q31, shift), -128, 127)
    away = np.clip(np.sign(acc) * ((np.abs(acc) + 64) // 128), -128, 127)
    assert (want != away).any(), "no negative tie in the data: the test could not fail"
    np.testing.assert_array_equal(got, want)


def test_double_rounding_differs_and_is_refused():
    """TFLite's default double rounding is a different function on some accumulators; the NPU
    path computes the single-rounding form only and says so."""
    acc = np.arange(-2**16, 2**16, dtype=np.int64)
    q31, shift = T.quantize_multiplier(21475 * 2.0**-27)
    assert (T.mbqm_double(acc, q31, shift) != T.mbqm_single(acc, q31, shift)).any()
    xq, wq, yq = QuantParams(0.02, 0), QuantParams(0.004, 0), QuantParams(0.5, 0)
    with pytest.raises(QuantError, match="single"):
        requant_for(xq, wq, QuantParams(representable_output_scale(xq, wq, 0.5)), "double")


def test_refusals_say_what_to_do():
    xq, wq = QuantParams(0.02, 0), QuantParams(0.004, 0)
    w = np.zeros((32, 32, 3, 3), np.int8)
    with pytest.raises(QuantError, match="representable_output_scale"):
        QConv2d(w, None, xq, wq, QuantParams(0.3), input_hw=(6, 6))     # 24-bit multiplier
    with pytest.raises(QuantError, match="Per-channel"):
        QuantParams(np.array([0.1, 0.2]), 0)
    with pytest.raises(QuantError, match=">= 1"):
        QConv2d(w, None, QuantParams(1.0), QuantParams(1.0), QuantParams(0.5), input_hw=(6, 6))
    ys = representable_output_scale(xq, wq, 0.3)
    with pytest.raises(QuantError, match="K steps"):
        QConv2d(np.zeros((32, 2048, 3, 3), np.int8), None, xq, wq, QuantParams(ys),
                input_hw=(8, 8))
    with pytest.raises(QuantError, match="zero rows"):
        QConv2d(w, None, xq, wq, QuantParams(ys), input_hw=(3, 6))


TILED = [
    # row tiles (each with its own top padding) and output-channel tiles (each reading its
    # slice of the BS vector)
    ("direct-row-and-kernel-tiles", 32, 96, 12, 9, 3, (1, 1), ((1, 1), (1, 1)), False, 9, -4, 2, 1,
     dict(max_rows=4, max_kernels=32)),
    ("dw-channel-and-row-tiles-s2", 192, 192, 11, 10, 3, (2, 2), ((1, 1), (1, 1)), True, -9, 17,
     -3, 1, dict(max_rows=5, max_kernels=64)),
]


@pytest.mark.parametrize("case", TILED, ids=[c[0] for c in TILED])
def test_tiled_qconv_matches_tflite_int8(case):
    _id, *args, caps = case
    got, want, _ = _run(*args, seed=len(_id) * 31, **caps)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 60
