"""int8 convolutions with on-chip requantization (TFLite-style per-tensor quantization).

    qc = rockjit.quant.QConv2d(w_int8, bias_int32, QuantParams(0.02, -3),   # input
                               QuantParams(2**-9, 0),                      # weights
                               QuantParams(0.05, 7), stride=(1, 1), padding=((1, 1), (1, 1)))
    y_int8 = qc(x_int8)                                       # NCHW int8 -> NCHW int8, on the sim

What it computes (TFLite's int8 conv, per-tensor scales and zero points):

    acc[o]  = sum over the valid taps of (x - x_zp) * (w - w_zp) + bias[o]          (int32)
    y[o]    = clamp(MultiplyByQuantizedMultiplier(acc, M_q31, shift) + y_zp, -128, 127)

with (M_q31, shift) = TFLite's QuantizeMultiplier(x_scale * w_scale / y_scale): frexp gives
M = q * 2^shift with q in [0.5, 1), M_q31 = round(q * 2^31) (half away from zero; 2^31 is
renormalised to 2^30 with shift + 1). MultiplyByQuantizedMultiplier is TFLite's *single
rounding* form (TFLITE_SINGLE_ROUNDING): floor((acc * M_q31 + 2^(30 - shift)) / 2^(31 - shift)),
one round-half-up of the exact product.

How the NPU gets there bit for bit (emitters/conv.ConvRequant, the Teflon program's datapath):
* the CNA pads with x_zp, so a padded tap contributes (x_zp - x_zp) = 0 like TFLite's skipped
  tap; the MAC gives sum(x * w) over all taps, CPEND adds -w_zp * sum(x) (DPU_BS_OW_OP), and
  the BS ALU adds a per-channel int32 vector bias - x_zp * sum(w - w_zp) + T (Mesa's fold).
  Together: acc + T.
* OUT_CVT multiplies by SCALE = M_q31 / 2^16 and shifts by SHIFT = 15 - shift, rounding half
  away from zero (CVT_ROUND = 1). That equals the single-rounding product only when M_q31 has
  16 trailing zero bits (OUT_CVT_SCALE is a signed 16-bit multiplier): other multipliers are
  refused, and ``representable_output_scale`` gives the nearest output scale that works.
* Half away from zero and TFLite's half up differ on negative ties. T = t * 2^SHIFT, with t
  the smallest that makes acc + T >= 0 for every int8 input (a compile-time bound from the
  weights and bias), keeps the rounded value non-negative, where both rules agree; OUT_CVT's
  OFFSET = y_zp - t * SCALE takes the exact integer t * SCALE back out before the int8
  saturation (the offset is added after the rounding, saturation last: out-cvt-converter.md).

Refused, with what to do: per-channel scales (OUT_CVT has one shift: out-cvt-converter.md
"Per-channel (per-axis) requant -- multiplier yes, shift no"), multipliers >= 1, a multiplier
with more than 15 significant bits, TFLite's default *double rounding* form (SaturatingRounding-
DoublingHighMul then RoundingDivideByPOT: two roundings, which the one OUT_CVT rounding does not
reproduce), shapes whose input channels need a K split, inputs shorter than 4 rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import RockjitError
from .ir.types import DType

INT8_MIN, INT8_MAX = -128, 127
OUT_CVT_SCALE_BITS = 15          # signed 16-bit multiplier (csrc/sim/dpu.c parse_out_cvt)
INT32_MAX = 2**31 - 1


class QuantError(RockjitError, ValueError):
    """A quantized op that the int8 NPU path cannot compute bit for bit; the message says why
    and what to do."""


@dataclass(frozen=True)
class QuantParams:
    """Per-tensor affine quantization: real = scale * (q - zero_point), q int8."""

    scale: float
    zero_point: int = 0

    def __post_init__(self) -> None:
        s = self.scale
        if np.ndim(s) != 0:
            raise QuantError(
                f"QuantParams.scale must be one number (per-tensor); got an array of shape "
                f"{np.shape(s)}. Per-channel scales are not supported: the NPU's output "
                f"requant has one shift for all channels (notes: out-cvt-converter.md), so "
                f"TFLite's per-axis requant cannot be reproduced; requantize per-tensor or "
                f"run the conv as int8 -> int32 and requantize on the host")
        if not (isinstance(s, (int, float, np.floating, np.integer)) and math.isfinite(s)
                and s > 0):
            raise QuantError(f"QuantParams.scale must be a finite positive number, got {s!r}")
        zp = self.zero_point
        if np.ndim(zp) != 0 or not isinstance(zp, (int, np.integer)) or isinstance(zp, bool):
            raise QuantError(f"QuantParams.zero_point must be one integer (per-tensor), got {zp!r}")
        if not INT8_MIN <= int(zp) <= INT8_MAX:
            raise QuantError(f"QuantParams.zero_point {zp} is outside int8 [-128, 127]")
        object.__setattr__(self, "scale", float(s))
        object.__setattr__(self, "zero_point", int(zp))


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: real = q31 * 2^(shift - 31), q31 in [2^30, 2^31)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q31 = int(math.floor(abs(q) * 2**31 + 0.5)) * (1 if q > 0 else -1)   # std::round
    if q31 == 2**31:
        q31 //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q31, shift


@dataclass(frozen=True)
class Requant:
    """The OUT_CVT numbers for one multiplier (see the module docstring)."""

    real: float
    q31: int
    shift: int               # TFLite's (<= 0 here)
    scale: int               # OUT_CVT_SCALE = q31 >> 16
    cvt_shift: int           # OUT_CVT_SHIFT = 15 - shift


def requant_for(x: QuantParams, w: QuantParams, y: QuantParams, rounding: str = "single") -> Requant:
    if rounding != "single":
        raise QuantError(
            f"rounding={rounding!r}: only TFLite's single-rounding MultiplyByQuantizedMultiplier "
            f"(TFLITE_SINGLE_ROUNDING) is computed on the NPU; the default double-rounding form "
            f"rounds twice, and the NPU's requant rounds once (OUT_CVT), so the two differ on "
            f"some accumulators. Use rounding='single'")
    real = x.scale * w.scale / y.scale
    q31, shift = quantize_multiplier(real)
    if q31 == 0:
        raise QuantError(f"the requant multiplier x_scale*w_scale/y_scale = {real!r} underflows "
                         f"TFLite's Q31 form (every output would be the zero point)")
    if shift > 0:
        raise QuantError(f"the requant multiplier x_scale*w_scale/y_scale = {real!r} is >= 1; "
                         f"the NPU path supports multipliers < 1 (raise the output scale)")
    low = 31 - OUT_CVT_SCALE_BITS - 1
    if q31 % (1 << (low + 1)):
        raise QuantError(
            f"the requant multiplier x_scale*w_scale/y_scale = {real!r} has TFLite Q31 form "
            f"{q31:#x} * 2^{shift - 31}: more than {OUT_CVT_SCALE_BITS} significant bits, but "
            f"OUT_CVT_SCALE is a signed 16-bit multiplier, so the NPU cannot reproduce it bit for "
            f"bit. Use an output scale of {representable_output_scale(x, w, y.scale)!r} "
            f"(rockjit.quant.representable_output_scale), or requantize on the host")
    return Requant(real, q31, shift, q31 >> 16, 15 - shift)


def representable_output_scale(x: QuantParams, w: QuantParams, y_scale: float) -> float:
    """The output scale nearest ``y_scale`` whose multiplier x_scale*w_scale/y_scale has a Q31
    form with at most 15 significant bits (so ``requant_for`` accepts it)."""
    real = x.scale * w.scale / y_scale
    q, e = math.frexp(real)
    m = round(q * 2**OUT_CVT_SCALE_BITS)
    for cand in (m, m - 1, m + 1):
        if not (2**(OUT_CVT_SCALE_BITS - 1) <= cand < 2**OUT_CVT_SCALE_BITS):
            continue
        ys = x.scale * w.scale / math.ldexp(cand, e - OUT_CVT_SCALE_BITS)
        try:
            q31, _ = quantize_multiplier(x.scale * w.scale / ys)
        except OverflowError:
            continue
        if q31 % (1 << 16) == 0:
            return ys
    raise QuantError(f"no representable output scale found near {y_scale!r}")


def fold_vector(weights: np.ndarray, bias: np.ndarray, x: QuantParams, w: QuantParams,
                depthwise: bool) -> tuple[np.ndarray, int]:
    """The per-channel BS ALU vector without the range offset, bias - x_zp * sum(w - w_zp)
    (Mesa's fold), and a bound on |acc| over every int8 input."""
    wz = weights.astype(np.int64) - w.zero_point
    per = wz.reshape(wz.shape[0], -1)
    vec = bias.astype(np.int64) - x.zero_point * per.sum(axis=1)
    xmax = max(abs(INT8_MIN - x.zero_point), abs(INT8_MAX - x.zero_point))
    bound = int((xmax * np.abs(per).sum(axis=1) + np.abs(bias.astype(np.int64))).max())
    return vec, bound


class QConv2d:
    """An int8 conv2d (groups 1) or depthwise conv2d (groups == channels) with on-chip
    requantization to int8, compiled once for the given weights and quantization.

    ``weights`` int8 OIHW ([C, 1, KH, KW] for depthwise), ``bias`` int32 [O] (None: zeros),
    ``x``/``w``/``y`` QuantParams of input, weights and output; ``stride``, ``padding``
    ((top, bottom), (left, right)), ``groups``; ``backend`` "sim" (the C simulator) or a
    runtime device. Call with int8 NCHW input. ``max_rows`` / ``max_kernels`` cap the tile
    planner (tests: force row and output-channel tiles)."""

    def __init__(self, weights: np.ndarray, bias: np.ndarray | None, x: QuantParams,
                 w: QuantParams, y: QuantParams, *, input_hw: tuple[int, int], batch: int = 1,
                 stride: tuple[int, int] = (1, 1),
                 padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)),
                 groups: int = 1, rounding: str = "single", profile: str = "rk3588",
                 name: str = "qconv", max_rows: int | None = None,
                 max_kernels: int | None = None) -> None:
        from .lowering.emitters.conv import ConvRequant, ConvSpec, conv_layouts, build_qconv2d
        from .lowering.profile import get_profile
        from .lowering.regcmd import LoweringError

        for nm, qp in (("x", x), ("w", w), ("y", y)):
            if not isinstance(qp, QuantParams):
                raise QuantError(f"{nm} must be a rockjit.quant.QuantParams, got {type(qp).__name__}")
        wt = np.asarray(weights)
        if wt.dtype != np.int8 or wt.ndim != 4:
            raise QuantError(f"weights must be an int8 OIHW array, got {wt.dtype} {wt.shape}")
        oc = wt.shape[0]
        b = np.zeros(oc, np.int32) if bias is None else np.asarray(bias)
        if b.shape != (oc,) or b.dtype != np.int32:
            raise QuantError(f"bias must be int32 of shape ({oc},), got {b.dtype} {b.shape}")
        in_c = wt.shape[1] * groups
        if groups != 1 and not (groups == in_c == oc and wt.shape[1] == 1):
            raise QuantError(f"groups={groups}: only groups=1 (direct) and depthwise (groups == "
                             f"in == out channels, weights [C, 1, KH, KW]) map to the NPU")
        self.profile = get_profile(profile)
        rq = requant_for(x, w, y, rounding)
        spec = ConvSpec(batch, in_c, input_hw[0], input_hw[1], oc, wt.shape[2], wt.shape[3],
                        tuple(stride), tuple(tuple(p) for p in padding), (1, 1), groups)
        vec, bound = fold_vector(wt, b, x, w, spec.depthwise)
        # CPEND's window sum runs over every programmed channel, the cube's padding channels
        # included (tests/sim/README.md "Integer path"). The call packs those channels with the
        # input zero point, so at every tap, in the image or in the pad, they add x_zp each:
        # a constant -w_zp * x_zp * (padding channels) * KH * KW per output, folded here.
        # (Packed with 0 they would add only at pad taps, a border-dependent error.)
        lay = conv_layouts(spec, DType.I8, DType.I8, self.profile)
        self.pad_channels = 0 if spec.depthwise else lay.input.channels - in_c
        vec = vec + w.zero_point * x.zero_point * self.pad_channels * spec.kh * spec.kw
        unit = 1 << rq.cvt_shift
        t = -(-bound // unit)
        if bound + t * unit > INT32_MAX or (np.abs(vec) + t * unit).max() > INT32_MAX:
            raise QuantError(
                f"the accumulator bound {bound} plus the range offset {t * unit} overflows int32; "
                f"use smaller weights or fewer taps per output")
        offset = y.zero_point - t * rq.scale
        self.requant = rq
        self.requant_pad = x.zero_point
        self.range_offset = t * unit
        self.spec = spec
        cr = ConvRequant(pad_value=x.zero_point, ow_op=-w.zero_point, scale=rq.scale,
                         shift=rq.cvt_shift, offset=offset, round_away=True)
        try:
            self.lowering = build_qconv2d(spec, self.profile, wt, vec + t * unit, cr, name=name,
                                         max_rows=max_rows, max_kernels=max_kernels)
        except LoweringError as e:
            raise QuantError(str(e)) from None

    def __call__(self, x: np.ndarray, device: Any = None) -> np.ndarray:
        from .lowering.oprun import run_op_lowering

        s = self.spec
        x = np.asarray(x)
        want = (s.batch, s.in_c, s.height, s.width)
        if x.dtype != np.int8 or x.shape != want:
            raise QuantError(f"input must be int8 of shape {want} (NCHW), got {x.dtype} {x.shape}")
        xs, ys = self.lowering.buffer("x"), self.lowering.buffer("y")
        lx, ly = xs.layout, ys.layout
        sx, sy = xs.nbytes // s.batch, ys.nbytes // s.batch
        xb = np.zeros(xs.nbytes, np.uint8)
        for i in range(s.batch):
            xi = np.zeros((lx.height, lx.width, lx.channels), np.int8)
            if self.pad_channels:
                xi[:, :, s.in_c:] = self.requant_pad
            xi[:s.height, :, :s.in_c] = x[i].transpose(1, 2, 0)
            blob = lx.pack(xi)
            xb[i * sx:i * sx + blob.size] = blob
        run = run_op_lowering(self.lowering, {"x": xb}, device=device)
        out = np.empty((s.batch, s.out_c, s.out_h, s.out_w), np.int8)
        for i in range(s.batch):
            cube = ly.unpack(np.asarray(run["y"][i * sy:i * sy + ly.nbytes]))
            out[i] = cube[:s.out_h, :s.out_w, :s.out_c].transpose(2, 0, 1)
        return out
