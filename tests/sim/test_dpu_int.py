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


def test_out_cvt_integer_scale_and_floor_shift():
    """(acc * SCALE) >> SHIFT, arithmetic shift rounding toward -inf (notes:
    encodings/out-cvt-converter.md)."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_OUT_CVT_SCALE", OUT_CVT_SCALE=3)
        return set_fields(w, "DPU_OUT_CVT_SHIFT", OUT_CVT_SHIFT=5)
    r = run_case("03", mutate=mut)
    assert r.rc == 0, r.msg
    want = np.right_shift(matmul_03() * 3, 5)  # numpy >> on int64 is arithmetic (floor)
    assert (matmul_03() < 0).any() and np.array_equal(out_i32(r), want)


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
    """Integer EW K-accumulation is dead on hardware: the EW ALU is float-only
    (notes: encodings/k-accumulation.md)."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_EW_CFG", 0x10C202C0)
        w = set_raw(w, "DPU_RDMA_RDMA_ERDMA_CFG", 0x4000000C)
        return set_raw(w, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", 0x00017D40 & ~(7 << 15) & ~(7 << 5))
    r = run_case("03", mutate=mut)
    assert r.rc == RJ_EHAZARD and "float-only" in r.msg, r.msg
    r = run_case("03", mutate=mut, strict=False)
    assert r.rc == RJ_EUNSUPP, r.msg


def test_integer_out_cvt_offset_is_refused():
    r = run_case("03", mutate=lambda j, t, w: set_raw(w, "DPU_OUT_CVT_OFFSET", 5))
    assert r.rc == RJ_EUNSUPP and "DPU_OUT_CVT_OFFSET" in r.msg, r.msg
