"""Mesa/Teflon's int8 requantizing conv program on the simulator: int8 in and out, a
per-channel int32 bias through BRDMA, the weight-offset correction CPEND (DPU_BS_OW_CFG.OD_BYPASS
= 0, DPU_BS_OW_OP = -w_zp), an input zero point in the CNA pad, and the OUT_CVT requant
(SCALE, SHIFT, OFFSET = output zero point). Facts: notes depthwise-conv.md ("The int8 domain",
"DPU_BS_OW_OP is the CPEND operand", "CNA_PAD_CON1"), encodings/out-cvt-converter.md.

The reference is TFLite's int8 conv arithmetic written here in numpy, independent of the
program: acc = sum over the *valid* taps of (x - in_zp)(w - w_zp) + bias, then
sat8(round_half_even(acc * SCALE / 2^SHIFT) + out_zp). The program reaches it only if CPEND's
window sum counts the padded taps at the pad value (the input zero point)."""
from __future__ import annotations

import numpy as np
import pytest

from harness import CONFORMANCE, Simulator, open_case
from programs import (ConvGeometry, conv_ref, dwconv_ref, pack_feature, pack_weights_direct,
                      pack_weights_dw, retarget, set_fields, set_raw, unpack_output)

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")

REGCMD, FEATURE, WEIGHT, OUTPUT, BIAS = 0x01000000, 0x01100000, 0x01400000, 0x01800000, 0x01A00000
SCALE, SHIFT = 17675, 22       # a Teflon capture's pair (depthwise-conv.md)


def template() -> np.ndarray:
    (_iova, words), = open_case("03_matmul_int8").jobs()[0]
    return words


def rne(v: np.ndarray, shift: int) -> np.ndarray:
    return np.round(v.astype(np.float64) / 2.0 ** shift).astype(np.int64)


def requant_program(g: ConvGeometry, in_zp: int, w_zp: int, out_zp: int) -> np.ndarray:
    oh, ow = g.out_hw
    w = retarget(template(), g, FEATURE, WEIGHT, OUTPUT, in_zp & 0xFF)
    # the pad byte in every lane (depthwise-conv.md "CNA_PAD_CON1 is read per byte lane")
    w = set_raw(w, "CNA_PAD_CON1", (in_zp & 0xFF) * 0x01010101)
    if g.depthwise:
        w = set_fields(w, "CNA_CONV_CON1", CONV_MODE=3)
        w = set_fields(w, "CORE_MISC_CFG", DW_EN=1, QD_EN=1)
        size_e, surf_add = 3, oh * ow * 4
    else:
        w = set_fields(w, "CORE_MISC_CFG", QD_EN=1)
        size_e, surf_add = 1, oh * ow * 2
    w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=0)
    w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=0, SIZE_E_0=size_e, SIZE_E_1=size_e, SIZE_E_2=size_e)
    w = set_raw(w, "DPU_BS_OW_OP", (-w_zp) & 0xFFFF)
    w = set_fields(w, "DPU_SURFACE_ADD", SURF_ADD=surf_add)
    # per-channel int32 bias added by the BS ALU from BRDMA (DATA_USE 1)
    w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4))
    w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
    w = set_raw(w, "DPU_RDMA_RDMA_BS_BASE_ADDR", BIAS)
    w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=SCALE)
    w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=SHIFT)
    return set_raw(w, "DPU_OUT_CVT_OFFSET", out_zp & 0xFFFFFFFF)


def run(words, g, feature: bytes, weights: bytes, bias: np.ndarray) -> np.ndarray:
    oh, ow = g.out_hw
    mem = {
        "regcmd": (REGCMD, bytearray(8 * len(words) + 64)),
        "feature": (FEATURE, bytearray(feature) + bytearray(64)),
        "weight": (WEIGHT, bytearray(weights)),
        "output": (OUTPUT, bytearray(g.output_bytes())),
        "bias": (BIAS, bytearray(bias.astype("<i4").tobytes())),
    }
    mem["regcmd"][1][:8 * len(words)] = words.tobytes()
    Simulator().run_job(mem, [(REGCMD, len(words))])
    return unpack_output(bytes(mem["output"][1]), np.int8, g.N, oh, ow).astype(np.int64)


CASES = [
    pytest.param(ConvGeometry(C=32, H=6, W=5, N=32, KH=3, KW=3, pad=(1, 1), int8=True), 37, 25, -20,
                 id="direct-3x3-pad1"),
    pytest.param(ConvGeometry(C=64, H=7, W=6, N=32, KH=3, KW=3, stride=(2, 1), pad=(1, 1), int8=True),
                 -2, -62, 5, id="direct-3x3-s2"),
    pytest.param(ConvGeometry(C=64, H=6, W=5, N=64, KH=3, KW=3, pad=(1, 1), depthwise=True, int8=True),
                 -100, 90, 3, id="depthwise-3x3-pad1"),
]


@pytest.mark.parametrize("g,in_zp,w_zp,out_zp", CASES)
def test_int8_requant_with_weight_offset_matches_tflite_arithmetic(g, in_zp, w_zp, out_zp):
    rng = np.random.default_rng(7)
    oh, ow = g.out_hw
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int64)
    if g.depthwise:
        wt = rng.integers(max(-128, w_zp - 100), min(128, w_zp + 100), size=(g.C, g.KH, g.KW)).astype(np.int64)
        wsum = (wt - w_zp).sum(axis=(1, 2))
        # TFLite: valid taps only -- the pad of (x - in_zp) is 0
        acc_t = dwconv_ref((x - in_zp).astype(np.float64), (wt - w_zp).astype(np.float64),
                           g.stride, g.pad, g.dil, (oh, ow), 0.0)
        wbytes = pack_weights_dw(wt.astype(np.int8), np.int8)
        naive_s = dwconv_ref(x.astype(np.float64), np.ones((g.C, g.KH, g.KW)), g.stride, g.pad, g.dil,
                             (oh, ow), 0.0)
    else:
        wt = rng.integers(max(-128, w_zp - 100), min(128, w_zp + 100),
                          size=(g.N, g.C, g.KH, g.KW)).astype(np.int64)
        wsum = (wt - w_zp).sum(axis=(1, 2, 3))
        acc_t = conv_ref((x - in_zp).astype(np.float64), (wt - w_zp).astype(np.float64),
                         g.stride, g.pad, g.dil, (oh, ow), 0.0)
        wbytes = pack_weights_direct(wt.astype(np.int8), np.int8)
        naive_s = conv_ref(x.astype(np.float64), np.ones((1, g.C, g.KH, g.KW)), g.stride, g.pad, g.dil,
                           (oh, ow), 0.0)
    bias = rng.integers(-5000, 5000, size=g.N).astype(np.int64)
    acc_t = acc_t.astype(np.int64) + bias[:, None, None]
    want = np.clip(rne(acc_t * SCALE, SHIFT) + out_zp, -128, 127)
    assert len(np.unique(want)) > 30
    # Mesa's bias fold: bias - in_zp * sum(w - w_zp)
    a = bias - in_zp * wsum
    got = run(requant_program(g, in_zp, w_zp, out_zp), g, pack_feature(x.astype(np.int8), np.int8),
              wbytes, a)
    assert np.array_equal(got, want)
    # the check can fail: a window sum that skipped the pad taps would be off at the border
    # by -w_zp * in_zp per padded tap
    border = np.zeros((oh, ow), bool)
    border[0, :] = border[:, 0] = True
    assert (np.abs(naive_s - conv_or_dw_sum_with_pad(x, g, in_zp)) > 0)[..., border].any()


def conv_or_dw_sum_with_pad(x: np.ndarray, g: ConvGeometry, in_zp: int) -> np.ndarray:
    oh, ow = g.out_hw
    if g.depthwise:
        return dwconv_ref(x.astype(np.float64), np.ones((g.C, g.KH, g.KW)), g.stride, g.pad, g.dil,
                          (oh, ow), float(in_zp))
    return conv_ref(x.astype(np.float64), np.ones((1, g.C, g.KH, g.KW)), g.stride, g.pad, g.dil,
                    (oh, ow), float(in_zp))
