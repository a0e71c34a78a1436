"""PPU + PPU_RDMA pooling (sim B): conformance 07/08 and programs derived from them (other
kernels/strides, min, padding), checked against numpy pooling of the case's input blob."""
from __future__ import annotations

import numpy as np

from test_dpu_helpers import (RJ_EHAZARD, RJ_EUNSUPP, blob, cube_to_pc, f16_bits, run_case, set_fields,
                              set_raw)


def input_chw(prefix: str, c: int, h: int, w: int) -> np.ndarray:
    x = cube_to_pc(blob(prefix, "input"), 0, h * w, c, "float16", h * w * 16)
    return x.astype(np.float64).T.reshape(c, h, w)


def output_chw(r, c: int, oh: int, ow: int, surf: int) -> np.ndarray:
    y = cube_to_pc(r.buf("output"), 0, oh * ow, c, "float16", surf)
    return y.astype(np.float64).T.reshape(c, oh, ow)


def pool_ref(x, kh, kw, sy, sx, oh, ow, op, pad=(0, 0, 0, 0), pad_value=0.0):
    c, h, w = x.shape
    pl, pt, pr, pb = pad
    xp = np.full((c, h + pt + pb, w + pl + pr), pad_value)
    xp[:, pt:pt + h, pl:pl + w] = x
    out = np.empty((c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            out[:, oy, ox] = op(xp[:, oy * sy:oy * sy + kh, ox * sx:ox * sx + kw], axis=(1, 2))
    return out


def geometry(w, *, kh, kw, sy, sx, ow, oh, method, c=24, recip=(0, 0), pad=(0, 0, 0, 0), pad_value=0):
    w = set_fields(w, "PPU_POOLING_KERNEL_CFG", KERNEL_WIDTH=kw - 1, KERNEL_HEIGHT=kh - 1,
                   KERNEL_STRIDE_WIDTH=sx - 1, KERNEL_STRIDE_HEIGHT=sy - 1)
    w = set_fields(w, "PPU_DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=ow - 1)
    w = set_fields(w, "PPU_DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=oh - 1)
    w = set_fields(w, "PPU_OPERATION_MODE_CFG", POOLING_METHOD=method)
    w = set_raw(w, "PPU_DST_SURF_STRIDE", oh * ow * 16)
    w = set_raw(w, "PPU_RECIP_KERNEL_WIDTH", recip[0])
    w = set_raw(w, "PPU_RECIP_KERNEL_HEIGHT", recip[1])
    pl, pt, pr, pb = pad
    w = set_fields(w, "PPU_POOLING_PADDING_CFG", PAD_LEFT=pl, PAD_TOP=pt, PAD_RIGHT=pr, PAD_BOTTOM=pb)
    return set_raw(w, "PPU_PADDING_VALUE_1_CFG", pad_value)


def recip(k: int) -> int:
    """fp16(65536 / k), the per-axis average reciprocal (notes: encodings/ppu-pooling.md)."""
    return f16_bits(65536.0 / k)


def test_case07_max_exact():
    r = run_case("07")
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 3, 3, 2, 2, 4, 5, np.max)
    assert np.array_equal(output_chw(r, 24, 4, 5, 0x140), want)
    assert r.stats["bytes_read"] >= 3 * 1920 - 1 and r.stats["bytes_written"] == 3 * 4 * 5 * 16


def test_case08_avg_within_tolerance_and_reciprocal_rounding():
    r = run_case("08")
    assert r.rc == 0, r.msg
    x = input_chw("08", 8, 6, 6)
    got = output_chw(r, 8, 4, 4, 0x100)
    assert np.max(np.abs(got - pool_ref(x, 3, 3, 1, 1, 4, 4, np.mean))) <= 0.01
    # the hardware multiplies by the fp16 reciprocals: sum * 21840^2 / 2^32, one fp16 rounding
    want = (pool_ref(x, 3, 3, 1, 1, 4, 4, np.sum) * 21840.0 ** 2 / 2 ** 32).astype(np.float16)
    assert np.array_equal(got, want.astype(np.float64))


def test_avg_2x2_stride2_is_exact():
    """k = 2: the reciprocal 0x7800 = 32768 makes the average an exact /4."""
    mut = lambda j, t, w: geometry(w, kh=2, kw=2, sy=2, sx=2, ow=6, oh=5, method=0,  # noqa: E731
                                   recip=(recip(2), recip(2)))
    assert recip(2) == 0x7800
    r = run_case("07", mutate=mut)
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 2, 2, 2, 2, 5, 6, np.mean).astype(np.float16)
    assert np.array_equal(output_chw(r, 24, 5, 6, 5 * 6 * 16), want.astype(np.float64))


def test_avg_asymmetric_kernel_and_stride():
    """3 tall x 2 wide kernel, stride 1 x 2, per-axis reciprocals."""
    mut = lambda j, t, w: geometry(w, kh=3, kw=2, sy=1, sx=2, ow=6, oh=8, method=0,  # noqa: E731
                                   recip=(recip(2), recip(3)))
    r = run_case("07", mutate=mut)
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 3, 2, 1, 2, 8, 6, np.mean)
    assert np.max(np.abs(output_chw(r, 24, 8, 6, 8 * 6 * 16) - want)) <= 0.01


def test_min_pool_exact():
    """POOLING_METHOD = 2 is MIN (notes: ppu-reduce-mean.md)."""
    mut = lambda j, t, w: geometry(w, kh=3, kw=3, sy=2, sx=2, ow=5, oh=4, method=2)  # noqa: E731
    r = run_case("07", mutate=mut)
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 3, 3, 2, 2, 4, 5, np.min)
    assert np.array_equal(output_chw(r, 24, 4, 5, 0x140), want)


def test_padded_max_uses_minus_inf_fill():
    """Max with padding 1 on every side and the -inf pad fill 0xFC00 (notes: ppu-pooling.md)."""
    mut = lambda j, t, w: geometry(w, kh=3, kw=3, sy=2, sx=2, ow=6, oh=5, method=1,  # noqa: E731
                                   pad=(1, 1, 1, 1), pad_value=0xFC00)
    r = run_case("07", mutate=mut)
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 3, 3, 2, 2, 5, 6, np.max, (1, 1, 1, 1), -np.inf)
    assert np.array_equal(output_chw(r, 24, 5, 6, 5 * 6 * 16), want)


def test_padded_avg_counts_the_pad():
    """Average divides by KH*KW including padded positions (count-include-pad; ppu-pooling.md)."""
    mut = lambda j, t, w: geometry(w, kh=3, kw=3, sy=1, sx=1, ow=12, oh=10, method=0,  # noqa: E731
                                   recip=(recip(3), recip(3)), pad=(1, 1, 1, 1))
    r = run_case("07", mutate=mut)
    assert r.rc == 0, r.msg
    want = pool_ref(input_chw("07", 24, 10, 12), 3, 3, 1, 1, 10, 12, np.sum, (1, 1, 1, 1)) / 9
    assert np.max(np.abs(output_chw(r, 24, 10, 12, 10 * 12 * 16) - want)) <= 0.01


def test_int8_pooling_is_a_hazard():
    """The PPU has no int8 mode: it reads int8 bytes as fp16 (notes: ppu-pooling.md)."""
    r = run_case("07", mutate=lambda j, t, w: set_fields(w, "PPU_DATA_FORMAT", PROC_PRECISION=0))
    assert r.rc == RJ_EHAZARD and "PPU_DATA_FORMAT" in r.msg and "int8" in r.msg, r.msg


def test_window_past_the_input_is_refused():
    r = run_case("07", mutate=lambda j, t, w: set_fields(w, "PPU_DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=5))
    assert r.rc == RJ_EUNSUPP and "padded" in r.msg, r.msg


def test_avg_reciprocal_of_one_is_refused():
    """k = 1 cannot be expressed: 65536 overflows fp16 (notes: ppu-pooling.md)."""
    r = run_case("08", mutate=lambda j, t, w: set_raw(w, "PPU_RECIP_KERNEL_WIDTH", 0x7C00))
    assert r.rc == RJ_EUNSUPP and "PPU_RECIP_KERNEL_WIDTH" in r.msg, r.msg


def test_dpu_flyin_is_refused():
    r = run_case("08", mutate=lambda j, t, w: set_fields(w, "PPU_DATA_FORMAT", DPU_FLYIN=1))
    assert r.rc == RJ_EUNSUPP and "DPU_FLYIN" in r.msg, r.msg
