"""LUT activations on the DPU: sigmoid, tanh, exp, GELU, SiLU, Mish, softplus, rsqrt,
reciprocal of an fp16 cube.

What each kind means (its table function, form, post-step and domain rule) is its record in
ir/activations.py; this module builds the table and the tasks from it. Each activation is one
or two passes over the flat view of the cube (eltwise.py):

  sigmoid      one flying LUT pass, ``unit`` table of sigmoid
  exp          one flying LUT pass, ``shifted`` table
  exp_sq       softmax's exp (inputs <= 0 after the row max): a ``shifted`` table of exp(x/2),
               then its square on the DPU-only two-operand EW multiply. The table's entries are Q0.15
               (absolute step 2^-15, floor 2^-15: QUIRK 4), so a one-pass exp is exact only
               near the row maximum: a key with exp = 1e-3 carries 1.5 % error, and every key
               below e^-10.4 counts as 2^-15 -- over 1500 Whisper keys that alone adds ~3 % to
               the row sum. Squaring the half-exponent table gives an absolute error ~2^-15
               e^(x/2), i.e. relative 2^-15 / e^(x/2), and a floor of 2^-30.
  rsqrt        one flying LUT pass, ``shifted`` table, domain lo > 0
  reciprocal   one flying LUT pass, ``shifted`` table, domain lo > 0
  tanh         LUT pass of (1 + tanh x)/2 = sigmoid(2x) (unsigned decode: no QUIRK 2), then a
               flying affine pass 2g - 1 (BN: MUL 2, ALU -1)
  gelu_tanh    the same with the tanh-form gate sigmoid(2a(x + b x^3)) (jax.nn.gelu's default)
  gelu         LUT pass of Phi (the Gaussian CDF), then x * Phi(x) on the two-operand EW
               multiply -- the notes' accurate 2-pass GELU (dpu-lut-activation.md, "GELU -- the
               2-pass x*Phi(x) route"; single-pass GELU is unreliable, QUIRK 1)
  silu         LUT pass of sigmoid, then x * sigmoid(x) (same 2-pass form)
  mish         LUT pass of tanh(softplus(x)), then x * gate (same 2-pass form; seeds catalog:
               "Mish ... 2-pass (a [0,1] gate LUT + EW-mul)")
  softplus     one flying LUT pass, ``shifted`` table over an explicit domain (the compiler
               never asks: softplus has no domain from the function and runs on the host)

**The domain.** The caller passes ``x_range = (lo, hi)``, from the function alone
(lowering/calibrate.py: a saturating function's saturation radius, softmax's [-16, 0]). Symmetric tables cover [-R, R] with R = max(|lo|, |hi|); shifted tables
cover [lo, hi]. **Inputs outside the covered domain are clamped to it**: the result is
f(clamp(x)) for sigmoid/exp/rsqrt/reciprocal/tanh and x * gate(clamp(x)) for gelu/silu (which
is GELU/SiLU's own limit: gate -> 1 above, -> 0 below; the gate's smallest entry is the QUIRK 4
floor 2^-15, so far-negative x gives x * 2^-15 instead of 0). The covered domain is at least
the requested one (the index scale is rounded down to fp16).

Error: ``activation_error(kind, x, x_range)`` is the per-element absolute bound of the NPU
result against the exact function of the (fp16) input, *excluding* the final fp16 rounding,
which oracle/tolerance.lut_bound adds. It is built from the table's ``abs_error`` (lut_tables.py)
and the roundings of the intermediate fp16 gate.

Buffers: ``x`` (input 0), ``out`` (output 0), ``regcmd``; two-pass kinds add ``gate``
(scratch). The multiply pass is the DPU-only two-operand EW (eltwise.full_ew_tasks): no MACs.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..compile_cache import memoized
from ..layouts import CubeLayout
from ..op_lowering import BufferSpec, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, EmittedTask
from ...ir.activations import ACTIVATIONS, ActivationKind
from .. import lut_tables as LT
from ..fp16_range import U16
from .eltwise import (SdpStage, check_fp16_cube, emit_flying, flying_chunks, fp16_bits,
                      fp32_bits, full_ew_tasks, npu_program, part_bounds, resolve_profile)


def _radius(lo: float, hi: float) -> float:
    return max(abs(lo), abs(hi))


def _positive(kind: str, lo: float, hi: float) -> None:
    if not lo > 0:
        raise LoweringError(f"{kind}: the LUT domain must lie in x > 0 (got [{lo}, {hi}]); "
                            f"pass the calibrated positive range, e.g. (1e-2, 64), and add eps "
                            f"before the op if the data can reach 0")


@lru_cache(maxsize=64)
def _unit(kind: str, radius: float) -> LT.LutTable:
    act = ACTIVATIONS[kind]
    return LT.build_unit_table(kind, act.table, radius, act.table_derivative)


@lru_cache(maxsize=64)
def _shifted(kind: str, lo: float, hi: float) -> LT.LutTable:
    act = ACTIVATIONS[kind]
    if kind in _POSITIVE:
        _positive(kind, lo, hi)
    return LT.build_shifted_table(kind, act.table, lo, hi, act.table_derivative)


# the kinds whose table function is only defined for x > 0
_POSITIVE = frozenset({"rsqrt", "reciprocal"})


def _build(act: ActivationKind, lo: float, hi: float) -> LT.LutTable:
    if act.form == "unit":
        return _unit(act.name, _radius(lo, hi))
    return _shifted(act.name, lo, hi)


def _kind(kind: str) -> ActivationKind:
    try:
        return ACTIVATIONS[kind]
    except KeyError:
        raise LoweringError(f"no LUT activation {kind!r}; known: {', '.join(sorted(ACTIVATIONS))}") from None


def _range(act: ActivationKind, x_range: tuple[float, float] | None) -> tuple[float, float]:
    lo, hi = act.default_range if x_range is None else (float(x_range[0]), float(x_range[1]))
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise LoweringError(f"x_range {x_range!r} must be a finite (lo, hi) with hi > lo")
    return lo, hi


def activation_table(kind: str, x_range: tuple[float, float] | None = None) -> LT.LutTable:
    act = _kind(kind)
    return _build(act, *_range(act, x_range))


def activation_reference(kind: str, x: np.ndarray) -> np.ndarray:
    """The exact activation (float64) -- independent of the tables."""
    return _kind(kind).reference(np.asarray(x, np.float64))


def activation_error(kind: str, x: np.ndarray, x_range: tuple[float, float] | None = None) -> np.ndarray:
    """Per-element absolute error bound of the NPU activation of ``x`` against the exact
    function of the *clamped* input, before the final fp16 rounding (module docstring)."""
    act = _kind(kind)
    t = _build(act, *_range(act, x_range))
    x = np.asarray(x, np.float64)
    if act.post == "gate":
        g = t.emulate(x)
        # x * gate: the gate's table error and its fp16 rounding, scaled by |x|; the product
        # itself is exact in fp32 before the final rounding
        return np.abs(x) * (t.error_at(x) + U16 * np.abs(g) + 2.0 ** -24)
    if act.post == "square":
        g = t.emulate(x)
        e = t.error_at(x)
        # (g + e)(1 + d)^2 with d the fp16 rounding of g (<= U16): 2|g|e + e^2 + (2U16 + U16^2)
        # g^2; the product of two fp16 values is exact in fp32 before the final rounding
        return 2 * np.abs(g) * e + e * e + (2 * U16 + U16 * U16) * (np.abs(g) + e) ** 2
    if act.post == "affine":
        a = act.affine[0]
        # a * g + b: the table error and the fp16 rounding of g (g <= 1: half an ulp <= 2^-12)
        return abs(a) * (t.error_at(x) + 2.0 ** -12)
    return t.error_at(x)


def _lut_tasks(t: LT.LutTable, src: str, dst: str, nbytes: int, profile: ChipProfile,
               name: str, bounds: tuple[int, ...] = ()) -> list[EmittedTask]:
    return [emit_flying(f"{name}{i}", profile, Reloc(src, off), Reloc(dst, off), n, bn=t.bn,
                        lut=t.lut, out_cvt=t.out_cvt)
            for i, (off, n) in enumerate(flying_chunks(nbytes, profile, bounds))]


@memoized
def build_activation(kind: str, layout: CubeLayout, x_range: tuple[float, float] | None = None,
                     profile: ChipProfile | str | None = None, parts: int = 1) -> OpLowering:
    """out = kind(x) for an fp16 cube ``layout`` whose values lie in ``x_range`` (lo, hi);
    None takes the kind's default domain (``ACTIVATIONS[kind].default_range``). Inputs outside
    the domain are clamped to it (module docstring). ``parts`` > 1 offers that many jobs,
    each every pass over its own byte range (eltwise.part_bounds, npu_program)."""
    profile = resolve_profile(profile)
    act = _kind(kind)
    check_fp16_cube(layout, profile, f"activation {kind}")
    t = _build(act, *_range(act, x_range))
    bounds = part_bounds(layout.nbytes, profile, parts)
    if act.post in ("gate", "square"):
        # pass 1: g = table(x) over the EW span; pass 2: out = x * g for a gate (x * sigma(x),
        # x * Phi(x)), g * g for a squared half-table (exp_sq); each a DPU-only two-operand EW
        gate = act.post == "gate"
        lut_tag, mul_tag = ("gate", "mul") if gate else ("lut", "sq")
        lut_tasks = _lut_tasks(t, "x", "gate", layout.nbytes, profile, f"{kind}_{lut_tag}",
                               bounds)
        ew, span = full_ew_tasks("mul", "x" if gate else "gate", "gate", "out", layout.nbytes,
                                 profile, prefix=f"{kind}_{mul_tag}", bounds=bounds)
        bufs = [BufferSpec("x", "input", span, layout=layout, bind=0),
                BufferSpec("out", "output", span, layout=layout, bind=0),
                BufferSpec("gate", "scratch", span)]
        return npu_program(bufs, [lut_tasks, ew], profile, ("x",), ("out",), bounds=bounds)
    if act.post == "affine":
        a, b = act.affine
        lut_tasks = _lut_tasks(t, "x", "gate", layout.nbytes, profile, f"{kind}_lut", bounds)
        # BN multiplies then adds (dpu-lut-activation.md, "MUL then ALU"); a and b are exact
        # in fp16/fp32
        bn = SdpStage(alu=(2, fp32_bits(b)), mul=fp16_bits(a))
        aff = [emit_flying(f"{kind}_affine{i}", profile, Reloc("gate", off), Reloc("out", off), n, bn=bn)
               for i, (off, n) in enumerate(flying_chunks(layout.nbytes, profile, bounds))]
        bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
                BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0),
                BufferSpec("gate", "scratch", layout.nbytes)]
        return npu_program(bufs, [lut_tasks, aff], profile, ("x",), ("out",), bounds=bounds)
    tasks = _lut_tasks(t, "x", "out", layout.nbytes, profile, kind, bounds)
    bufs = [BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("out", "output", layout.nbytes, layout=layout, bind=0)]
    return npu_program(bufs, [tasks], profile, ("x",), ("out",), bounds=bounds)
