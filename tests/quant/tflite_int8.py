"""TFLite's int8 conv arithmetic in numpy, written from TFLite's reference kernels
(tensorflow/lite/kernels/internal/reference/integer_ops/conv.h, depthwise_conv.h and
common.h), independent of rockjit: int64 throughout, then the int8 clamp.

acc = sum over the in-bounds taps of (x - x_zp) * (w - w_zp) + bias (a tap outside the image
is skipped, not padded), out = clamp(MultiplyByQuantizedMultiplier(acc, q31, shift) + y_zp).
Both MultiplyByQuantizedMultiplier forms are here: the default double rounding
(SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT) and TFLITE_SINGLE_ROUNDING."""
from __future__ import annotations

import math

import numpy as np


def quantize_multiplier(real: float) -> tuple[int, int]:
    # QuantizeMultiplier (quantization_util.cc): frexp, TfLiteRound = std::round (half away)
    q, shift = math.frexp(real)
    q_fixed = int(math.copysign(math.floor(abs(q) * (1 << 31) + 0.5), q))
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift, q_fixed = 0, 0
    return q_fixed, shift


def srdhm(a: np.ndarray, b: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 a, scalar b."""
    ab = a.astype(object) * b
    out = np.empty(a.shape, np.int64)
    for i, v in enumerate(ab.flat):
        nudge = (1 << 30) if v >= 0 else (1 - (1 << 30))
        num = v + nudge
        q = abs(num) // (1 << 31)           # C++ division truncates toward zero
        out.flat[i] = q if num >= 0 else -q
    return out


def rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def mbqm_double(acc: np.ndarray, q31: int, shift: int) -> np.ndarray:
    left = max(shift, 0)
    right = max(-shift, 0)
    return rounding_divide_by_pot(srdhm(acc * (1 << left), q31), right)


def mbqm_single(acc: np.ndarray, q31: int, shift: int) -> np.ndarray:
    total = 31 - shift
    prod = acc.astype(object) * q31 + (1 << (total - 1))
    return np.array([v >> total for v in prod.flat], np.int64).reshape(acc.shape)


def accumulate(x, w, bias, x_zp, w_zp, stride, pad, depthwise):
    """x [N,C,H,W], w OIHW ([C,1,KH,KW] for depthwise): the int32 accumulators, taps outside
    the image skipped."""
    x = x.astype(np.int64) - x_zp
    w = w.astype(np.int64) - w_zp
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (pt, pb), (pl, pr) = pad
    oh = (h + pt + pb - kh) // stride[0] + 1
    ow = (wd + pl + pr - kw) // stride[1] + 1
    acc = np.zeros((n, o, oh, ow), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    iy, ix = oy * stride[0] - pt + ky, ox * stride[1] - pl + kx
                    if not (0 <= iy < h and 0 <= ix < wd):
                        continue
                    v = x[:, :, iy, ix]
                    if depthwise:
                        acc[:, :, oy, ox] += v * w[:, 0, ky, kx]
                    else:
                        acc[:, :, oy, ox] += v @ w[:, :, ky, kx].T
    return acc + bias.astype(np.int64)[None, :, None, None]


def conv_int8(x, w, bias, x_q, w_q, y_q, stride=(1, 1), pad=((0, 0), (0, 0)), depthwise=False,
              rounding="double"):
    """x_q etc.: (scale, zero_point)."""
    acc = accumulate(x, w, bias, x_q[1], w_q[1], stride, pad, depthwise)
    q31, shift = quantize_multiplier(x_q[0] * w_q[0] / y_q[0])
    f = mbqm_double if rounding == "double" else mbqm_single
    return np.clip(f(acc, q31, shift) + y_q[1], -128, 127).astype(np.int8)
