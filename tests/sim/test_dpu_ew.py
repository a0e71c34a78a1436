"""DPU float path: EW operand ops, BS/BN stages, fp32 output, and the DPU hazards (sim B).

Programs are conformance programs with some fields changed; every reference is numpy on the
case's own input blobs (layouts from the case.md byte formulas)."""
from __future__ import annotations

import numpy as np
import pytest

from test_dpu_helpers import (RJ_EHAZARD, RJ_EUNSUPP, blob, cube_to_pc, f16_bits, f32_bits, get_raw,
                              run_case, set_fields, set_raw)

M, N = 16, 32  # case 06: out[m, n] = A[m, n] * B[m, n] (identity conv of A, EW op with B)


def operands_06():
    a = cube_to_pc(blob("06", "input"), 0, M, N, "float16", 0x100)   # A as [K/8][M][8], K = N
    b = cube_to_pc(blob("06", "operand"), 0, M, N, "float16", 0x100)
    return a.astype(np.float32), b.astype(np.float32)


def out_06(r, dtype="float16", stride=0x100):
    return cube_to_pc(r.buf("output"), 0, M, N, dtype, stride)


def test_case06_unmodified_is_exact():
    r = run_case("06")
    assert r.rc == 0, r.msg
    assert r.output() == open("/work/shared/conformance/06_ew_mul_fp16/expected_output.bin", "rb").read()
    a, b = operands_06()
    assert np.array_equal(out_06(r).view(np.uint16), (a * b).astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("algo,ref", [(0, np.maximum), (1, np.minimum), (2, np.add)])
def test_ew_alu_max_min_add(algo, ref):
    """EW_OP_TYPE = 0 with EW_ALU_ALGO 0/1/2 = MAX/MIN/SUM (notes: dpu-lut-activation.md
    "Max / Min": 0x108002C0 / 0x108102C0 / 0x108202C0)."""
    word = {0: 0x108002C0, 1: 0x108102C0, 2: 0x108202C0}[algo]
    r = run_case("06", mutate=lambda j, t, w: set_raw(w, "DPU_EW_CFG", word))
    assert r.rc == 0, r.msg
    a, b = operands_06()
    want = ref(a, b).astype(np.float16)
    assert np.array_equal(out_06(r).view(np.uint16), want.view(np.uint16))


def test_ew_mul_fp32_output():
    """fp32 output (OUT_PRECISION 5, FP32TOFP16_EN 0): a C2 = 4 cube, 16 B per position
    (notes: tile-layouts.md); the fp16 x fp16 product is exact in fp32."""
    def mut(j, t, w):
        w = set_fields(w, "DPU_DATA_FORMAT", OUT_PRECISION=5)
        w = set_fields(w, "DPU_OUT_CVT_SCALE", FP32TOFP16_EN=0)
        return set_fields(w, "DPU_BS_OW_CFG", SIZE_E_0=3, SIZE_E_1=3, SIZE_E_2=3)
    r = run_case("06", mutate=mut)
    assert r.rc == 0, r.msg
    a, b = operands_06()
    got = out_06(r, "float32", 0x100)
    assert np.array_equal(got.view(np.uint32), (a * b).view(np.uint32))


def matmul_01():
    a = cube_to_pc(blob("01", "input"), 0, 8, 64, "float16", 8 * 16).astype(np.float64)
    w = np.frombuffer(blob("01", "weight"), dtype=np.float16).astype(np.float64)
    n, k = np.meshgrid(np.arange(32), np.arange(64), indexing="ij")
    bt = w[((n // 16) * 2 + k // 32) * 512 + (n % 16) * 32 + k % 32]   # [N, K], case 01 formula
    return a @ bt.T                                                     # [M=8, N=32]


def test_bn_scale_bias_relu_on_conv():
    """BN stage on a conv result: x*MUL (fp16 operand) then + ALU (fp32 operand), then ReLU
    (notes: dpu-lut-activation.md "index = x*BN_MUL + BN_ALU (MUL then ALU)")."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_BN_CFG", (2 << 16))  # ALU_ALGO=2 (sum), nothing bypassed
        w = set_fields(w, "DPU_BN_MUL_CFG", BN_MUL_OPERAND=f16_bits(0.5))
        return set_raw(w, "DPU_BN_ALU_CFG", f32_bits(-300.0))
    r = run_case("01", mutate=mut)
    assert r.rc == 0, r.msg
    want = np.maximum(matmul_01() * 0.5 - 300.0, 0.0).astype(np.float16)
    got = cube_to_pc(r.buf("output"), 0, 8, 32, "float16", 0x80)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_bs_register_bias_and_relu():
    """BS ALU with a register operand (fp32 pattern) and the BS ReLU."""
    def mut(j, t, w):
        w = set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 4))  # ALU sum, MUL bypassed, ReLU on
        return set_raw(w, "DPU_BS_ALU_CFG", f32_bits(-700.25))
    r = run_case("01", mutate=mut)
    assert r.rc == 0, r.msg
    want = np.maximum(matmul_01() - 700.25, 0.0).astype(np.float32).astype(np.float16)
    got = cube_to_pc(r.buf("output"), 0, 8, 32, "float16", 0x80)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_float_path_memory_bias_is_refused():
    """A per-channel operand from memory on the float path has no documented layout."""
    r = run_case("01", mutate=lambda j, t, w: set_raw(w, "DPU_BS_CFG", (2 << 16) | (1 << 8) | (1 << 4) | (1 << 6)))
    assert r.rc == RJ_EUNSUPP and "DPU_BS_CFG" in r.msg and "ALU_SRC" in r.msg, r.msg


def test_stats_count_dpu_traffic():
    r = run_case("06")
    assert r.rc == 0, r.msg
    # the operand cube (4 surfaces x 16 positions x 16 B) is read; the output cube is written
    assert r.stats["bytes_read"] >= 4 * M * 16
    assert r.stats["bytes_written"] >= 4 * M * 16


# ---- hazards -----------------------------------------------------------------------------------

def test_quirk3_max_width_is_a_hazard():
    r = run_case("06", mutate=lambda j, t, w: set_fields(w, "DPU_DATA_CUBE_WIDTH", WIDTH=8190))
    assert r.rc == RJ_EHAZARD, r.msg
    assert "QUIRK 3" in r.msg and "DPU_DATA_CUBE_WIDTH" in r.msg and "job 0 task 0" in r.msg


def test_ew_stride_zero_is_a_hazard_and_broadcasts_when_lenient():
    """SURF_NOTCH / EW_SURF_STRIDE = 0: the ERDMA never advances and broadcasts the first atom
    (notes: k-accumulation.md)."""
    def mut(j, t, w):
        return set_raw(set_raw(w, "DPU_RDMA_RDMA_EW_SURF_STRIDE", 0), "DPU_RDMA_RDMA_SURF_NOTCH", 0)
    r = run_case("06", mutate=mut)
    assert r.rc == RJ_EHAZARD and "never advances" in r.msg, r.msg
    r = run_case("06", mutate=mut, strict=False)
    assert r.rc == 0, r.msg
    a, b = operands_06()
    atom0 = b[0, :8]
    want = (a * np.tile(atom0, 4)[None, :]).astype(np.float16)
    assert np.array_equal(out_06(r).view(np.uint16), want.view(np.uint16))


def test_eltwise_without_comb_use_is_the_mrdma_trap():
    """ERDMA armed while MRDMA is disabled (the plain-conv FEATURE_MODE_CFG): the job hangs
    (notes: mrdma-trap.md, corollary)."""
    r = run_case("06", mutate=lambda j, t, w: set_raw(w, "DPU_RDMA_RDMA_FEATURE_MODE_CFG", 0x7818))
    assert r.rc == RJ_EHAZARD and "MRDMA trap" in r.msg, r.msg


def test_ew_operand_geometry_outside_the_verified_one_is_refused():
    def mut(j, t, w):
        return set_raw(w, "DPU_RDMA_RDMA_EW_BASE_ADDR", get_raw(w, "DPU_RDMA_RDMA_EW_BASE_ADDR") + 0x40)
    r = run_case("06", mutate=mut)
    assert r.rc == RJ_EUNSUPP and "EW_BASE" in r.msg, r.msg


def test_kacc_case02_partials_accumulate_in_ew():
    """Conformance 02 (fp16 K-accumulation through EW add, 3 jobs) stays exact."""
    r = run_case("02")
    assert r.rc == 0, r.msg
    assert r.output() == open("/work/shared/conformance/02_matmul_fp16_kacc/expected_output.bin", "rb").read()
