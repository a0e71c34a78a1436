"""CNA + CORE against numpy on programs derived from the conformance words by changing the
geometry fields (dilation, padding, pad value, strides, kernel shapes, depthwise, int8).

Data are small integers so every fp16 product and partial sum is exact: the accumulator and
the fp16/int32 output must equal a float64 / int64 numpy convolution exactly."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from harness import CONFORMANCE, Simulator, open_case
from programs import (ConvGeometry, conv_ref, dwconv_ref, pack_feature, pack_weights_direct, pack_weights_dw,
                      int4_matmul, retarget, set_fields, tf32_matmul, unpack_output)

pytestmark = pytest.mark.skipif(not CONFORMANCE.is_dir(),
                                reason=f"conformance set not present at {CONFORMANCE}")

REGCMD, FEATURE, WEIGHT, OUTPUT = 0x01000000, 0x01100000, 0x01400000, 0x01800000


def template(name: str) -> np.ndarray:
    (_iova, words), = open_case(name).jobs()[0]
    return words


def run_program(words: np.ndarray, g: ConvGeometry, feature: bytes, weights: bytes,
                sim: Simulator | None = None):
    sim = sim or Simulator()
    mem = {
        "regcmd": (REGCMD, bytearray(8 * len(words) + 64)),
        "feature": (FEATURE, bytearray(feature) + bytearray(64)),
        "weight": (WEIGHT, bytearray(weights)),
        "output": (OUTPUT, bytearray(g.output_bytes())),
    }
    mem["regcmd"][1][:8 * len(words)] = words.tobytes()
    sim.run_job(mem, [(REGCMD, len(words))])
    return sim, bytes(mem["output"][1])


def fp16_conv_case(g: ConvGeometry, seed: int, pad_value: float = 0.0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(g.C, g.H, g.W)).astype(np.float16)
    oh, ow = g.out_hw
    if g.depthwise:
        w = rng.integers(-2, 3, size=(g.C, g.KH, g.KW)).astype(np.float16)
        ref = dwconv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow), pad_value)
        words = retarget(template("09_dwconv3x3_s2_fp16"), g, FEATURE, WEIGHT, OUTPUT,
                         int(np.float16(pad_value).view(np.uint16)))
        wbytes = pack_weights_dw(w, np.float16)
    else:
        w = rng.integers(-2, 3, size=(g.N, g.C, g.KH, g.KW)).astype(np.float16)
        ref = conv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow), pad_value)
        words = retarget(template("04_conv3x3_s2_fp16"), g, FEATURE, WEIGHT, OUTPUT,
                         int(np.float16(pad_value).view(np.uint16)))
        wbytes = pack_weights_direct(w, np.float16)
    assert np.abs(ref).max() < 2048  # exact in fp16
    return words, pack_feature(x, np.float16), wbytes, ref


def check(sim: Simulator, out: bytes, g: ConvGeometry, ref: np.ndarray, dtype) -> None:
    oh, ow = g.out_hw
    acc = sim.last_acc()
    assert acc.shape == (oh, ow, g.N)
    np.testing.assert_array_equal(acc.transpose(2, 0, 1), ref.astype(acc.dtype))
    got = unpack_output(out, dtype, g.N, oh, ow)
    np.testing.assert_array_equal(got, ref.astype(dtype))


FP16_DIRECT = [
    pytest.param(ConvGeometry(C=32, H=9, W=10, N=16, KH=3, KW=3, pad=(2, 2), dil=(2, 2)), 0.0, id="dil2-pad2"),
    pytest.param(ConvGeometry(C=64, H=8, W=7, N=32, KH=3, KW=2, stride=(2, 1), pad=(1, 0), pad_bottom=0,
                              pad_right=2), 0.0, id="asym-stride-pad"),
    pytest.param(ConvGeometry(C=32, H=6, W=6, N=16, KH=3, KW=3, pad=(1, 1)), 1.0, id="pad-value-1.0"),
    pytest.param(ConvGeometry(C=96, H=11, W=9, N=48, KH=5, KW=5, stride=(3, 2), pad=(2, 1), dil=(1, 2)), 0.0,
                 id="5x5-s3x2-dilx2"),
    pytest.param(ConvGeometry(C=32, H=4, W=20, N=16, KH=1, KW=1, stride=(1, 2)), 0.0, id="1x1-stride2"),
]


@pytest.mark.parametrize("g,pad_value", FP16_DIRECT)
def test_fp16_direct_conv_variants(g: ConvGeometry, pad_value: float) -> None:
    words, feat, wts, ref = fp16_conv_case(g, seed=zlib.crc32(str(g).encode()), pad_value=pad_value)
    sim, out = run_program(words, g, feat, wts)
    check(sim, out, g, ref, np.float16)
    oh, ow = g.out_hw
    assert sim.stats()["macs"] == oh * ow * g.N * g.C * g.KH * g.KW


FP16_DW = [
    pytest.param(ConvGeometry(C=32, H=8, W=8, N=32, KH=3, KW=3, pad=(2, 2), dil=(2, 2), depthwise=True),
                 id="dw-dil2"),
    pytest.param(ConvGeometry(C=96, H=9, W=7, N=96, KH=3, KW=3, stride=(2, 2), pad=(1, 1), depthwise=True),
                 id="dw-3groups-s2"),
    pytest.param(ConvGeometry(C=64, H=6, W=10, N=64, KH=5, KW=3, stride=(1, 2), pad=(2, 1), pad_bottom=2,
                              depthwise=True), id="dw-5x3"),
]


@pytest.mark.parametrize("g", FP16_DW)
def test_fp16_depthwise_variants(g: ConvGeometry) -> None:
    words, feat, wts, ref = fp16_conv_case(g, seed=7)
    sim, out = run_program(words, g, feat, wts)
    check(sim, out, g, ref, np.float16)


def int8_conv_case(g: ConvGeometry, seed: int, pad_value: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int8)
    w = rng.integers(-128, 128, size=(g.N, g.C, g.KH, g.KW)).astype(np.int8)
    oh, ow = g.out_hw
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow), pad_value)
    words = retarget(template("03_matmul_int8"), g, FEATURE, WEIGHT, OUTPUT, pad_value & 0xFF)
    return words, pack_feature(x, np.int8), pack_weights_direct(w, np.int8), ref.astype(np.int64)


@pytest.mark.parametrize("g,pad_value", [
    pytest.param(ConvGeometry(C=32, H=6, W=5, N=32, KH=3, KW=3, pad=(1, 1), int8=True), -3, id="3x3-pad-3"),
    pytest.param(ConvGeometry(C=64, H=8, W=1, N=96, int8=True), 0, id="matmul-N96"),
    pytest.param(ConvGeometry(C=64, H=7, W=6, N=64, KH=2, KW=3, stride=(2, 1), dil=(2, 1), int8=True), 0,
                 id="2x3-dil"),
])
def test_int8_conv_variants(g: ConvGeometry, pad_value: int) -> None:
    words, feat, wts, ref = int8_conv_case(g, seed=3, pad_value=pad_value)
    sim, out = run_program(words, g, feat, wts)
    check(sim, out, g, ref, np.int32)


def test_fp16_matmul_random_values_within_fp16_rounding() -> None:
    """Non-integer data: the accumulator is fp32 (any order), the output one fp16 rounding."""
    M, K, N = 64, 128, 64
    g = ConvGeometry(C=K, H=M, W=1, N=N)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    words = retarget(template("01_matmul_fp16"), g, FEATURE, WEIGHT, OUTPUT)
    feat = pack_feature(a.T.reshape(K, M, 1), np.float16)
    wts = pack_weights_direct(b.reshape(N, K, 1, 1), np.float16)
    sim, out = run_program(words, g, feat, wts)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    acc = sim.last_acc()[:, 0, :]
    np.testing.assert_allclose(acc, ref, rtol=1e-5, atol=1e-4)
    got = unpack_output(out, np.float16, N, M, 1)[:, :, 0].T.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=2e-3)


def test_accumulator_buffers_are_sized_per_type() -> None:
    """Regression: the int32 and fp32 accumulator/operand buffers shared one capacity field, so
    after a large int8 task a medium fp16 task wrote past its (smaller) fp32 buffer."""
    sim = Simulator()
    small = ConvGeometry(C=32, H=4, W=1, N=16)
    words, feat, wts, ref = fp16_conv_case(small, seed=1)
    sim, out = run_program(words, small, feat, wts, sim)
    check(sim, out, small, ref, np.float16)
    big = ConvGeometry(C=64, H=16, W=16, N=64, KH=3, KW=3, pad=(1, 1), int8=True)
    words, feat, wts, ref = int8_conv_case(big, seed=2)
    sim, out = run_program(words, big, feat, wts, sim)
    check(sim, out, big, ref, np.int32)
    medium = ConvGeometry(C=64, H=12, W=12, N=48, KH=3, KW=3, pad=(1, 1))
    words, feat, wts, ref = fp16_conv_case(medium, seed=3)
    sim, out = run_program(words, medium, feat, wts, sim)
    check(sim, out, medium, ref, np.float16)


def test_padded_line_and_surface_strides():
    """A feature cube whose lines and surfaces carry padding: LINE_STRIDE/SURF_STRIDE decide
    where each line and surface starts (line pitch = 4*LINE_STRIDE bytes, surface pitch =
    16*(SURF_STRIDE+LINE_STRIDE) bytes, the reading of Mesa's formulas in cna.c). The padding
    holds a large poison value, so a mis-strided read shows up in the result."""
    g = ConvGeometry(C=64, H=6, W=6, N=16, KH=3, KW=3, pad=(1, 1))
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, size=(g.C, g.H, g.W)).astype(np.float16)
    w = rng.integers(-2, 3, size=(g.N, g.C, g.KH, g.KW)).astype(np.float16)
    oh, ow = g.out_hw
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow))
    line_atoms, surf_bytes = g.W + 3, 1280            # 3 padding atoms per line, 128 B per surface
    line_reg = line_atoms * 16 // 4
    surf_reg = surf_bytes // 16 - line_reg
    cube = np.full((g.C // 8, surf_bytes // 2), 1000.0, dtype=np.float16)  # poison everywhere
    for s in range(g.C // 8):
        for h in range(g.H):
            for col in range(g.W):
                at = (h * line_atoms * 16 + col * 16) // 2
                cube[s, at:at + 8] = x[8 * s:8 * s + 8, h, col]
    words = retarget(template("04_conv3x3_s2_fp16"), g, FEATURE, WEIGHT, OUTPUT)
    words = set_fields(words, "CNA_DMA_CON1", LINE_STRIDE=line_reg)
    words = set_fields(words, "CNA_DMA_CON2", SURF_STRIDE=surf_reg)
    sim, out = run_program(words, g, cube.tobytes(), pack_weights_direct(w, np.float16))
    check(sim, out, g, ref, np.float16)


def test_weight_reuse_keeps_the_cbuf_weights():
    """WEIGHT_REUSE: the second task multiplies a new feature by the weights already in the
    CBUF and does not re-read weight memory (notes: encodings/cbuf-reuse.md). The weight memory
    is zeroed between the tasks; the result must still be the product with the old weights."""
    g = ConvGeometry(C=64, H=8, W=1, N=32)
    rng = np.random.default_rng(9)
    a1, a2 = (rng.integers(-3, 4, size=(g.C, g.H, 1)).astype(np.float16) for _ in range(2))
    w = rng.integers(-2, 3, size=(g.N, g.C, 1, 1)).astype(np.float16)
    base = retarget(template("01_matmul_fp16"), g, FEATURE, WEIGHT, OUTPUT)
    sim = Simulator()
    sim, out1 = run_program(base, g, pack_feature(a1, np.float16), pack_weights_direct(w, np.float16), sim)
    reuse = set_fields(base, "CNA_CBUF_CON0", WEIGHT_REUSE=1)
    sim, out2 = run_program(reuse, g, pack_feature(a2, np.float16), bytes(len(pack_weights_direct(w, np.float16))),
                            sim)
    for a, out in ((a1, out1), (a2, out2)):
        ref = conv_ref(a.astype(np.float64), w.astype(np.float64), out_hw=(g.H, 1))
        np.testing.assert_array_equal(unpack_output(out, np.float16, g.N, g.H, 1), ref.astype(np.float16))
    # without the bit the zeroed weights are fetched: all-zero output
    sim2, out3 = run_program(base, g, pack_feature(a2, np.float16), bytes(len(pack_weights_direct(w, np.float16))))
    assert not np.any(unpack_output(out3, np.float16, g.N, g.H, 1))


def test_int8_depthwise_conv():
    """Depthwise (CONV_MODE 3 + DW_EN) at int8: weights [C/64][KH][KW][64] (notes:
    depthwise-conv.md, tile-layouts.md), int32 accumulator and output."""
    g = ConvGeometry(C=64, H=6, W=5, N=64, KH=3, KW=3, pad=(1, 1), depthwise=True, int8=True)
    rng = np.random.default_rng(13)
    x = rng.integers(-128, 128, size=(g.C, g.H, g.W)).astype(np.int8)
    w = rng.integers(-128, 128, size=(g.C, g.KH, g.KW)).astype(np.int8)
    oh, ow = g.out_hw
    ref = dwconv_ref(x.astype(np.float64), w.astype(np.float64), g.stride, g.pad, g.dil, (oh, ow))
    words = retarget(template("03_matmul_int8"), g, FEATURE, WEIGHT, OUTPUT)
    words = set_fields(words, "CNA_CONV_CON1", CONV_MODE=3)
    words = set_fields(words, "CORE_MISC_CFG", DW_EN=1)
    sim, out = run_program(words, g, pack_feature(x, np.int8), pack_weights_dw(w, np.int8))
    check(sim, out, g, ref.astype(np.int64), np.int32)


def tf32(x: np.ndarray) -> np.ndarray:
    """fp32 -> tf32 (10-bit mantissa), round to nearest even, in numpy."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def test_tf32_matmul():
    """tf32 (CNA/CORE precision 7, DPU fp32 = 5): raw fp32 operands, the MAC rounds each to a
    10-bit mantissa and accumulates in fp32; feature C2 = 4, weight tile (N/16, K/16, 16, 16),
    fp32 output C2 = 4 with size_e 3 (notes: encodings/precision-field.md "tf32", HW sweep).
    Operands span more than fp16's range. Regression: precision 7 used to be refused (issue 12)."""
    M, K, N = 8, 64, 32
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((M, K)) * 3e5).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    w, feat, wt = tf32_matmul(template("01_matmul_fp16"), a, b, FEATURE, WEIGHT, OUTPUT)
    mem = {"regcmd": (REGCMD, bytearray(8 * len(w) + 64)), "feature": (FEATURE, bytearray(feat) + bytearray(64)),
           "weight": (WEIGHT, bytearray(wt)), "output": (OUTPUT, bytearray(N // 4 * M * 16))}
    mem["regcmd"][1][:8 * len(w)] = w.tobytes()
    Simulator().run_job(mem, [(REGCMD, len(w))])
    got = np.frombuffer(bytes(mem["output"][1]), np.float32).reshape(N // 4, M, 4).transpose(1, 0, 2).reshape(M, N)
    want = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64).T
    full = a.astype(np.float64) @ b.astype(np.float64).T
    scale = np.abs(tf32(a)).astype(np.float64) @ np.abs(tf32(b)).astype(np.float64).T
    assert np.max(np.abs(got - want) / scale) < 1e-6      # fp32 accumulation of exact products
    assert np.max(np.abs(want - full) / scale) > 1e-5     # the tf32 rounding is visible


def test_int4_matmul():
    """int4 (precision 6): feature [K/32][M][32] and weights (N/64, K/32, 64, 32) nibble-packed,
    int32 accumulation, int16 output [N/8][M][8] with size_e 7, saturating (notes:
    encodings/tile-layouts.md, precision-field.md). K = 64 is two K-groups and N = 128 two N-groups
    (the notes' single-group trap). Regression: precision 6 used to be refused (issue 12)."""
    M, K, N = 8, 64, 128
    rng = np.random.default_rng(6)
    a = rng.integers(-8, 8, size=(M, K))
    b = rng.integers(-8, 8, size=(N, K))
    w, feat, wt = int4_matmul(template("03_matmul_int8"), a, b, FEATURE, WEIGHT, OUTPUT)
    mem = {"regcmd": (REGCMD, bytearray(8 * len(w) + 64)), "feature": (FEATURE, bytearray(feat) + bytearray(4096)),
           "weight": (WEIGHT, bytearray(wt)), "output": (OUTPUT, bytearray(N // 8 * M * 16))}
    mem["regcmd"][1][:8 * len(w)] = w.tobytes()
    Simulator().run_job(mem, [(REGCMD, len(w))])
    got = np.frombuffer(bytes(mem["output"][1]), np.int16).reshape(N // 8, M, 8).transpose(1, 0, 2).reshape(M, N)
    assert np.array_equal(got.astype(np.int64), a @ b.T)
