"""Cube layouts: pack/unpack round trips (hypothesis), an element-by-element check against the
byte formulas the conformance case.md files state, and byte equality with the conformance
buffers as the cases' own reference.py reads them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rockjit.ir.types import DType
from rockjit.lowering.layouts import (CubeLayout, DepthwiseWeightLayout, LayoutError, WeightLayout,
                                      depthwise_weight_layout, feature_layout,
                                      matrix_feature_layout, matrix_output_layout, output_layout,
                                      pack_matrix, unpack_matrix, weight_layout)
from rockjit.lowering.profile import get_profile

from lowering_testutil import blob, expected_output, reference

P = get_profile("rk3588")
DTYPES = [np.float16, np.int8, np.float32, np.int32]


def _random(shape: tuple[int, ...], dtype: np.dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


# -- round trips and padding ----------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 9), w=st.integers(1, 5), c=st.integers(1, 70),
       dt=st.sampled_from(DTYPES), extra_line=st.integers(0, 2), extra_surf=st.integers(0, 3),
       seed=st.integers(0, 2**31))
def test_cube_round_trip_and_zero_padding(h, w, c, dt, extra_line, extra_surf, seed) -> None:
    e = np.dtype(dt).itemsize
    c2 = 16 // e
    line = (w + extra_line) * 16
    lay = CubeLayout(h, w, c, c2, dt, line_stride=line, surf_stride=h * line + extra_surf * 16)
    x = _random((h, w, c), dt, seed)
    raw = lay.pack(x)
    assert raw.dtype == np.uint8 and raw.size == lay.nbytes
    assert np.array_equal(lay.unpack(raw), x)
    # the byte formula of tile-layouts.md / the case.md files, element by element
    raw_again = np.zeros_like(raw)
    xb = x.astype(x.dtype.newbyteorder("<")).view(np.uint8).reshape(h, w, c, e)
    for hh in range(h):
        for ww in range(w):
            for cc in range(c):
                o = (cc // c2) * lay.surf_stride + hh * line + ww * 16 + (cc % c2) * e
                raw_again[o:o + e] = xb[hh, ww, cc]
    assert np.array_equal(raw, raw_again), "padding channels and gaps must be zero, data in place"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70), k=st.integers(1, 80), kh=st.integers(1, 3), kw=st.integers(1, 3),
       dt=st.sampled_from([DType.F16, DType.I8]), seed=st.integers(0, 2**31))
def test_weight_round_trip_and_zero_padding(n, k, kh, kw, dt, seed) -> None:
    lay = weight_layout(P, dt, n, k, kh, kw)
    w = _random((n, k, kh, kw), dt.to_numpy(), seed)
    raw = lay.pack(w)
    assert raw.size == lay.nbytes
    assert np.array_equal(lay.unpack(raw), w)
    ng, kg, e = lay.n_group, lay.k_group, lay.dtype.itemsize
    kb = lay.padded_channels // kg
    ref = np.zeros_like(raw)
    wb = w.view(np.uint8).reshape(n, k, kh, kw, e)
    for nn in range(n):
        for kk in range(k):
            for y in range(kh):
                for x in range(kw):
                    blk = (((nn // ng) * kb + kk // kg) * kh + y) * kw + x
                    o = (blk * ng * kg + (nn % ng) * kg + kk % kg) * e
                    ref[o:o + e] = wb[nn, kk, y, x]
    assert np.array_equal(raw, ref)


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 130), kh=st.integers(1, 5), kw=st.integers(1, 5),
       dt=st.sampled_from([DType.F16, DType.I8]), seed=st.integers(0, 2**31))
def test_depthwise_weight_round_trip(c, kh, kw, dt, seed) -> None:
    lay = depthwise_weight_layout(P, dt, c, kh, kw)
    w = _random((c, kh, kw), dt.to_numpy(), seed)
    raw = lay.pack(w)
    assert np.array_equal(lay.unpack(raw), w)
    g = lay.group
    vals = raw.view(lay.dtype).reshape(-1)
    for cc in range(c):
        for y in range(kh):
            for x in range(kw):
                assert vals[(((cc // g) * kh + y) * kw + x) * g + cc % g] == w[cc, y, x]
    assert np.count_nonzero(vals) == np.count_nonzero(w)


def test_profile_atoms_are_16_bytes() -> None:
    for dt, p in P.precisions.items():
        assert p.feature_c2 * p.esize == P.atom_bytes, dt
        for o in p.outputs.values():
            assert o.c2 * o.esize == P.atom_bytes


def test_layout_errors_speak() -> None:
    lay = matrix_feature_layout(P, DType.F16, 4, 32)
    with pytest.raises(LayoutError, match=r"shape \(4, 1, 32\)"):
        lay.pack(np.zeros((4, 1, 33), np.float16))
    with pytest.raises(LayoutError, match="cast before packing"):
        lay.pack(np.zeros((4, 1, 32), np.float32))
    with pytest.raises(LayoutError, match="holds 10 bytes"):
        lay.unpack(b"\0" * 10)


# -- conformance data -----------------------------------------------------------------------------

def _check_pack(raw: bytes, ours: np.ndarray, what: str) -> None:
    buf = np.frombuffer(raw, np.uint8)
    assert ours.size <= buf.size, what
    assert np.array_equal(buf[:ours.size], ours), f"{what}: our pack differs from the buffer"
    assert not buf[ours.size:].any(), f"{what}: the buffer holds data past our layout's extent"


def test_case01_matmul_fp16() -> None:
    r = reference("01")
    a_raw, w_raw = blob("01", "input"), blob("01", "weight")
    A = r.unpack_feature(np.frombuffer(a_raw, np.float16), r.M, r.K)
    B = r.unpack_weight(np.frombuffer(w_raw, np.float16), r.N, r.K)
    _check_pack(a_raw, pack_matrix(matrix_feature_layout(P, DType.F16, r.M, r.K), A), "input")
    _check_pack(w_raw, weight_layout(P, DType.F16, r.N, r.K).pack(B), "weight")
    out = matrix_output_layout(P, DType.F16, DType.F16, r.M, r.N)
    exp = expected_output("01")
    assert np.array_equal(unpack_matrix(out, exp),
                          r.unpack_feature(np.frombuffer(exp, np.float16), r.M, r.N))
    assert out.surf_stride == 0x80  # DPU_DST_SURF_STRIDE of the program (case.md)


def test_case02_tiled_slots() -> None:
    r = reference("02")
    a_raw, w_raw = blob("02", "input_tiles"), blob("02", "weight_tiles")
    A = r.unpack_inputs(np.frombuffer(a_raw, np.float16))
    B = r.unpack_weights(np.frombuffer(w_raw, np.float16))
    fl = matrix_feature_layout(P, DType.F16, r.Mt, r.Kt)
    wl = weight_layout(P, DType.F16, r.Nt, r.Kt)
    a_ours = np.concatenate([pack_matrix(fl, A[:, ki * r.Kt:(ki + 1) * r.Kt]) for ki in range(r.nKt)])
    w_ours = np.concatenate([wl.pack(B[ni * r.Nt:(ni + 1) * r.Nt, ki * r.Kt:(ki + 1) * r.Kt])
                             for ni in range(r.nNt) for ki in range(r.nKt)])
    _check_pack(a_raw, a_ours, "input_tiles")
    _check_pack(w_raw, w_ours, "weight_tiles")
    ol = matrix_output_layout(P, DType.F16, DType.F16, r.Mt, r.Nt)
    exp = np.frombuffer(expected_output("02"), np.uint8)
    ours = np.concatenate([unpack_matrix(ol, exp[ni * ol.nbytes:(ni + 1) * ol.nbytes])
                           for ni in range(r.nNt)], axis=1)
    assert np.array_equal(ours, r.unpack_output(exp.view(np.float16)))


def test_case03_matmul_int8_int32() -> None:
    r = reference("03")
    a_raw, w_raw = blob("03", "input"), blob("03", "weight")
    A = r.unpack_cube(np.frombuffer(a_raw, np.int8), r.M, r.K, 16)
    B = r.unpack_weight(np.frombuffer(w_raw, np.int8), r.N, r.K)
    _check_pack(a_raw, pack_matrix(matrix_feature_layout(P, DType.I8, r.M, r.K), A), "input")
    _check_pack(w_raw, weight_layout(P, DType.I8, r.N, r.K).pack(B), "weight")
    out = matrix_output_layout(P, DType.I8, DType.I32, r.M, r.N)
    exp = expected_output("03")
    assert np.array_equal(unpack_matrix(out, exp),
                          r.unpack_cube(np.frombuffer(exp, "<i4"), r.M, r.N, 4))
    assert out.surf_stride == 0x80


def _chw(layout_unpacked: np.ndarray) -> np.ndarray:
    return layout_unpacked.transpose(2, 0, 1)  # [H, W, C] -> [C, H, W]


def _check_input_cube(prefix: str, r, c: int, h: int, w: int) -> None:
    """The case's fp16 input cube, unpacked by its reference, packs back to its blob."""
    raw = blob(prefix, "input")
    x = r.unpack_cube(np.frombuffer(raw, np.float16), c, h, w)
    fl = feature_layout(P, DType.F16, h, w, c)
    _check_pack(raw, fl.pack(np.ascontiguousarray(x.transpose(1, 2, 0))), "input")


def _check_output_cube(prefix: str, r, c: int, oh: int, ow: int):
    """Our output layout unpacks the case's expected output as its reference does."""
    ol = output_layout(P, DType.F16, DType.F16, oh, ow, c)
    exp = expected_output(prefix)
    assert np.array_equal(_chw(ol.unpack(exp)), r.unpack_cube(np.frombuffer(exp, np.float16), c, oh, ow))
    return ol


def test_case04_conv_fp16() -> None:
    r = reference("04")
    _check_input_cube("04", r, r.IC, r.H, r.W)
    w_raw = blob("04", "weight")
    w = r.unpack_weight(np.frombuffer(w_raw, np.float16))
    _check_pack(w_raw, weight_layout(P, DType.F16, r.OC, r.IC, r.KH, r.KW).pack(w), "weight")
    ol = _check_output_cube("04", r, r.OC, r.OH, r.OW)
    assert ol.surf_stride == 0x1e0  # DPU_DST_SURF_STRIDE (case.md)


def test_case05_flat_vector_cube() -> None:
    r = reference("05")
    raw = blob("05", "input")
    x = np.frombuffer(raw, np.float16)[:r.N]
    lay = feature_layout(P, DType.F16, 1, r.N // 8, 8)  # 16 positions x 8 channels, height 1
    _check_pack(raw, lay.pack(x.reshape(1, r.N // 8, 8)), "input")
    exp = expected_output("05")
    assert np.array_equal(lay.unpack(exp).reshape(-1), np.frombuffer(exp, np.float16))


def test_case06_ew_operand_is_an_output_cube() -> None:
    r = reference("06")
    a_raw, w_raw, b_raw = blob("06", "input"), blob("06", "weight"), blob("06", "operand")
    A = r.unpack_cube(np.frombuffer(a_raw, np.float16), r.M, r.K)
    W = r.unpack_weight(np.frombuffer(w_raw, np.float16), r.N, r.K)
    B = r.unpack_cube(np.frombuffer(b_raw, np.float16), r.M, r.N)
    _check_pack(a_raw, pack_matrix(matrix_feature_layout(P, DType.F16, r.M, r.K), A), "input")
    _check_pack(w_raw, weight_layout(P, DType.F16, r.N, r.K).pack(W), "weight")
    ol = matrix_output_layout(P, DType.F16, DType.F16, r.M, r.N)
    _check_pack(b_raw, pack_matrix(ol, B), "operand")
    exp = expected_output("06")
    assert np.array_equal(unpack_matrix(ol, exp), r.unpack_cube(np.frombuffer(exp, np.float16), r.M, r.N))


@pytest.mark.parametrize("prefix", ["07", "08"])
def test_case07_08_pool_cubes(prefix: str) -> None:
    r = reference(prefix)
    _check_input_cube(prefix, r, r.C, r.H, r.W)
    _check_output_cube(prefix, r, r.C, r.OH, r.OW)


def test_case09_depthwise() -> None:
    r = reference("09")
    _check_input_cube("09", r, r.C, r.H, r.W)
    w_raw = blob("09", "weight")
    w = r.unpack_weight(np.frombuffer(w_raw, np.float16))
    dl = depthwise_weight_layout(P, DType.F16, r.C, r.KH, r.KW)
    assert dl.group == r.G
    _check_pack(w_raw, dl.pack(w), "weight")
    ol = _check_output_cube("09", r, r.C, r.OH, r.OW)
    assert ol.surf_stride == 0x180


def test_wrong_group_does_not_reproduce_case09() -> None:
    # the check above must be able to fail: the int8 group (64) packs the same weights differently
    r = reference("09")
    w_raw = blob("09", "weight")
    w = r.unpack_weight(np.frombuffer(w_raw, np.float16))
    wrong = DepthwiseWeightLayout(r.C, r.KH, r.KW, 64, np.float16).pack(w)
    assert not np.array_equal(np.frombuffer(w_raw, np.uint8)[:wrong.size], wrong)
    assert isinstance(WeightLayout(1, 1, 1, 1, 16, 32, np.float16), WeightLayout)
