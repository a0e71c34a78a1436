"""DPU integer path (int8 x int8 -> int32 accumulator): OUT_CVT, BRDMA bias, output types and
the integer hazards (sim B). References are int64 numpy on case 03's blobs."""
from __future__ import annotations

import numpy as np

from test_dpu_helpers import RJ_EHAZARD, RJ_EUNSUPP, blob, cube_to_pc, run_case, set_fields, set_raw

M, K, N = 8, 64, 64


def matmul_03() -> np.ndarray:
    """C = A.B^T in int64 from the case 03 layouts (case.md byte formulas)."""
    a = cube_to_pc(blob("03", "input"), 0, M, K, "int8", M * 16).astype(np.int64)
    w = np.frombuffer(blob("03", "weight"), dtype=np.int8).astype(np.int64)
    n, k = np.meshgrid(np.arange(N), np.arange(K), indexing="ij")
    bt = w[((n // 32) * (K // 32) + k // 32) * 1024 + (n % 32) * 32 + k % 32]
    return a @ bt.T


def out_i32(r) -> np.ndarray:
    return cube_to_pc(r.buf("output"), 0, M, N, "int32", 0x80).astype(np.int64)


def test_case03_int32_output_is_exact():
    r = run_case("03")
    assert r.rc == 0, r.msg
    assert np.array_equal(out_i32(r), matmul_03())


def round_half_even(num: np.ndarray, shift: int) -> np.ndarray:
    """num / 2^shift to the nearest integer, ties to even (exact: float64 holds these values)."""
    return np.round(num.astype(np.float64) / 2.0 ** shift).astype(np.int64)


def round_half_away(num: np.ndarray, shift: int) -> np.ndarray:
    v = num.astype(np.float64) / 2.0 ** shift
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def test_out_cvt_integer_shift_rounds_half_to_even():
    """round((acc * SCALE) >> SHIFT), ties to even with CVT_ROUND = 0 (notes:
    encodings/out-cvt-converter.md "The CVT_ROUND tie rule", HW sweep on RK3588). Regression:
    the simulator used to floor (issue 12)."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=3)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=1)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    prod = matmul_03() * 3
    ties = prod % 2 == 1
    assert ties.sum() >= 50 and (prod[ties] < 0).any()
    assert np.array_equal(out_i32(r), round_half_even(prod, 1))


def test_out_cvt_cvt_round_is_half_away_from_zero():
    def mut(j, t, w):
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=3)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=1, CVT_ROUND=1)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    assert np.array_equal(out_i32(r), round_half_away(matmul_03() * 3, 1))


def test_out_cvt_scale_is_signed_16_bit():
    """SCALE 0x8000 multiplies by -32768 (notes: out-cvt-converter.md, requant_edge_probe)."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=0x8000)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=10)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    assert np.array_equal(out_i32(r), round_half_even(matmul_03() * -32768, 10))


def test_out_cvt_integer_offset_is_added_after_the_shift():
    """OFFSET (signed 32) lands after the rounding shift (notes: out-cvt-converter.md, "the
    offset lands after the rounding shift"). Regression: it used to be refused."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=4)
        return set_raw(w, "DPU_OUT_CVT_OFFSET", (-1234) & 0xFFFFFFFF)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    assert np.array_equal(out_i32(r), round_half_even(matmul_03(), 4) - 1234)


def test_int32_accumulator_as_fp32_output():
    """OUT_PRECISION = fp32 on the int8 path: a plain cast, same C2 = 4 cube, size_e = 7
    (notes: out-cvt-converter.md table)."""
    r = run_case("03", mutate=lambda j, t, w: set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=5))
    assert r.rc == 0, r.msg
    got = cube_to_pc(r.buf("output"), 0, M, N, "float32", 0x80)
    assert np.array_equal(got, matmul_03().astype(np.float32))


def test_brdma_int32_bias_per_channel():
    """BS ALU add of a per-channel int32 vector read by BRDMA (DATA_USE = 1), Mesa's int8 bias
    word (notes: encodings/sdp-stage-precision.md)."""
    bias = (np.arange(N, dtype=np.int64) * 977 - 31000)
    guard = 0x01000000  # case 03's unreferenced 4 KiB guard buffer holds the bias vector

    def patch(mem):
        mem["guard"][1][:4 * N] = bias.astype("<i4").tobytes()

    def mut(j, t, w):
        w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6) | (1 << 4))
        w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
        return set_raw(w, "DPU_RDMA_RDMA_BS_BASE_ADDR", guard)
    r = run_case("03", mutate=mut, patch=patch)
    assert r.rc == 0, r.msg
    assert np.array_equal(out_i32(r), matmul_03() + bias[None, :])


def test_int16_output_saturates():
    """An int16 output of the int32 accumulator saturates (notes: tile-layouts.md, "int4's int16
    output saturates"); C2 = 8."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=1)
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=2)
        return set_raw(w, "DPU_DST_SURF_STRIDE", 0x80)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    got = cube_to_pc(r.buf("output"), 0, M, N, "int16", 0x80).astype(np.int64)
    want = np.clip(matmul_03() * 2, -32768, 32767)
    assert (np.abs(matmul_03() * 2) > 32767).any() and np.array_equal(got, want)


def test_size_e_quirk_is_a_hazard():
    """Integer outputs must use size_e = 7 (notes: encodings/size-e-quirk.md)."""
    mut = lambda j, t, w: set_fields(w, "DPU_BS_OW_CFG", SIZE_E_0=3, SIZE_E_1=3, SIZE_E_2=3)  # noqa: E731
    r = run_case("03", mutate=mut)
    assert r.rc == RJ_EHAZARD and "size_e" in r.msg and "DPU_BS_OW_CFG" in r.msg, r.msg


def test_integer_ew_kacc_is_a_hazard():
    """An EW operand on the int32 accumulator with DPU_RDMA's precision fields at fp16 adds the
    int32 patterns as floats (notes: encodings/k-accumulation.md "Integer EW K-accumulation",
    sdp-stage-precision.md); with integer precision codes it is unmeasured with a conv main feed
    (sdp-stage-precision.md "The EW stage in integer mode" measures it DPU-only) and refused."""
    def mut(j, t, w, fmc=0x00017D40):
        w = set_raw(w, "DPU_EW_CFG", 0x10C202C0)
        w = set_raw(w, "DPU_RDMA_RDMA_ERDMA_CFG", 0x4000000C)
        return set_raw(w, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", fmc)
    r = run_case("03", mutate=mut)
    assert r.rc == RJ_EHAZARD and "as floats" in r.msg, r.msg
    r = run_case("03", mutate=mut, strict=False)
    assert r.rc == RJ_EUNSUPP, r.msg
    int_codes = 0x00017D40 & ~(7 << 15) & ~(7 << 5) | (4 << 15) | (4 << 5)
    r = run_case("03", mutate=lambda j, t, w: mut(j, t, w, int_codes))
    assert r.rc == RJ_EUNSUPP and "unmeasured" in r.msg, r.msg


def int8_out(mut_extra):
    """Case 03 with an int8 output (DATA_FORMAT OUT_PRECISION 0, C2 = 16 cube, surface pitch
    0x80: one surface of 8 x 16 bytes), Mesa's requantizing writer (QD_EN 1)."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=0)
        w = set_fields(w, "CORE_MISC_CFG", QD_EN=1)
        w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=1, SIZE_E_0=1, SIZE_E_1=1, SIZE_E_2=1)
        return mut_extra(w)
    return mut


def out_i8(r) -> np.ndarray:
    return cube_to_pc(r.buf("output"), 0, M, N, "int8", 0x80).astype(np.int64)


def test_int8_requant_output_saturates_after_the_offset():
    """sat8(round(acc * SCALE >> SHIFT) + OFFSET) (notes: out-cvt-converter.md, "With an int8
    output the order is ...", HW sweep at zero points -128..127)."""
    def extra(w):
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=17675)
        w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=22)
        return set_raw(w, "DPU_OUT_CVT_OFFSET", 5)
    r = run_case("03", mutate=int8_out(extra))
    assert r.rc == 0, r.msg
    want = np.clip(round_half_even(matmul_03() * 17675, 22) + 5, -128, 127)
    assert len(np.unique(want)) > 20
    assert np.array_equal(out_i8(r), want)


def a_03() -> np.ndarray:
    return cube_to_pc(blob("03", "input"), 0, M, K, "int8", M * 16).astype(np.int64)


def test_cpend_adds_ow_op_times_the_window_sum():
    """OD_BYPASS = 0 on the int8-output writer: + OW_OP (signed 16) x the window sum of the
    input over every programmed channel, before the BS stage (notes: depthwise-conv.md "DPU_BS_OW_OP
    is the CPEND operand": Sum xp*w + OW_OP*S + A; Mesa's weight-offset correction). Regression:
    it used to be refused (issue 12)."""
    for ow_op in (-37, 90):
        def extra(w, ow_op=ow_op):
            w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=0, SIZE_E_0=1, SIZE_E_1=1, SIZE_E_2=1)
            w = set_raw(w, "DPU_BS_OW_OP", ow_op & 0xFFFF)
            w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1)
            return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=9)
        r = run_case("03", mutate=int8_out(extra))
        assert r.rc == 0, (ow_op, r.msg)
        s = a_03().sum(axis=1, keepdims=True)      # 1x1 kernel: the window is the position
        want = np.clip(round_half_even(matmul_03() + ow_op * s, 9), -128, 127)
        assert not np.array_equal(want, np.clip(round_half_even(matmul_03(), 9), -128, 127))
        assert np.array_equal(out_i8(r), want), ow_op


def test_cpend_on_the_int32_writer_is_a_hazard():
    """On the raw int32 writer, clearing OD_BYPASS "makes every value wrong" (notes:
    depthwise-conv.md): refused in strict mode, unsupported (no documented value) otherwise."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=0, SIZE_E_0=7, SIZE_E_1=7, SIZE_E_2=7)
        return set_raw(w, "DPU_BS_OW_OP", 3)
    r = run_case("03", mutate=mut)
    assert r.rc == RJ_EHAZARD and "CPEND" in r.msg, r.msg
    assert run_case("03", mutate=mut, strict=False).rc == RJ_EUNSUPP


def test_integer_accumulator_as_fp16_output():
    """OUT_PRECISION fp16 with FP32TOFP16_EN on the int8 path: the integer result narrowed to fp16,
    writer size_e 3, C2 = 8 (notes: out-cvt-converter.md, fp16 row: small single-tile shapes,
    |acc| <= 2048). Strict mode keeps to one output surface and the documented range."""
    def mut(j, t, w, n_ch=8):
        w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=2)
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=1, FP32TOFP16_EN=1)
        w = set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=6)
        w = set_fields(w, "DPU_BS_OW_CFG", OD_BYPASS=1, SIZE_E_0=3, SIZE_E_1=3, SIZE_E_2=3)
        return set_raw(w, "DPU_DST_SURF_STRIDE", 0x80)
    r = run_case("03", mutate=mut)
    # 64 channels are 8 fp16 surfaces: beyond the documented single-tile shape
    assert r.rc == RJ_EHAZARD and "fp16 output of an integer accumulator" in r.msg, r.msg
    r = run_case("03", mutate=mut, strict=False)
    assert r.rc == 0, r.msg
    got = cube_to_pc(r.buf("output"), 0, M, N, "float16", 0x80).astype(np.float64)
    want = round_half_even(matmul_03(), 6).astype(np.float16).astype(np.float64)
    assert np.abs(round_half_even(matmul_03(), 6)).max() <= 2048
    assert np.array_equal(got, want)


def test_clip_truncate_rounds_the_accumulator_half_away():
    """CORE_CLIP_TRUNCATE = t: the int32 handed to the DPU is round(acc / 2^t), ties away from
    zero, saturated (NVDLA IAS via Mesa rkt_coefs.c, whose hardware-run programs halve the bias
    with t = 1; the tie rule is NVDLA's cmod). Regression: it used to be refused (issue 12)."""
    for t_ in (1, 3):
        r = run_case("03", mutate=lambda j, t, w, t_=t_: set_fields(w, "CORE_CLIP_TRUNCATE", CLIP_TRUNCATE=t_))
        assert r.rc == 0, r.msg
        acc = matmul_03()
        want = round_half_away(acc, t_)
        assert (acc % (1 << t_) == (1 << (t_ - 1))).any()   # ties exist
        assert np.array_equal(out_i32(r), want), t_


def test_clip_truncate_round_type_is_refused():
    r = run_case("03", mutate=lambda j, t, w: set_fields(w, "CORE_CLIP_TRUNCATE", CLIP_TRUNCATE=1, ROUND_TYPE=1))
    assert r.rc == RJ_EUNSUPP and "ROUND_TYPE" in r.msg, r.msg


def test_bs_stage_adds_then_multiplies_with_a_sign_split_rounding_shift():
    """Integer BS with ALU and MUL: v = sat32(rne(((acc + A) * C) >> s)), s = MUL_SHIFT_VALUE for a
    non-negative product and DATA_FORMAT.BS_MUL_SHIFT_VALUE_NEG for a negative one (notes:
    out-cvt-converter.md "Per-channel requant on the BS multiplier": add before multiply, wide
    product, half-to-even shift, the two shift fields split by sign; HW sweep). The register
    operand C stands in for the per-channel one (an inference). Regression: the BS ALU+MUL was
    refused, the shift floored and the _NEG field refused (issue 12)."""
    bias = (np.arange(N, dtype=np.int64) * 977 - 31000)
    guard = 0x01000000

    def patch(mem):
        mem["guard"][1][:4 * N] = bias.astype("<i4").tobytes()

    for s_pos, s_neg, mul in ((6, 3, 5), (5, 5, 77)):
        def mut(j, t, w, s_pos=s_pos, s_neg=s_neg, mul=mul):
            w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 6))   # ALU (from BRDMA) + MUL, no ReLU
            w = set_fields(w, "DPU_BS_MUL_CFG", BS_MUL_OPERAND=mul, BS_MUL_SHIFT_VALUE=s_pos)
            w = set_fields(w, "DPU_DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=s_neg)
            w = set_fields(w, "DPU_RDMA_RDMA_BRDMA_CFG", BRDMA_DATA_USE=1)
            return set_raw(w, "DPU_RDMA_RDMA_BS_BASE_ADDR", guard)
        r = run_case("03", mutate=mut, patch=patch)
        assert r.rc == 0, r.msg
        p = (matmul_03() + bias[None, :]) * mul
        want = np.where(p >= 0, round_half_even(p, s_pos), round_half_even(p, s_neg))
        assert (p < 0).any() and (p > 0).any()
        assert np.array_equal(out_i32(r), np.clip(want, -2 ** 31, 2 ** 31 - 1)), (s_pos, s_neg)
