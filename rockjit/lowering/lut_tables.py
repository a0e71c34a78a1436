"""DPU LUT tables: geometry, contents and the error bound of each activation table.

The DPU LUT (notes: encodings/dpu-lut-activation.md) holds two 513-entry tables, LE and LO, of
unsigned Q0.15 values; the BN stage turns x into a table index (index = x * BN_MUL + BN_ALU,
MUL then ALU, BN_MUL an fp16 operand, BN_ALU an fp32 bias in the index domain), the table is
linearly interpolated between entries, and the affine OUT_CVT decodes the entry
(out = (q + OFFSET) * 2^-MINUS_EXP * SCALE). Both tables look the *index* up (after the BN ALU
bias) and DPU_LUT_CFG's NVDLA priorities choose: the table that hits; both underflowing ->
UFLOW_PRIORITY, both overflowing -> OFLOW_PRIORITY, otherwise HYBRID_PRIORITY (NVDLA cmod
lookup_lut; csrc/sim/lut.c). Silicon shows it: the shifted single-table programs (the function
in LO, LE flat and never read, a BN-ALU bias) compute exp over [-16, 0] correctly (seed 000,
notes "EXP"), which a choice by sign(x) could not. (This module once assumed the notes' "the mux
selects on sign(x)" and built its shifted tables around it, see ``shifted``.)

Two geometries, both with a non-negative OUT_CVT offset so no table needs the signed decode
that spikes near x = 0 (QUIRK 2, "Which kinds spike: signed-output only"):

* ``unit`` -- the hybrid of conformance 05 for functions with values in [0, 1] on a domain
  symmetric about 0 (sigmoid, the GELU gate Phi, tanh's (1 + tanh)/2 = sigmoid(2x)): LE covers
  inputs [-R, 0], LO [0, R], 512 segments each, index step 2^5 = 32, BN_MUL = fp16(16384 / R)
  (2596 for R = 6.31 in conformance 05), BN_ALU = -0.0, q = round(32768 f) and
  out = q * 2^-15.
* ``shifted`` -- for any positive function on [lo, hi] (exp, rsqrt, reciprocal): a BN-ALU bias
  (notes "BN-ALU bias works in the index domain") maps the whole domain onto the index range
  [-16384, 16384], LE holding its lower half and LO its upper half, 1024 segments: below
  -16384 both tables underflow and UFLOW_PRIORITY = 0 reads LE[0] (slope 0: the lower end is
  held), above 16384 both overflow and OFLOW_PRIORITY = 1 reads LO[512]. (Until issue 12 this
  form loaded one 512-segment table into both LE and LO, a workaround for the sign(x)
  misreading that wasted half the table; see ``build_shifted_table``.)
  q = round(f * 32768 / 2^S) with 2^S >= max f, decoded with MINUS_EXP = 15 - S (or, for
  S > 15, SCALE = 2^(S - 15)).

Every entry is floored to q >= 1 (QUIRK 4: a q = 0 entry decodes to ~4.0) and capped at 32767.
Inputs outside the table hold the end entry (both out-of-table slopes 0): the result is
f(clamp(x, lo, hi)). The index step keeps the table at 512 segments, never a 13-bit maximum.

Error bound (stated per table, ``LutTable.abs_error``): for linear interpolation of exact
samples on a grid of step h the error is at most h^2/8 * max|f''| on the cell; the quantised
entries add at most half a Q step (2^S / 65536) plus the floor/cap at the ends (up to one
step, or f - 2^(S-15) where the floor lifts a smaller value). ``build_*`` computes the bound of
the concrete table by evaluating the simulator-equivalent interpolation (exact index
arithmetic, quantised entries) on 64 points per segment and both segment ends, and adds 5 %
plus the index rounding of the fp32 BN stage (|f'| * |index| * 2^-24 / scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .emitters.eltwise import LutTables, OutCvt, SdpStage, fp16_bits, fp32_bits
from .regcmd import LoweringError

ENTRIES = 513              # per table on RK3588 [dpu-lut-activation "RK3588 uses 513 each"]
SEGMENTS = ENTRIES - 1
INDEX_SELECT = 5           # step 2^5 index units [conf 05 DPU_LUT_INFO 0x50500]
INDEX_SPAN = SEGMENTS << INDEX_SELECT   # 16384: LE_START / LO_END of conformance 05
Q_ONE = 1 << 15            # Q0.15
Q_MAX = Q_ONE - 1
Q_MIN = 1                  # QUIRK 4 floor

Fn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class LutTable:
    """A built table: program registers, the BN index stage, the output decode, the covered
    input domain [lo, hi] and the absolute error bound of one lookup (output units)."""

    name: str
    lut: LutTables
    bn: SdpStage
    out_cvt: OutCvt
    lo: float
    hi: float
    abs_error: float
    seg_error: tuple[float, ...] = ()   # the bound per input segment, [lo, hi] cut evenly

    def error_at(self, x: np.ndarray) -> np.ndarray:
        """The bound for inputs ``x`` (clamped to the domain): the largest of the bounds of
        the segment holding x and its two neighbours (index rounding may cross a boundary)."""
        e = np.asarray(self.seg_error, np.float64)
        n = e.size
        xc = np.clip(np.asarray(x, np.float64), self.lo, self.hi)
        seg = np.clip(np.floor((xc - self.lo) / (self.hi - self.lo) * n).astype(np.int64), 0, n - 1)
        pad = np.concatenate([[e[0]], e, [e[-1]]])
        return np.maximum(np.maximum(pad[seg], pad[seg + 1]), pad[seg + 2])

    def emulate(self, x: np.ndarray) -> np.ndarray:
        """The value the table produces for ``x`` (float64, before fp16 rounding)."""
        return _evaluate(self, np.asarray(x, np.float64))


def _quantise(y: np.ndarray, s_exp: int) -> np.ndarray:
    q = np.rint(np.asarray(y, np.float64) * (Q_ONE / 2.0 ** s_exp))
    return np.clip(q, Q_MIN, Q_MAX).astype(np.int64)


FP16_MAX = float(np.finfo(np.float16).max)   # 65504


def _largest_fp16_at_most(v: float) -> float:
    """The BN_MUL index scale is an fp16 operand: the largest fp16 <= ``v``. A ``v`` past
    fp16's range (a very narrow domain: index span / width > 65504, e.g. a calibrated
    near-constant input) saturates at 65504 on purpose: a smaller scale only widens the covered
    domain (to index span / 65504), which still contains the requested one."""
    if v >= FP16_MAX:
        return FP16_MAX
    h = np.float16(v)
    if float(h) > v:
        h = np.nextafter(h, np.float16(0))
    if not np.isfinite(h) or h <= 0:
        raise LoweringError(f"LUT index scale {v!r} is not representable as a positive fp16")
    return float(h)


def _decode_factor(cvt: OutCvt) -> float:
    return 2.0 ** -cvt.minus_exp * cvt.scale


def _lookup(idx: np.ndarray, tab, start: int, end: int, slope) -> tuple[np.ndarray, np.ndarray]:
    """One table's value and region (-1 under, 0 hit, +1 over) for index ``idx``."""
    e = np.asarray(tab, np.float64)
    nseg = e.size - 1
    pos = np.clip((idx - start) / (1 << INDEX_SELECT), 0, nseg)
    seg = np.minimum(np.floor(pos).astype(np.int64), nseg - 1)
    v = e[seg] + (e[seg + 1] - e[seg]) * (pos - seg)
    us, os_, ush, osh = slope
    v = np.where(idx <= start, e[0] + (idx - start) * us / 2.0 ** ush, v)
    v = np.where(idx >= end, e[-1] + (idx - end) * os_ / 2.0 ** osh, v)
    return v, np.where(idx <= start, -1, np.where(idx >= end, 1, 0))


def _evaluate(t: LutTable, x: np.ndarray) -> np.ndarray:
    """The simulator's lookup (csrc/sim/lut.c): fp32 BN stage, both tables looked up at the
    biased index, NVDLA's priorities choose, linear interpolation on the quantised entries."""
    scale = np.float32(float(np.float16(np.array(t.bn.mul, np.uint16).view(np.float16))))
    bias = np.array(t.bn.alu[1], np.uint32).view(np.float32) if t.bn.alu else np.float32(0)
    idx = (x.astype(np.float32) * scale + bias).astype(np.float64)
    vle, rle = _lookup(idx, t.lut.le, t.lut.le_start, t.lut.le_end, t.lut.le_slope)
    vlo, rlo = _lookup(idx, t.lut.lo, t.lut.lo_start, t.lut.lo_end, t.lut.lo_slope)
    cfg = t.lut.cfg
    use_lo = np.where((rle < 0) & (rlo < 0), cfg.get("LUT_UFLOW_PRIORITY", 0),
                      np.where((rle > 0) & (rlo > 0), cfg.get("LUT_OFLOW_PRIORITY", 0),
                               np.where((rle == 0) != (rlo == 0), rlo == 0,
                                        cfg.get("LUT_HYBRID_PRIORITY", 0)))).astype(bool)
    out = np.where(use_lo, vlo, vle)
    return (out + t.out_cvt.offset) * _decode_factor(t.out_cvt)


def _bound(t: LutTable, f: Fn, df: Fn | None, nseg: int) -> tuple[float, tuple[float, ...]]:
    """(global bound, bound per segment) of table ``t`` over [t.lo, t.hi] cut into ``nseg``
    segments, 64 samples per segment plus both ends."""
    per = 64
    x = np.linspace(t.lo, t.hi, nseg * per + 1)
    err = np.abs(_evaluate(t, x) - f(x))
    scale = float(np.float16(np.array(t.bn.mul, np.uint16).view(np.float16)))
    slope = np.abs(df(x)) if df is not None else np.zeros_like(x)
    # fp32 index rounding: one ulp of an index of at most 2*16384, mapped back to x
    err = err * 1.05 + slope * (2 * INDEX_SPAN) * 2.0 ** -24 / scale
    segs = np.maximum(err[:-1].reshape(nseg, per).max(axis=1), err[per::per])
    return float(segs.max()), tuple(float(v) for v in segs)


def build_unit_table(name: str, f: Fn, radius: float, df: Fn | None = None) -> LutTable:
    """The hybrid table of a function with values in [0, 1] over [-radius, radius].

    Bound: h^2/8 * max|f''| + 2^-16 (entry rounding) + the floor/cap error at the rails, with
    h = 32 / BN_MUL; computed for the concrete table (module docstring)."""
    if not radius > 0:
        raise LoweringError(f"{name}: LUT radius must be > 0, got {radius!r}")
    scale = _largest_fp16_at_most(INDEX_SPAN / radius)   # covers at least [-radius, radius]
    step = (1 << INDEX_SELECT) / scale
    i = np.arange(ENTRIES)
    le = _quantise(f(-(SEGMENTS - i) * step), 0)
    lo = _quantise(f(i * step), 0)
    lut = LutTables(le=tuple(int(v) for v in le), lo=tuple(int(v) for v in lo),
                     le_start=-INDEX_SPAN, le_end=0, lo_start=0, lo_end=INDEX_SPAN,
                     le_select=INDEX_SELECT, lo_select=INDEX_SELECT)
    # BN: index = x * scale + (-0.0) -- conformance 05's BN_ALU word 0x80000000
    bn = SdpStage(alu=(2, 0x80000000), mul=fp16_bits(scale))
    cvt = OutCvt(offset=0, scale=1, minus_exp=15, affine=True)
    r_eff = INDEX_SPAN / scale
    t = LutTable(name, lut, bn, cvt, -r_eff, r_eff, 0.0)
    return LutTable(name, lut, bn, cvt, -r_eff, r_eff, *_bound(t, f, df, 2 * SEGMENTS))


def build_shifted_table(name: str, f: Fn, lo: float, hi: float, df: Fn | None = None) -> LutTable:
    """A positive function over [lo, hi] on both tables: the BN stage maps [lo, hi] onto the index
    range [-16384, 16384] (BN_MUL = fp16(32768 / (hi - lo)), BN_ALU = -mid * BN_MUL with mid the
    domain centre), LE holds the lower half on [-16384, 0] and LO the upper half on [0, 16384]
    (LE[512] and LO[0] are the same sample), 1024 segments in all.

    Why both tables: the hardware chooses the table from the biased index by the NVDLA
    priorities (module docstring), so a biased index below 0 reads LE and one at or above 0
    reads LO, exactly as in conformance 05's unbiased hybrid. The earlier form loaded one
    512-segment table into both LE and LO because this module assumed a sign(x) choice that no
    bias could steer; using both halves halves the grid step, a quarter of the interpolation
    error. The join at index 0 is the hybrid's own (conformance 05, hardware-validated); the
    decode is unsigned, so QUIRK 2 does not apply. The biased two-table arrangement itself is
    not among the programs validated on silicon (inference from the two that are: the unbiased
    hybrid and the biased single table).

    Bound: h^2/8 * max|f''| + 2^S/65536 (entry rounding) + the floor at q = 1 where f falls
    under 2^(S-15), h = (hi - lo) / 1024; computed for the concrete table. For the steep
    functions the h^2 term dominates at the small end: reciprocal's relative error there is
    about h^2 / (4 lo^2), rsqrt's 3 h^2 / (32 lo^2) (notes: "uniform-grid accuracy is
    domain-bounded")."""
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise LoweringError(f"{name}: LUT domain [{lo!r}, {hi!r}] must be finite with hi > lo")
    scale = _largest_fp16_at_most(2 * INDEX_SPAN / (hi - lo))
    bias = np.float32(-(lo + hi) / 2 * scale)
    index = np.arange(-SEGMENTS, SEGMENTS + 1) * (1 << INDEX_SELECT)      # 1025 samples
    x = (index - float(bias)) / scale
    y = f(x)
    if not np.all(np.isfinite(y)) or np.any(y < 0):
        raise LoweringError(f"{name}: the function is not finite and non-negative over [{lo}, {hi}]; "
                            f"the shifted LUT holds unsigned values only")
    ymax = float(np.max(y))
    s_exp = max(math.ceil(math.log2(ymax)) if ymax > 0 else 0, -200)
    if s_exp > 16:
        raise LoweringError(f"{name}: values up to {ymax:g} over [{lo}, {hi}] exceed what an fp16 "
                            f"output can hold; narrow the domain")
    q = [int(v) for v in _quantise(y, s_exp)]
    cvt = OutCvt(offset=0, scale=1 << max(0, s_exp - 15), minus_exp=max(0, 15 - s_exp), affine=True)
    if cvt.minus_exp > 255:
        raise LoweringError(f"{name}: values over [{lo}, {hi}] are too small for the output decode")
    lut = LutTables(le=tuple(q[:ENTRIES]), lo=tuple(q[SEGMENTS:]), le_start=-INDEX_SPAN, le_end=0,
                     lo_start=0, lo_end=INDEX_SPAN, le_select=INDEX_SELECT, lo_select=INDEX_SELECT)
    bn = SdpStage(alu=(2, fp32_bits(float(bias))), mul=fp16_bits(scale))
    lo_eff = (-INDEX_SPAN - float(bias)) / scale
    hi_eff = (INDEX_SPAN - float(bias)) / scale
    t = LutTable(name, lut, bn, cvt, lo_eff, hi_eff, 0.0)
    return LutTable(name, lut, bn, cvt, lo_eff, hi_eff, *_bound(t, f, df, 2 * SEGMENTS))
