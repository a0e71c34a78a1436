"""Per-channel operands of the DPU's SDP stages: what the simulator models and what it refuses.

Modelled (notes encodings/out-cvt-converter.md "Per-channel (per-axis) requant on the BS
multiplier", sdp-stage-precision.md; HW sweeps on RK3588's int8-out depthwise and direct programs):
BRDMA_DATA_USE 7 reads a 64-byte group per 8 output channels -- int32 A[8] at 0, int16 B[8] at 32,
int16 C[8] at 48 -- and the integer BS stage computes
    v = sat32(rne(((acc + A[c] + B[c]*S) * C[c]) >> (p >= 0 ? s : s_neg)))
with S the CNA's window sum (border pad included) when DPU_BS_OW_CFG.OW_SRC = 1.

Refused, each with what is undocumented: per-channel BS/BN operands on the float path, the BN
stage's per-channel operands (the one measured configuration hung), other BRDMA_DATA_USE values,
and the EW stage's per-channel / per-channel-x-pixel ERDMA data modes (fields in the TRM, behaviour
unmeasured). The reference below is numpy over TFLite's per-channel arithmetic, independent of the
program."""
from __future__ import annotations

import numpy as np
import pytest

from harness import CONFORMANCE
from programs import (ConvGeometry, dwconv_ref, pack_feature, pack_weights_dw, set_fields, set_raw)
from test_dpu_helpers import RJ_EHAZARD, RJ_EUNSUPP, run_case
from test_int8_requant import BIAS, requant_program, run

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")

G = ConvGeometry(C=64, H=6, W=5, N=64, KH=3, KW=3, pad=(1, 1), depthwise=True, int8=True)
IN_ZP, OUT_ZP, S_POS, S_NEG, SCALE, SHIFT = -37, 5, 14, 13, 17675, 23


def rne(v: np.ndarray, shift: int) -> np.ndarray:
    return np.round(v.astype(np.float64) / 2.0 ** shift).astype(np.int64)


def group_bytes(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> bytes:
    """[C/8] groups of 64 bytes: int32 A[8], int16 B[8], int16 C[8] (out-cvt-converter.md)."""
    n = a.size // 8
    g = np.zeros((n, 64), np.uint8)
    g[:, 0:32] = a.astype("<i4").reshape(n, 8).view(np.uint8).reshape(n, 32)
    g[:, 32:48] = b.astype("<i2").reshape(n, 8).view(np.uint8).reshape(n, 16)
    g[:, 48:64] = c.astype("<i2").reshape(n, 8).view(np.uint8).reshape(n, 16)
    return g.tobytes()


def per_channel_program(ow_src: bool = True) -> np.ndarray:
    w = requant_program(G, IN_ZP, 0, OUT_ZP)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6))          # 0x20140: ALU from DMA, MUL live
    w = set_raw(w, "DPU_BS_MUL_CFG", (S_POS << 8) | 1)                        # BS_MUL_SRC = 1
    w = set_fields(w, "DPU_DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=S_NEG)
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=7)
    w = set_fields(w, "DPU_BS_OW_CFG", OW_SRC=int(ow_src))
    w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=SCALE)
    return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=SHIFT)


def data(seed: int = 12):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(G.C, G.H, G.W)).astype(np.int64)
    w_zp = rng.integers(-40, 40, size=G.C)                       # a weight zero point per channel
    wt = np.clip(w_zp[:, None, None] + rng.integers(-90, 90, size=(G.C, G.KH, G.KW)), -128, 127)
    bias = rng.integers(-4000, 4000, size=G.C)
    mult = rng.integers(2048, 32768, size=G.C)                   # every measured C is positive
    return x, wt.astype(np.int64), w_zp, bias, mult


def tflite_per_channel(x, wt, w_zp, bias, mult) -> np.ndarray:
    """sum over the valid taps of (x - in_zp)(w - w_zp[c]) + bias[c], then the BS multiplier and
    its sign-split half-to-even shift, then the OUT_CVT requant (half to even) and the int8 clamp."""
    oh, ow = G.out_hw
    acc = dwconv_ref((x - IN_ZP).astype(np.float64), (wt - w_zp[:, None, None]).astype(np.float64),
                     G.stride, G.pad, G.dil, (oh, ow), 0.0).astype(np.int64) + bias[:, None, None]
    p = acc * mult[:, None, None]
    v = np.clip(np.where(p >= 0, rne(p, S_POS), rne(p, S_NEG)), -2**31, 2**31 - 1)
    return np.clip(rne(v * SCALE, SHIFT) + OUT_ZP, -128, 127)


def test_brdma_group_gives_per_channel_cpend_multiplier_and_bias():
    x, wt, w_zp, bias, mult = data()
    # Mesa's fold, per channel: A = bias - in_zp * sum(w - w_zp[c]); B = -w_zp[c] on CPEND's window sum
    a = bias - IN_ZP * (wt - w_zp[:, None, None]).sum(axis=(1, 2))
    mem_bias = group_bytes(a, -w_zp, mult)
    got = run(per_channel_program(), G, pack_feature(x.astype(np.int8), np.int8),
              pack_weights_dw(wt.astype(np.int8), np.int8), np.frombuffer(mem_bias, "<i4"))
    want = tflite_per_channel(x, wt, w_zp, bias, mult)
    assert len(np.unique(want)) > 60 and (want == -128).mean() < 0.05 and (want == 127).mean() < 0.05
    np.testing.assert_array_equal(got, want)
    # the check can fail: one weight zero point for every channel, or the register multiplier, is wrong
    assert (tflite_per_channel(x, wt, np.full_like(w_zp, w_zp[0]), bias, mult) != want).mean() > 0.3
    assert (tflite_per_channel(x, wt, w_zp, bias, np.full_like(mult, mult[0])) != want).mean() > 0.3


def test_ow_src_without_the_group_is_refused():
    def mut(j, t, w):
        w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=0, OW_SRC=1)
        return set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=0)
    r = run_case("03", mutate=mut, strict=False)
    assert r.rc == RJ_EUNSUPP and "DATA_USE 7" in r.msg, r.msg


def test_other_brdma_data_use_is_refused():
    w = per_channel_program()
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=5)
    x, wt, w_zp, bias, mult = data()
    with pytest.raises(Exception, match="DATA_USE 1 with the ALU operand alone"):
        run(w, G, pack_feature(x.astype(np.int8), np.int8), pack_weights_dw(wt.astype(np.int8), np.int8),
            np.zeros(G.C * 4, "<i4"))


def test_negative_per_channel_multiplier_is_refused():
    x, wt, w_zp, bias, mult = data()
    mult[5] = -100
    with pytest.raises(Exception, match="only C >= 0 is documented"):
        run(per_channel_program(), G, pack_feature(x.astype(np.int8), np.int8),
            pack_weights_dw(wt.astype(np.int8), np.int8), np.frombuffer(group_bytes(bias, -w_zp, mult), "<i4"))


def test_bn_per_channel_multiplier_is_the_documented_hang():
    """BN_MUL_SRC with NRDMA: 'all 8 tasks ... ran to the 500 ms watchdog and wrote nothing'."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_BN_CFG", (1 << 6) | (1 << 1))                   # MUL live, ALU bypassed
        return set_raw(w, "DPU_BN_MUL_CFG", 1)                               # BN_MUL_SRC = 1
    r = run_case("03", mutate=mut)
    assert r.rc == RJ_EHAZARD and "hung" in r.msg, r.msg
    assert run_case("03", mutate=mut, strict=False).rc == RJ_EUNSUPP


@pytest.mark.parametrize("stage,word", [("DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4)),
                                        ("DPU_BN_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4))])
def test_per_channel_alu_operand_on_the_float_path_is_refused(stage, word):
    """The notes document the per-channel operand of the integer BS stage only; the message points
    at the documented float-path route (EW per-pixel operand, broadcast cube)."""
    r = run_case("01", mutate=lambda j, t, w: set_raw(w, stage, word), strict=False)
    assert r.rc == RJ_EUNSUPP, r.msg
    assert "float path" in r.msg and "per-pixel operand" in r.msg and "broadcast" in r.msg, r.msg


def test_per_channel_multiplier_on_the_float_path_is_refused():
    def mut(j, t, w):
        w = set_raw(w, "DPU_BS_CFG", (1 << 1) | (1 << 6))                     # MUL live, ALU bypassed
        return set_raw(w, "DPU_BS_MUL_CFG", (0x3C00 << 16) | 1)              # MUL_SRC = 1
    r = run_case("01", mutate=mut, strict=False)
    assert r.rc == RJ_EUNSUPP and "float path" in r.msg and "per-pixel operand" in r.msg, r.msg


def test_bn_per_channel_alu_operand_on_the_integer_path_is_refused():
    r = run_case("03", mutate=lambda j, t, w: set_raw(w, "DPU_BN_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4)),
                 strict=False)
    assert r.rc == RJ_EUNSUPP and "NRDMA" in r.msg, r.msg


@pytest.mark.parametrize("mode", [0, 2])
def test_ew_per_channel_data_modes_are_refused(mode):
    """ERDMA_DATA_MODE 0 (per channel) and 2 (per channel x pixel) exist in the TRM; what they read
    is unmeasured, so a program using them is refused with the documented alternative."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_EW_CFG", EW_DATA_MODE=mode)
        return set_fields(w, "DPU_RDMA_RDMA_ERDMA_CFG", ERDMA_DATA_MODE=mode)
    r = run_case("02", mutate=mut, strict=False)
    assert r.rc == RJ_EUNSUPP and "unmeasured" in r.msg and "broadcast" in r.msg, r.msg


# ---- DPU-only two-buffer EW (the route a broadcast per-channel operand takes without a conv) ----

OPERAND_OFF = 0x800          # the operand cube inside case 05's input buffer, past its 128 inputs


def flying_ew(word: int, comb: int = 4, orig_channel: int = 7):
    """Conformance 05's DPU-only program turned into a two-buffer EW op: BN and LUT bypassed,
    identity OUT_CVT, the operand on ERDMA (per pixel, 16-bit) at input + OPERAND_OFF."""
    from programs import insert_before_trailer
    from rockjit.lowering.registers import emit_raw

    def mut(j, t, w):
        w = set_raw(w, "DPU_BN_CFG", 0x53)                                    # BN bypassed
        w = set_raw(w, "DPU_EW_CFG", word)
        w = set_raw(w, "DPU_RDMA_RDMA_ERDMA_CFG", 0x40000008)
        w = set_fields(w, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", COMB_USE=comb)
        w = set_fields(w, "DPU_DATA_CUBE_CHANNEL", ORIG_CHANNEL=orig_channel)
        w = set_raw(w, "DPU_OUT_CVT_OFFSET", 0)
        w = set_fields(w, "DPU_OUT_CVT_SHIFT", MINUS_EXP=0, CVT_TYPE=0)
        return insert_before_trailer(w, [emit_raw("DPU_RDMA_RDMA_EW_BASE_ADDR", 0x01002000 + OPERAND_OFF)])
    return mut


def operand_values() -> np.ndarray:
    return np.random.default_rng(5).uniform(-4, 4, 128).astype(np.float16)


def put_operand(mem):
    mem["input"][1][OPERAND_OFF:OPERAND_OFF + 256] = operand_values().tobytes()


@pytest.mark.parametrize("word,op", [(0x108202C0, np.add), (0x108003C4, np.multiply),
                                     (0x108002C0, np.maximum), (0x108102C0, np.minimum)])
def test_dpu_only_two_operand_ew_computes(word, op):
    """fp16 ADD/MUL/MAX/MIN of two memory cubes with no conv: 'exactly on every element' (notes:
    sdp-stage-precision.md "A two-buffer EW op needs no conv main feed"); fp32 math, one fp16
    rounding at the output."""
    r = run_case("05", mutate=flying_ew(word), patch=put_operand)
    assert r.rc == 0, r.msg
    from test_sim_lut import x_in
    a, b = x_in().astype(np.float32), operand_values().astype(np.float32)
    want = op(a, b).astype(np.float16)
    got = np.frombuffer(bytes(r.buf("output")[:256]), np.float16)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, a.astype(np.float16))


@pytest.mark.parametrize("word,comb,orig,what", [
    (0x108202C0, 5, 7, "never completes"),
    (0x108202C0, 4, 0, "only lane 0"),
    (0x108203C4 & ~0x4 | 0x100, 4, 7, "pass the main operand through"),   # ADD, converter bypassed
    (0x108003C4 & ~0x100, 4, 7, "times out")])                              # MUL, converter live
def test_dpu_only_two_operand_ew_failures_are_hazards(word, comb, orig, what):
    r = run_case("05", mutate=flying_ew(word, comb, orig), patch=put_operand)
    assert r.rc == RJ_EHAZARD and what in r.msg, r.msg
