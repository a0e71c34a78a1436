#!/usr/bin/env python3
"""Build the extra conformance cases under tests/sim/conformance_extra/ from public facts.

Each case has the layout of /work/shared/conformance (README there): ``case.md``, a standalone
numpy ``reference.py`` that turns the input blob into ``expected_output.bin`` from the maths of
the op (never from a simulator), and ``program/`` with ``buffers.json``, the regcmd words and the
blobs. The reference.py files are written by hand and committed; this script holds no copy of them
(it places and runs each one, and reads the int8 cases' constants from theirs). The int8 conv
cases' references share TFLite's arithmetic through conformance_extra/tflite_int8.py. One optional field is new: ``simulator_flags`` in buffers.json (``["faithful"]`` = the
case shows a documented hardware quirk and passes only on a simulator that reproduces it, i.e.
rj_sim with RJ_SIM_FAITHFUL; a strict simulator must refuse it. ``["lenient"]`` = documented
arithmetic on a geometry whose hardware validity is undocumented: it runs without strict mode,
and a strict simulator must refuse it as a hazard).

The programs are the standalone flying DPU LUT program of conformance 05 (rocket-userspace's
``gen_lut_activation_fp16``: the same register set and framing), with the register values and
table constructions that rocket-userspace's ``rocket_activation.c`` documents for its shifted
single-table kinds (``build_lut_shifted``, ``act_shifted_domain``; notes
encodings/dpu-lut-activation.md "Positive-domain kinds", "EXP", "More activation kinds").
Facts only: the words are built here through rockjit.lowering.registers.

    python tools/gen_conformance_extra.py            # (re)write every case
    python tools/gen_conformance_extra.py --check    # exit 1 if any file would change
"""
from __future__ import annotations

import argparse
import json
import math
import runpy
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rockjit.lowering.registers import OP_40, OP_ENABLE, emit, emit_raw, word  # noqa: E402

OUT_DIR = REPO / "tests" / "sim" / "conformance_extra"

# buffer placement of conformance 05 (a 4 KB guard first, as rocket-userspace allocates it)
GUARD, INPUT, OUTPUT, REGCMD = 0x01000000, 0x01002000, 0x01005000, 0x01008000
PAD = 4096          # rocket-userspace pads LUT BOs by one CBUF bank (CBUF_BANK)


def f16_bits(v: float) -> int:
    return int(np.array(v, np.float16).view(np.uint16))


def f32_bits(v: float) -> int:
    return int(np.array(v, np.float32).view(np.uint32))


@dataclass
class LutCase:
    name: str
    summary: str
    x: np.ndarray                 # fp16 inputs (a multiple of 8)
    le: np.ndarray                # 513 entries
    lo: np.ndarray
    bn_mul: float
    bn_alu_bits: int
    out_offset: int
    minus_exp: int
    tolerance: dict
    doc: str                      # case.md body
    flags: list[str] = field(default_factory=list)
    # None: conformance 05's geometry (LE [-16384, 0], LO [0, 16384], LUT_CFG 0x68, LE_END and
    # LO_START left unwritten at 0, slopes 0). Else a dict with lut_cfg, le/lo (start, end),
    # sel (le, lo), le_slope/lo_slope (uflow scale, uflow shift, oflow scale, oflow shift).
    geometry: dict | None = None


def lut_words(c: LutCase) -> list[int]:
    """The flying LUT task of conformance 05 with this case's values (n = len(x))."""
    n = c.x.size
    assert n % 8 == 0 and n // 8 - 1 < 8191
    w = [emit("DPU_S_POINTER", POINTER_PP_EN=1, EXECUTER_PP_EN=1, POINTER_PP_MODE=1),
         emit("DPU_RDMA_RDMA_S_POINTER", POINTER_PP_EN=1, EXECUTER_PP_EN=1, POINTER_PP_MODE=1),
         emit("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=0)]
    w += [emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(v)) for v in c.le]
    w.append(emit("DPU_LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=1))
    w += [emit("DPU_LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(v)) for v in c.lo]
    width = n // 8 - 1
    w += [
        emit("DPU_FEATURE_MODE_CFG", FLYING_MODE=1, OUTPUT_MODE=2, BURST_LEN=15),
        emit("DPU_DATA_FORMAT", PROC_PRECISION=2, IN_PRECISION=2, OUT_PRECISION=2),
        emit_raw("DPU_DST_BASE_ADDR", OUTPUT),
        emit("DPU_DST_SURF_STRIDE", DST_SURF_STRIDE=n // 8),
        emit("DPU_DATA_CUBE_WIDTH", WIDTH=width),
        emit("DPU_DATA_CUBE_HEIGHT"),
        emit("DPU_DATA_CUBE_CHANNEL", CHANNEL=7, ORIG_CHANNEL=7),
        emit("DPU_BS_CFG", BS_BYPASS=1, BS_ALU_BYPASS=1, BS_MUL_BYPASS=1, BS_RELU_BYPASS=1),
        emit("DPU_BS_OW_CFG", OD_BYPASS=1),
        emit("DPU_WDMA_SIZE_0", CHANNEL_WDMA=7),
        emit("DPU_WDMA_SIZE_1", WIDTH_WDMA=width),
        emit("DPU_BN_CFG", BN_RELU_BYPASS=1, BN_ALU_ALGO=2),
        emit_raw("DPU_BN_ALU_CFG", c.bn_alu_bits),
        emit("DPU_BN_MUL_CFG", BN_MUL_OPERAND=f16_bits(c.bn_mul)),
        emit("DPU_EW_CFG", EW_OP_CVT_BYPASS=1, EW_RELU_BYPASS=1),
        emit("DPU_EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1),
        emit_raw("DPU_OUT_CVT_OFFSET", c.out_offset & 0xFFFFFFFF),
        emit("DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1, FP32TOFP16_EN=1),
        emit("DPU_OUT_CVT_SHIFT", MINUS_EXP=c.minus_exp, CVT_TYPE=1),
        emit("DPU_SURFACE_ADD", SURF_ADD=n // 8),
        emit_raw("DPU_UNDOC_40C4", 0),
    ] + (_default_geometry() if c.geometry is None else _explicit_geometry(c.geometry)) + [
        emit("DPU_RDMA_RDMA_DATA_CUBE_WIDTH", WIDTH=width),
        emit("DPU_RDMA_RDMA_DATA_CUBE_HEIGHT"),
        emit("DPU_RDMA_RDMA_DATA_CUBE_CHANNEL", CHANNEL=7),
        emit_raw("DPU_RDMA_RDMA_SRC_BASE_ADDR", INPUT),
        emit("DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DISABLE=1),
        emit("DPU_RDMA_RDMA_FEATURE_MODE_CFG", FLYING_MODE=1, MRDMA_FP16TOFP32_EN=1,
             PROC_PRECISION=2, BURST_LEN=15, IN_PRECISION=2),
        emit("DPU_RDMA_RDMA_WEIGHT", M_WEIGHT=1, B_WEIGHT=1, N_WEIGHT=1, E_WEIGHT=1),
    ]
    # trailer: OP_NONE, PC_REGISTER_AMOUNTS, OP_40, OP_ENABLE (conformance README)
    w += [0, emit("PC_REGISTER_AMOUNTS"), word(OP_40, 0, 0), word(OP_ENABLE, 0x18, 0x0008)]
    return w


def _default_geometry() -> list[int]:
    return [
        emit("DPU_LUT_CFG", LUT_LO_LE_MUX=2, LUT_OFLOW_PRIORITY=1, LUT_HYBRID_PRIORITY=1),
        emit("DPU_LUT_INFO", LUT_LE_INDEX_SELECT=5, LUT_LO_INDEX_SELECT=5),
        emit_raw("DPU_LUT_LE_START", (-16384) & 0xFFFFFFFF),
        emit_raw("DPU_LUT_LO_END", 16384),
        # shifted tables: every out-of-table slope 0 (rocket_lut_epilogue_build zero-fills them)
        emit("DPU_LUT_LE_SLOPE_SCALE"), emit("DPU_LUT_LE_SLOPE_SHIFT"),
        emit("DPU_LUT_LO_SLOPE_SCALE"), emit("DPU_LUT_LO_SLOPE_SHIFT"),
    ]


def _slope_words(slope: tuple[int, int, int, int]) -> tuple[int, int]:
    """(uflow scale, uflow shift, oflow scale, oflow shift) -> the SLOPE_SCALE / SLOPE_SHIFT
    words: scales in the low / high halves, shifts in bits 0..4 / 5..9 (rk3588-registers.xml)."""
    us, ush, os_, osh = slope
    return ((os_ & 0xFFFF) << 16) | (us & 0xFFFF), (osh << 5) | ush


def _explicit_geometry(g: dict) -> list[int]:
    le_sc, le_sh = _slope_words(g["le_slope"])
    lo_sc, lo_sh = _slope_words(g["lo_slope"])
    return [
        emit_raw("DPU_LUT_CFG", g["lut_cfg"]),
        emit("DPU_LUT_INFO", LUT_LE_INDEX_SELECT=g["sel"][0], LUT_LO_INDEX_SELECT=g["sel"][1]),
        emit_raw("DPU_LUT_LE_START", g["le"][0] & 0xFFFFFFFF),
        emit_raw("DPU_LUT_LE_END", g["le"][1] & 0xFFFFFFFF),
        emit_raw("DPU_LUT_LO_START", g["lo"][0] & 0xFFFFFFFF),
        emit_raw("DPU_LUT_LO_END", g["lo"][1] & 0xFFFFFFFF),
        emit_raw("DPU_LUT_LE_SLOPE_SCALE", le_sc), emit_raw("DPU_LUT_LE_SLOPE_SHIFT", le_sh),
        emit_raw("DPU_LUT_LO_SLOPE_SCALE", lo_sc), emit_raw("DPU_LUT_LO_SLOPE_SHIFT", lo_sh),
    ]


# ---- table construction (rocket_activation.c build_lut_shifted, as facts) --------------------

def shifted(f, x_lo: float, x_hi: float, out_lo: float, s_exp: int, qfloor: int = 1):
    """LO = q((f - out_lo) / 2^S) on 513 samples of [x_lo, x_hi], LE flat at LO[0]; BN maps x to
    index (x - x_lo) * 16384 / (x_hi - x_lo) with the bias in the index domain."""
    S = 2.0 ** s_exp
    xs = x_lo + np.arange(513) * ((x_hi - x_lo) / 512.0)
    q = np.clip(np.rint((f(xs) - out_lo) / S * 32768.0), qfloor, 32767).astype(np.int64)
    scale = 16384.0 / (x_hi - x_lo)
    return dict(le=np.full(513, q[0]), lo=q, bn_mul=scale, bn_alu_bits=f32_bits(-x_lo * scale),
                out_offset=int(round(out_lo * 32768.0 / S)), minus_exp=int(round(15 - math.log2(S))))


def elu(x):
    x = np.asarray(x, np.float64)
    return np.where(x >= 0, x, np.expm1(np.minimum(x, 0)))


def pad8(x: np.ndarray) -> np.ndarray:
    n = -(-x.size // 8) * 8
    return np.concatenate([x, np.full(n - x.size, x[-1])]).astype(np.float16)


def cases() -> list[LutCase]:
    out = []

    # 10: exp over the softmax domain [-16, 0] (act_shifted_domain EXP: out_lo 0, S = 2^0)
    x = pad8(np.linspace(-17.0, 0.25, 1024))
    t = shifted(np.exp, -16.0, 0.0, 0.0, 0)
    out.append(LutCase(
        "10_lut_exp_shifted_fp16", "exp over [-16, 0] through the shifted single-table LUT", x, **t,
        tolerance={"kind": "abs", "atol": 1e-3},
        doc="exp(x) for 1024 fp16 inputs on [-17, 0.25] (outside [-16, 0] the table holds its end "
            "value: the reference clamps). Every input is negative or ~0, and the BN-ALU bias "
            "(fp32 16384 = -x_lo*scale, BN_MUL fp16(1024)) maps [-16, 0] onto index [0, 16384], the "
            "LO table; LE is flat at LO[0] and only read below the domain.\n\n"
            "Tolerance abs 1e-3: linear interpolation of exp on a 1/32 grid (h^2/8 max|f''| = 1.2e-4), "
            "entry rounding 2^-16, the q >= 1 floor (3e-5), fp16 output rounding (<= 2.4e-4 for "
            "values <= 1).\n\n"
            "What it pins: the LE/LO choice follows the biased index (NVDLA hybrid priorities), "
            "not sign(x). A simulator choosing by sign(x) reads the flat LE table for every x < 0 "
            "and fails by up to 1.0.\n\n"
            "Source of the program: rocket-userspace rocket_activation.c (build_lut_shifted, "
            "act_shifted_domain EXP, rocket_lut_epilogue_build) on the conformance-05 framing; "
            "hardware: seed 000 'EXP', notes dpu-lut-activation.md 'EXP' (max_abs 5.5e-4)."))

    # 11: ELU (alpha 1) on the symmetric shifted table [-8, 8], signed decode
    xe = np.linspace(-9.0, 9.0, 1024)
    xe = xe[np.abs(xe) > 0.01]            # the x~0 band is case 12's subject
    x = pad8(xe)
    t = shifted(elu, -8.0, 8.0, -1.0, 4)
    out.append(LutCase(
        "11_lut_elu_shifted_fp16", "ELU over [-8, 8] through the symmetric shifted single-table LUT",
        x, **t, tolerance={"kind": "abs", "atol": 5e-3},
        doc="ELU(x) = x >= 0 ? x : e^x - 1 for 1016 fp16 inputs on [-9, 9] away from 0 (|x| > 0.01). "
            "Table over [-8, 8] (BN_MUL fp16(1024), BN_ALU fp32(8192): x = 0 at the table middle), "
            "output range [-1, 15] decoded with OUT_CVT_OFFSET = -2048 and MINUS_EXP = 11 (S = 16).\n\n"
            "Tolerance abs 5e-3: interpolation (h^2/8 = 1.2e-4), entry rounding (16/65536 = 2.4e-4), "
            "fp16 rounding of outputs up to 8 (2^-8 = 3.9e-3 half an ulp at most 2e-3).\n\n"
            "What it pins: negative inputs read LO through the biased index; the signed decode. "
            "Source: rocket-userspace build_lut_shifted_elu (facts), notes 'More activation kinds'."))

    # 12: the same ELU program on a dense band around 0 -- QUIRK 2, reproduced (faithful)
    xq = np.arange(-2000, 2001) * 1e-6
    x = pad8(xq)
    out.append(LutCase(
        "12_lut_elu_quirk2_faithful", "ELU near x = 0 with a signed decode: the QUIRK 2 spike",
        x, **t, tolerance={"kind": "abs", "atol": 0.07},
        doc="Case 11's program on 4008 fp16 inputs in [-0.002, 0.002]. On silicon a signed output "
            "decode (OUT_CVT_OFFSET < 0) spikes at x ~ 0 (notes dpu-lut-activation.md QUIRK 2, "
            "'Affected kinds': ELU/SELU 97 of 4001 probe points on [-0.02, 0.02] step 1e-5, i.e. "
            "|x| <~ 4.85e-4 at BN_MUL 1024 = half an index unit; spike '+128', '~64-128').\n\n"
            "Expected: ELU(x) + 128 where |x * 1024| < 0.5, ELU(x) elsewhere. The band in index units "
            "and the exact +128 are inferences from those figures.\n\n"
            "simulator_flags [\"faithful\"]: a strict simulator must refuse the program (QUIRK 2); "
            "a faithful one reproduces the spike. Tolerance abs 0.07: half an fp16 ulp at 128 is "
            "0.0625.", flags=["faithful"]))

    # 13: exp with the q >= 1 floor off (ROCKET_LUT_QFLOOR=0) -- QUIRK 4, reproduced (faithful)
    lo_x, hi_x = -16.0, 0.0
    dx = (hi_x - lo_x) / 512
    xm = lo_x + (np.arange(512) + 0.5) * dx          # one input per table cell, mid-cell
    x = pad8(xm)
    t = shifted(np.exp, lo_x, hi_x, 0.0, 0, qfloor=0)
    out.append(LutCase(
        "13_lut_exp_quirk4_faithful", "exp with q = 0 table entries: the QUIRK 4 ~4.0 decode",
        x, **t, tolerance={"kind": "abs", "atol": 1e-3},
        doc="exp at the middle of each of the 512 cells of [-16, 0], table built without the q >= 1 "
            "floor (rocket-userspace ROCKET_LUT_QFLOOR=0 'reproduces the raw glitch'). On silicon "
            "the deep tail, where exp(x) < 1.5e-5 quantises to q = 0, reads ~4.0 (notes "
            "dpu-lut-activation.md QUIRK 4, seed 000 'EXP': correct to x ~ -10, ~4.0 for x <= -11).\n\n"
            "Expected: 4.0 where either entry of the input's cell is 0, exp(x) elsewhere. "
            "simulator_flags [\"faithful\"]: a strict simulator must refuse the program (QUIRK 4). "
            "Tolerance abs 1e-3 as case 10.", flags=["faithful"]))

    # 18: two overlapping tables with distinct contents and every LUT_CFG priority exercised
    out.append(_priority_case())
    return out


# 18's tables: two different smooth curves, every entry in [1000, 30000] (no zero entry: QUIRK 4;
# no flat run: QUIRK 1), closed forms that reference.py rebuilds on its own (the check of the program).
PRIO_GEOM = dict(lut_cfg=0x18, le=(-12288, 4096), lo=(-4096, 12288), sel=(5, 5),
                 le_slope=(3, 2, 5, 3), lo_slope=(7, 4, 9, 4))


def _priority_case() -> LutCase:
    k = np.arange(513)
    le = np.rint(2000 + 20 * k + 500 * np.sin(k / 13.0))
    lo = np.rint(28000 - 40 * k + 300 * np.cos(k / 7.0))
    assert le.min() >= 1000 and lo.min() >= 1000 and max(le.max(), lo.max()) <= 30000
    x = pad8(np.linspace(-16.0, 16.0, 2048))
    g = PRIO_GEOM
    return LutCase(
        "18_lut_hybrid_priorities", "Overlapping LE/LO tables: every LUT_CFG priority and each "
        "table's own out-of-range slopes", x, le=le, lo=lo, bn_mul=1024.0, bn_alu_bits=f32_bits(0.0),
        out_offset=0, minus_exp=10, tolerance={"kind": "abs", "atol": 0.016}, geometry=g,
        doc="2048 fp16 inputs on [-16, 16], index = x * 1024 (BN_MUL fp16(1024), BN_ALU 0). LE covers "
            "index [-12288, 4096], LO [-4096, 12288] (INDEX_SELECT 5: 512 steps of 32), so [-4096, 4096] "
            "is in both. Tables: LE[k] = rint(2000 + 20k + 500 sin(k/13)), LO[k] = rint(28000 - 40k + "
            "300 cos(k/7)); out-of-range slopes (scale, shift) LE uflow (3, 2), oflow (5, 3), LO uflow "
            "(7, 4), oflow (9, 4). LUT_CFG 0x18: LO_LE_MUX 2, UFLOW_PRIORITY 1 (LO), OFLOW_PRIORITY 0 "
            "(LE), HYBRID_PRIORITY 0 (LE). Output (CVT_TYPE 1, MINUS_EXP 10) = q / 1024.\n\n"
            "Regions: index <= -12288 both underflow -> LO extrapolates with its uflow slope; (-12288, "
            "-4096] only LE hits; (-4096, 4096) both hit -> LE; [4096, 12288) only LO hits; >= 12288 "
            "both overflow -> LE extrapolates with its oflow slope.\n\n"
            "Tolerance abs 0.016: one fp16 ulp at |out| < 32 (the simulator interpolates in fp32, the "
            "reference in float64; they may round to neighbouring fp16 values).\n\n"
            "What it pins: the NVDLA hybrid selection (nvdla/hw v1 cmod lookup_lut, the LUT_CFG field "
            "names of rk3588-registers.xml), each table's own slopes and the START/END edges. On "
            "RK3588 only LUT_CFG 0x68 with adjacent tables is hardware-validated (conformance 05, "
            "rocket-userspace); the other priority settings follow NVDLA by inference. A simulator "
            "choosing the table by sign(x) fails by up to 13.6 in the shared band; reading LUT_CFG as "
            "0x68, 0x08 or 0x78 instead fails by more than 20.")


# ---- an int8 requantizing conv (Mesa/Teflon's program, facts from depthwise-conv.md) ----------

CONF_DIR = next((p for p in (REPO.parent / "shared" / "conformance",
                             REPO.parent.parent / "shared" / "conformance") if p.is_dir()), None)
C_REGCMD, C_FEATURE, C_WEIGHT, C_BIAS, C_OUTPUT = 0x01000000, 0x01100000, 0x01400000, 0x01A00000, 0x01800000

def _requant_program(g, in_zp: int, out_zp: int, scale: int, shift: int, size_e: int) -> list[int]:
    """Mesa's int8-output requantizing conv (depthwise when g is): conformance 03's program
    retargeted to g, the CNA pad at the input zero point in every byte lane, CORE QD_EN, int8 out
    with CPEND on (OD_BYPASS 0) at element size ``size_e``, the bias BO at C_BIAS, OUT_CVT
    SCALE/SHIFT and the output zero point as its offset (notes depthwise-conv.md). The BS stage
    and BRDMA's operand use are each case's own."""
    from programs import retarget, set_fields, set_raw
    (_iova, tmpl), = _conf_jobs("03_matmul_int8")
    oh, ow = g.out_hw
    w = retarget(tmpl, g, C_FEATURE, C_WEIGHT, C_OUTPUT, in_zp & 0xFF)
    w = set_raw(w, "CNA_PAD_CON1", (in_zp & 0xFF) * 0x01010101)
    if g.depthwise:
        w = set_fields(w, "CNA_CONV_CON1", CONV_MODE=3)
        w = set_fields(w, "CORE_MISC_CFG", DW_EN=1, QD_EN=1)
    else:
        w = set_fields(w, "CORE_MISC_CFG", QD_EN=1)
    w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=0)
    w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=0, SIZE_E_0=size_e, SIZE_E_1=size_e, SIZE_E_2=size_e)
    w = set_fields(w, "DPU_SURFACE_ADD", SURF_ADD=oh * ow * (size_e + 1))
    w = set_raw(w, "DPU_RDMA_RDMA_BS_BASE_ADDR", C_BIAS)
    w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=scale)
    w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=shift)
    return set_raw(w, "DPU_OUT_CVT_OFFSET", out_zp & 0xFFFFFFFF)


def write_conv_case(root: Path) -> None:
    """14: int8 3x3 pad-1 conv with an asymmetric weight zero point, Mesa's requant program."""
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import (ConvGeometry, pack_feature, pack_weights_direct, set_fields,  # noqa: E402
                          set_raw)
    name = "14_int8_requant_cpend_conv"
    r = _reference_constants(name)
    g = ConvGeometry(C=r["C"], H=r["H"], W=r["W"], N=r["N"], KH=r["KH"], KW=r["KW"], pad=(r["PAD"],) * 2,
                     int8=True)
    in_zp, w_zp, out_zp, scale, shift = (r[k] for k in ("IN_ZP", "W_ZP", "OUT_ZP", "SCALE", "SHIFT"))
    rng = np.random.default_rng(14)
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int64)
    wt = rng.integers(w_zp - 100, 128, size=(g.N, g.C, g.KH, g.KW)).astype(np.int64)
    bias = rng.integers(-5000, 5000, size=g.N).astype(np.int64)
    a = bias - in_zp * (wt - w_zp).sum(axis=(1, 2, 3))          # Mesa's bias fold
    oh, ow = g.out_hw
    w = _requant_program(g, in_zp, out_zp, scale, shift, size_e=1)
    w = set_raw(w, "DPU_BS_OW_OP", (-w_zp) & 0xFFFF)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4))
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
    d = root / name
    (d / "program" / "blobs").mkdir(parents=True, exist_ok=True)
    words = np.asarray(w, dtype="<u8")
    (d / "program" / "j0_t000.regcmd").write_bytes(words.tobytes())
    feat = pack_feature(x.astype(np.int8), np.int8)
    wts = pack_weights_direct(wt.astype(np.int8), np.int8)
    out_bytes = g.N // 16 * oh * ow * 16
    (d / "program" / "blobs" / "feature.bin").write_bytes(feat + bytes(64))
    (d / "program" / "blobs" / "weight.bin").write_bytes(wts)
    (d / "program" / "blobs" / "bias.bin").write_bytes(a.astype("<i4").tobytes())
    (d / "program" / "blobs" / "output.initial.bin").write_bytes(bytes(out_bytes))
    (d / "bias_tflite.bin").write_bytes(bias.astype("<i4").tobytes())
    meta = {
        "format": "rk3588-regcmd-conformance-case/1", "case": name,
        "summary": "int8 3x3 conv, pad 1, asymmetric weight zero point, on-chip requant to int8",
        "generator": {"script": "tools/gen_conformance_extra.py",
                      "facts": "conformance 03 program (rocket-userspace) retargeted; Mesa's requant "
                               "fields per notes depthwise-conv.md, out-cvt-converter.md"},
        "simulator_flags": [],
        "buffers": [
            {"name": "regcmd", "iova": C_REGCMD, "size": 8 * len(words) + 64, "role": "regcmd", "file": None},
            {"name": "feature", "iova": C_FEATURE, "size": len(feat) + 64, "role": "input",
             "file": "blobs/feature.bin"},
            {"name": "weight", "iova": C_WEIGHT, "size": len(wts), "role": "weight", "file": "blobs/weight.bin"},
            {"name": "bias", "iova": C_BIAS, "size": 4 * g.N, "role": "weight", "file": "blobs/bias.bin"},
            {"name": "output", "iova": C_OUTPUT, "size": out_bytes, "role": "output",
             "file": "blobs/output.initial.bin"},
        ],
        "jobs": [{"index": 0, "tasks": [{"file": "j0_t000.regcmd", "regcmd_iova": C_REGCMD,
                                         "words": len(words), "enable_mask": "0x1d"}],
                  "in_buffers": ["feature", "weight", "bias", "regcmd"], "out_buffers": ["output"]}],
        "expected_output": {"file": "../expected_output.bin", "buffer": "output", "offset": 0,
                            "size": out_bytes, "dtype": "int8", "tolerance": {"kind": "exact"}},
    }
    (d / "program" / "buffers.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "case.md").write_text(
        f"# {name}\n\nint8 conv 32x6x5 -> 32x6x5, 3x3, stride 1, pad 1; input zero point {in_zp}, "
        f"weight zero point {w_zp}, output zero point {out_zp}, SCALE/SHIFT {scale}/{shift} (a Teflon "
        "capture's multiplier, 8x finer shift so few outputs saturate). The program is Mesa's requantizing int8-output writer (notes depthwise-conv.md "
        "\"The int8 domain\", \"DPU_BS_OW_OP is the CPEND operand\"): CNA pad = input zero point in every "
        "byte lane, CORE QD_EN 1, DPU int8 out, size_e 1, SURF_ADD OH*OW*2, OD_BYPASS 0 with OW_OP = -w_zp, "
        "a per-channel int32 bias through BRDMA folded as bias - in_zp*sum(w - w_zp), OUT_CVT offset = "
        "output zero point.\n\nLayouts: feature [C/16][H][W][16] int8; weights [N/32][C/32][KH][KW][32][32] "
        "int8; output [N/16][OH][OW][16] int8 (notes encodings/tile-layouts.md).\n\nExpected: TFLite's "
        "arithmetic (reference.py; bias_tflite.bin is the unfolded bias). Exact: the program equals it only "
        "if CPEND's window sum counts the padded taps at the pad value (-w_zp*in_zp per padded tap "
        "otherwise).\n")
    _place_reference(d)


def write_dw_case(root: Path) -> None:
    """19: Mesa's int8 depthwise requant program (CONV_MODE 3, DW_EN, size_e 3) with CPEND per channel."""
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import ConvGeometry, pack_feature, pack_weights_dw, set_fields, set_raw  # noqa: E402
    name = "19_int8_requant_cpend_depthwise"
    r = _reference_constants(name)
    g = ConvGeometry(C=r["C"], H=r["H"], W=r["W"], N=r["C"], KH=r["KH"], KW=r["KW"], pad=(r["PAD"],) * 2,
                     depthwise=True, int8=True)
    in_zp, w_zp, out_zp, scale, shift = (r[k] for k in ("IN_ZP", "W_ZP", "OUT_ZP", "SCALE", "SHIFT"))
    rng = np.random.default_rng(19)
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int64)
    wt = rng.integers(30, 128, size=(g.C, g.KH, g.KW)).astype(np.int64)
    bias = rng.integers(-5000, 5000, size=g.C).astype(np.int64)
    a = bias - in_zp * (wt - w_zp).sum(axis=(1, 2))          # Mesa's bias fold, per channel
    oh, ow = g.out_hw
    w = _requant_program(g, in_zp, out_zp, scale, shift, size_e=3)
    w = set_raw(w, "DPU_BS_OW_OP", (-w_zp) & 0xFFFF)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4))
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
    feat = pack_feature(x.astype(np.int8), np.int8)
    wts = pack_weights_dw(wt.astype(np.int8), np.int8)
    out_bytes = g.C // 16 * oh * ow * 16
    write_program_case(
        root, name, "int8 depthwise 3x3 conv, pad 1, weight zero point 90, on-chip requant to int8",
        f"64 channels 6x5 -> 6x5, 3x3, stride 1, pad 1; input zero point {in_zp}, weight zero point {w_zp}, "
        f"output zero point {out_zp}, SCALE/SHIFT {scale}/{shift} (the Teflon capture's multiplier, notes "
        "depthwise-conv.md). Mesa's int8 depthwise writer (notes depthwise-conv.md \"Mesa does int8 depthwise "
        "as int8-output with on-chip requant\"; Mesa rkt_regcmd.c): CNA CONV_MODE 3, CORE DW_EN 1 + QD_EN 1, "
        "DPU int8 out, size_e 3, SURF_ADD OH*OW*4, CNA pad = input zero point in every byte lane, OD_BYPASS 0 "
        "with OW_OP = -w_zp (CPEND adds -w_zp times each channel's own window sum), a per-channel int32 bias "
        "through BRDMA folded as bias - in_zp*sum(w - w_zp), OUT_CVT offset = output zero point.\n\n"
        "Layouts: feature [C/16][H][W][16] int8; weights [C/64][KH][KW][64] int8 (depthwise-conv.md, G = 64 "
        "for int8); output [C/16][OH][OW][16] int8.\n\nExpected: TFLite's arithmetic (reference.py; "
        "bias_tflite.bin is the unfolded bias), the shift rounded half to even (ties: inferred, see "
        "tests/sim/README.md \"Integer path\"). Exact: the program equals it only if CPEND sums each "
        "channel's own window, padded taps at the pad value.",
        w, [("feature", C_FEATURE, feat + bytes(64), "input"), ("weight", C_WEIGHT, wts, "weight"),
            ("bias", C_BIAS, a.astype("<i4").tobytes(), "weight"), ("output", C_OUTPUT, bytes(out_bytes), "output")],
        ("output", out_bytes, "int8", {"kind": "exact"}),
        extra_files={"bias_tflite.bin": bias.astype("<i4").tobytes()})


def write_perchannel_case(root: Path) -> None:
    """21: the per-channel requant depthwise program (BRDMA DATA_USE 7, BS_MUL_SRC, OW_SRC)."""
    import io
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import ConvGeometry, pack_feature, pack_weights_dw, set_fields, set_raw  # noqa: E402
    name = "21_int8_perchannel_requant_depthwise"
    r = _reference_constants(name)
    g = ConvGeometry(C=r["C"], H=r["H"], W=r["W"], N=r["C"], KH=r["KH"], KW=r["KW"], pad=(r["PAD"],) * 2,
                     depthwise=True, int8=True)
    in_zp, out_zp, s_pos, s_neg, scale, shift = (r[k] for k in ("IN_ZP", "OUT_ZP", "S_POS", "S_NEG", "SCALE",
                                                                 "SHIFT"))
    rng = np.random.default_rng(21)
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int64)
    w_zp = rng.integers(-40, 40, size=g.C)
    wt = np.clip(w_zp[:, None, None] + rng.integers(-90, 90, size=(g.C, g.KH, g.KW)), -128, 127).astype(np.int64)
    bias = rng.integers(-4000, 4000, size=g.C)
    mult = rng.integers(2048, 32768, size=g.C)
    a = bias - in_zp * (wt - w_zp[:, None, None]).sum(axis=(1, 2))      # Mesa's fold, per channel
    grp = np.zeros((g.C // 8, 64), np.uint8)
    grp[:, 0:32] = a.astype("<i4").reshape(-1, 8).view(np.uint8).reshape(-1, 32)
    grp[:, 32:48] = (-w_zp).astype("<i2").reshape(-1, 8).view(np.uint8).reshape(-1, 16)
    grp[:, 48:64] = mult.astype("<i2").reshape(-1, 8).view(np.uint8).reshape(-1, 16)
    oh, ow = g.out_hw
    w = _requant_program(g, in_zp, out_zp, scale, shift, size_e=3)
    w = set_fields(w, "DPU_DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=s_neg)
    w = set_fields(w, "DPU_BS_OW_CFG", OW_SRC=1)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6))          # 0x20140
    w = set_raw(w, "DPU_BS_MUL_CFG", (s_pos << 8) | 1)
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=7)
    buf = io.BytesIO()
    np.savez(buf, w_zp=w_zp.astype("<i4"), bias=bias.astype("<i4"), mult=mult.astype("<i4"))
    out_bytes = g.C // 16 * oh * ow * 16
    write_program_case(
        root, name, "int8 depthwise 3x3 conv with per-channel weight zero points and per-channel "
        "multipliers through BRDMA's 64-byte group (BRDMA_DATA_USE 7)",
        f"64 channels 6x5 -> 6x5, 3x3, pad 1; input zero point {in_zp}, a weight zero point per channel, output "
        f"zero point {out_zp}. Case 19's program with the per-channel BS epilogue of notes encodings/"
        "out-cvt-converter.md \"Per-channel (per-axis) requant on the BS multiplier\" (HW sweep on RK3588's "
        "int8-out depthwise, tests/dw_perc_probe.c): DPU_RDMA_BRDMA_CFG DATA_USE 7 reads a 64-byte group per 8 "
        "output channels, int32 A[8] at 0 (the BS ALU operand), int16 B[8] at 32 (the CPEND operand, "
        "DPU_BS_OW_CFG.OW_SRC 1), int16 C[8] at 48 (the multiplier, BS_MUL_CFG = (s << 8) | 1); DPU_BS_CFG "
        f"0x20140; the product shifted by s = {s_pos} when non-negative and DATA_FORMAT.BS_MUL_SHIFT_VALUE_NEG = "
        f"{s_neg} when negative, half to even, saturated to int32; then OUT_CVT SCALE/SHIFT {scale}/{shift}. "
        "A = bias - in_zp*sum(w - w_zp[c]), B = -w_zp[c], C = the channel's multiplier.\n\n"
        "Layouts: feature [C/16][H][W][16] int8; weights [C/64][KH][KW][64] int8; group [C/8][64] bytes; "
        "output [C/16][OH][OW][16] int8. perchannel_tflite.npz holds the unfolded w_zp, bias and C.\n\n"
        "Expected: TFLite's per-channel accumulator, then that multiplier and shift (reference.py). Exact: "
        "it matches only if B is applied per channel to a window sum with the padded taps at the pad value, "
        "C per channel, and the shift split by the product's sign.",
        w, [("feature", C_FEATURE, pack_feature(x.astype(np.int8), np.int8) + bytes(64), "input"),
            ("weight", C_WEIGHT, pack_weights_dw(wt.astype(np.int8), np.int8), "weight"),
            ("bias", C_BIAS, grp.tobytes(), "weight"), ("output", C_OUTPUT, bytes(out_bytes), "output")],
        ("output", out_bytes, "int8", {"kind": "exact"}),
        extra_files={"perchannel_tflite.npz": buf.getvalue()})


def write_fp16_out_case(root: Path) -> None:
    """20: rocket-userspace's int8 -> fp16 cast (OUT_PRECISION 2 on the integer path)."""
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import set_fields, set_raw  # noqa: E402
    M, K, N = 8, 64, 64
    rng = np.random.default_rng(20)
    # rocket-userspace's self-test data: values in [-8, 8) keep |acc| inside fp16's exact integers
    a = rng.integers(-8, 8, size=(M, K)).astype(np.int8)
    b = rng.integers(-8, 8, size=(N, K)).astype(np.int8)
    assert np.abs(a.astype(np.int64) @ b.astype(np.int64).T).max() <= 2048
    feat = np.ascontiguousarray(a.reshape(M, K // 16, 16).transpose(1, 0, 2)).tobytes()
    wt = np.ascontiguousarray(b.reshape(N // 32, 32, K // 32, 32).transpose(0, 2, 1, 3)).tobytes()
    (_i, w), = _conf_jobs("03_matmul_int8")
    w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=2)
    w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1, FP32TOFP16_EN=1)
    w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=0)
    w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=1, SIZE_E_0=3, SIZE_E_1=3, SIZE_E_2=3)
    w = set_raw(w, "DPU_DST_SURF_STRIDE", M << 4)
    w = set_fields(w, "DPU_SURFACE_ADD", SURF_ADD=M * 2)
    w = set_raw(w, "CNA_FEATURE_DATA_ADDR", C_FEATURE)
    w = set_raw(w, "CNA_DCOMP_ADDR0", C_WEIGHT)
    w = set_raw(w, "DPU_DST_BASE_ADDR", C_OUTPUT)
    out_bytes = N // 8 * M * 16
    write_program_case(
        root, "20_int8_matmul_fp16_out", "int8 matmul C[8,64] = A[8,64] . B[64,64]^T written as fp16 "
        "(OUT_PRECISION 2 on the integer path)",
        "Conformance 03's program (M 8, K 64, N 64) with rocket-userspace's self-test operands (tests/"
        "matmul_int8_dequant_rocket.c: values in [-8, 8); its fp16 cast runs at M 16, K 64, N 32) and "
        "DATA_FORMAT.OUT_PRECISION 2, OUT_CVT SCALE 1 / SHIFT 0 / FP32TOFP16_EN 1, size_e 3 and SURF_ADD stride*2 (notes encodings/out-cvt-converter.md, the fp16 row "
        "of \"Output dtype / cube on the int8 (int32-acc) datapath\": exact for |acc| <= 2048). Layouts: "
        "feature [K/16][M][16] int8, weights (N/32, K/32, 32, 32) int8, output [N/8][M][8] fp16.\n\n"
        "simulator_flags [\"lenient\"]: the notes call the fp16 writer geometry correct only for \"small "
        "single-tile shapes\" and rocket-userspace runs this shape as a non-gated diagnostic, so which shapes "
        "silicon writes correctly is undocumented; a strict simulator refuses every output past one 8-channel "
        "surface as a hazard (this one has 8) and the case passes only without strict mode. It pins the "
        "arithmetic, not the geometry.\n\nExact.",
        w, [("feature", C_FEATURE, feat + bytes(64), "input"), ("weight", C_WEIGHT, wt, "weight"),
            ("output", C_OUTPUT, bytes(out_bytes), "output")],
        ("output", out_bytes, "float16", {"kind": "exact"}), flags=["lenient"])


def write_program_case(root: Path, name: str, summary: str, doc: str, words: np.ndarray,
                       buffers: list[tuple[str, int, bytes, str]], out: tuple[str, int, str, dict],
                       extra_files: dict[str, bytes] | None = None,
                       flags: list[str] | None = None) -> None:
    """One job, one task at C_REGCMD; ``buffers`` = (name, iova, initial bytes, role); ``out`` =
    (buffer, size, dtype, tolerance); the case's reference.py is the committed one."""
    d = root / name
    (d / "program" / "blobs").mkdir(parents=True, exist_ok=True)
    words = np.asarray(words, dtype="<u8")
    (d / "program" / "j0_t000.regcmd").write_bytes(words.tobytes())
    blist = [{"name": "regcmd", "iova": C_REGCMD, "size": 8 * len(words) + 64, "role": "regcmd", "file": None}]
    for bname, iova, data, role in buffers:
        (d / "program" / "blobs" / f"{bname}.bin").write_bytes(data)
        blist.append({"name": bname, "iova": iova, "size": len(data), "role": role, "file": f"blobs/{bname}.bin"})
    for fname, data in (extra_files or {}).items():
        (d / fname).write_bytes(data)
    meta = {
        "format": "rk3588-regcmd-conformance-case/1", "case": name, "summary": summary,
        "generator": {"script": "tools/gen_conformance_extra.py",
                      "facts": "a conformance program retargeted with the fields notes "
                               "encodings/precision-field.md and tile-layouts.md document"},
        "simulator_flags": flags or [], "buffers": blist,
        "jobs": [{"index": 0, "tasks": [{"file": "j0_t000.regcmd", "regcmd_iova": C_REGCMD,
                                         "words": len(words), "enable_mask": "0x1d"}],
                  "in_buffers": [b[0] for b in buffers if b[3] != "output"] + ["regcmd"],
                  "out_buffers": [out[0]]}],
        "expected_output": {"file": "../expected_output.bin", "buffer": out[0], "offset": 0, "size": out[1],
                            "dtype": out[2], "tolerance": out[3]},
    }
    (d / "program" / "buffers.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "case.md").write_text(f"# {name}\n\n{summary}.\n\n{doc}\n")
    _place_reference(d)


def _tf32(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32).view(np.float32)


def write_precision_cases(root: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import int4_matmul, tf32_matmul  # noqa: E402
    rng = np.random.default_rng(15)
    M, K, N = 8, 64, 32
    a = (rng.standard_normal((M, K)) * 3e5).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    (_i, t01), = _conf_jobs("01_matmul_fp16")
    w, feat, wt = tf32_matmul(t01, a, b, C_FEATURE, C_WEIGHT, C_OUTPUT)
    # fp32 accumulation of K exact products: |error| <= K * 2^-24 * sum|a||b| (tf32-rounded operands)
    bound = float(K * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T).max())
    atol = float(np.float32(bound * 2))
    full = a.astype(np.float64) @ b.astype(np.float64).T
    gap = float(np.abs(_tf32(a).astype(np.float64) @ _tf32(b).astype(np.float64).T - full).max())
    assert gap > 10 * atol, "the case must tell tf32 from full fp32"
    write_program_case(
        root, "15_tf32_matmul", "tf32 matmul C[8,32] = A[8,64] . B[32,64]^T, raw fp32 operands past fp16's range",
        "Conformance 01's program with CNA_CONV_CON1 / CORE_MISC_CFG precision 7 (tf32), DPU in/proc/out 5 "
        "(fp32), FP32TOFP16_EN 0, size_e 3, DATA_ENTRIES K/16 (notes encodings/precision-field.md \"tf32\", "
        "tile-layouts.md). Layouts: feature [K/4][M][4] fp32; weights (N/16, K/16, 16, 16) fp32; output "
        f"[N/4][M][4] fp32.\n\nTolerance abs {atol:.4g}: twice K * 2^-24 * max sum|a||b| (fp32 accumulation of "
        f"exact tf32 products, any order). The tf32 rounding moves the result by up to {gap:.4g}, so a "
        "simulator that kept full fp32 operands fails.",
        w, [("feature", C_FEATURE, feat + bytes(64), "input"), ("weight", C_WEIGHT, wt, "weight"),
            ("output", C_OUTPUT, bytes(N // 4 * M * 16), "output")],
        ("output", N // 4 * M * 16, "float32", {"kind": "abs", "atol": atol}))

    rng = np.random.default_rng(16)
    M, K, N = 8, 64, 128
    a = rng.integers(-8, 8, size=(M, K))
    b = rng.integers(-8, 8, size=(N, K))
    (_i, t03), = _conf_jobs("03_matmul_int8")
    w, feat, wt = int4_matmul(t03, a, b, C_FEATURE, C_WEIGHT, C_OUTPUT)
    write_program_case(
        root, "16_int4_matmul", "int4 matmul C[8,128] = A[8,64] . B[128,64]^T to int16",
        "Conformance 03's program with CNA/CORE/DPU precision 6 (int4) and an int16 output (OUT_PRECISION 1, "
        "size_e 7) (notes encodings/precision-field.md \"int4\", tile-layouts.md). Layouts: feature "
        "[K/32][M][32] and weights (N/64, K/32, 64, 32), two signed nibbles per byte, element 2i in the low "
        "nibble (the notes: \"HILO=0 ... no swap\"; low-first is our reading); output [N/8][M][8] int16. "
        "K = 64 and N = 128 span two K- and two N-groups (the notes' single-group trap).\n\nExact.",
        w, [("feature", C_FEATURE, feat + bytes(4096), "input"), ("weight", C_WEIGHT, wt, "weight"),
            ("output", C_OUTPUT, bytes(N // 8 * M * 16), "output")],
        ("output", N // 8 * M * 16, "int16", {"kind": "exact"}))


def write_bs_case(root: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "sim"))
    from programs import set_fields, set_raw  # noqa: E402
    t, mul, s_pos, s_neg = 1, 77, 6, 3
    rng = np.random.default_rng(17)
    M, K, N = 8, 64, 64
    a = rng.integers(-128, 128, size=(M, K)).astype(np.int8)
    b = rng.integers(-128, 128, size=(N, K)).astype(np.int8)
    bias = rng.integers(-30000, 30000, size=N).astype("<i4")
    feat = np.ascontiguousarray(a.reshape(M, K // 16, 16).transpose(1, 0, 2)).tobytes()
    wt = np.ascontiguousarray(b.reshape(N // 32, 32, K // 32, 32).transpose(0, 2, 1, 3)).tobytes()
    (_i, w), = _conf_jobs("03_matmul_int8")
    w = set_fields(w, "CORE_CLIP_TRUNCATE", CLIP_TRUNCATE=t)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6))
    w = set_fields(w, "DPU_BS_MUL_CFG", BS_MUL_OPERAND=mul, BS_MUL_SHIFT_VALUE=s_pos)
    w = set_fields(w, "DPU_DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=s_neg)
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
    w = set_raw(w, "DPU_RDMA_RDMA_BS_BASE_ADDR", C_BIAS)
    w = set_raw(w, "CNA_FEATURE_DATA_ADDR", C_FEATURE)
    w = set_raw(w, "CNA_DCOMP_ADDR0", C_WEIGHT)
    w = set_raw(w, "DPU_DST_BASE_ADDR", C_OUTPUT)
    write_program_case(
        root, "17_int8_clip_bs_mul", "int8 matmul C[8,64] with CLIP_TRUNCATE 1 and a BS add-then-multiply "
        "with a sign-split rounding shift, int32 output",
        "Conformance 03's program with CORE_CLIP_TRUNCATE 1 (the CACC rounds by 2, ties away: NVDLA IAS and "
        "cmod, used by Mesa rkt_coefs.c), DPU_BS_CFG ALU (int32 bias from BRDMA, DATA_USE 1) + MUL "
        f"(operand {mul}, shift {s_pos} for a non-negative product), DATA_FORMAT.BS_MUL_SHIFT_VALUE_NEG {s_neg} "
        "for a negative one (notes encodings/out-cvt-converter.md \"Per-channel requant on the BS "
        "multiplier\": add before multiply, half-to-even shift split by sign, int32 saturation; the register "
        "operand stands in for the per-channel one, an inference). Layouts: feature [K/16][M][16] int8, "
        "weights (N/32, K/32, 32, 32) int8, bias int32[N], output [N/4][M][4] int32.\n\nExact.",
        w, [("feature", C_FEATURE, feat + bytes(64), "input"), ("weight", C_WEIGHT, wt, "weight"),
            ("bias", C_BIAS, bias.tobytes(), "weight"), ("output", C_OUTPUT, bytes(N // 4 * M * 16), "output")],
        ("output", N // 4 * M * 16, "int32", {"kind": "exact"}))


def _conf_jobs(case: str):
    meta = json.loads((CONF_DIR / case / "program" / "buffers.json").read_text())
    t = meta["jobs"][0]["tasks"][0]
    return [(t["regcmd_iova"], np.fromfile(CONF_DIR / case / "program" / t["file"], dtype="<u8"))]


def _reference_constants(name: str) -> dict:
    """The module constants of a case's committed reference.py (its geometry and quantisation
    parameters live there once; the generator builds the program from them)."""
    return runpy.run_path(str(OUT_DIR / name / "reference.py"))


def _place_reference(d: Path) -> None:
    """Put the case's committed reference.py (hand-written, its only home) beside the case and run
    it as a script: it writes expected_output.bin from the maths of the op."""
    src, dst = OUT_DIR / d.name / "reference.py", d / "reference.py"
    if src.resolve() != dst.resolve():
        shutil.copyfile(src, dst)
    runpy.run_path(str(dst), run_name="__main__")


def write_case(c: LutCase, root: Path) -> None:
    d = root / c.name
    (d / "program" / "blobs").mkdir(parents=True, exist_ok=True)
    n = c.x.size
    size = n * 2 + PAD
    inp = bytearray(size)
    inp[:n * 2] = c.x.astype("<f2").tobytes()
    (d / "program" / "blobs" / "input.bin").write_bytes(bytes(inp))
    (d / "program" / "blobs" / "output.initial.bin").write_bytes(bytes(size))
    words = np.array(lut_words(c), dtype="<u8")
    (d / "program" / "j0_t000.regcmd").write_bytes(words.tobytes())
    meta = {
        "format": "rk3588-regcmd-conformance-case/1",
        "case": c.name,
        "summary": c.summary,
        "generator": {"script": "tools/gen_conformance_extra.py",
                      "facts": "rocket-userspace rocket_activation.c / gen_lut_activation_fp16 register "
                               "values (conformance 05 framing); notes encodings/dpu-lut-activation.md"},
        "simulator_flags": c.flags,
        "buffers": [
            {"name": "guard", "iova": GUARD, "size": 4096, "role": "scratch", "file": None},
            {"name": "input", "iova": INPUT, "size": size, "role": "input", "file": "blobs/input.bin"},
            {"name": "output", "iova": OUTPUT, "size": size, "role": "output",
             "file": "blobs/output.initial.bin"},
            {"name": "regcmd", "iova": REGCMD, "size": 16384, "role": "regcmd", "file": None},
        ],
        "jobs": [{"index": 0, "tasks": [{"file": "j0_t000.regcmd", "regcmd_iova": REGCMD,
                                         "words": len(words), "enable_mask": "0x18"}],
                  "in_buffers": ["input", "regcmd"], "out_buffers": ["output"]}],
        "expected_output": {"file": "../expected_output.bin", "buffer": "output", "offset": 0,
                            "size": n * 2, "dtype": "float16", "tolerance": c.tolerance},
    }
    (d / "program" / "buffers.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "case.md").write_text(f"# {c.name}\n\n{c.summary}.\n\n{c.doc}\n")
    _place_reference(d)


def generate(root: Path) -> None:
    """Every case; the conv case derives its words from conformance 03 and is skipped (left as
    committed) where that set is absent."""
    root.mkdir(parents=True, exist_ok=True)
    shared = OUT_DIR / "tflite_int8.py"          # the int8 conv cases' references import it
    if shared.resolve() != (root / shared.name).resolve():
        shutil.copyfile(shared, root / shared.name)
    for c in cases():
        write_case(c, root)
    if CONF_DIR is not None:
        write_conv_case(root)
        write_precision_cases(root)
        write_bs_case(root)
        write_dw_case(root)
        write_fp16_out_case(root)
        write_perchannel_case(root)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed cases differ")
    args = ap.parse_args()
    if not args.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        bad = [str(p.relative_to(tmp)) for p in sorted(Path(tmp).rglob("*")) if p.is_file()
               and "__pycache__" not in p.parts
               and (not (OUT_DIR / p.relative_to(tmp)).is_file()
                    or (OUT_DIR / p.relative_to(tmp)).read_bytes() != p.read_bytes())]
    if bad:
        print("out of date:", *bad, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
