"""The C layout twin (csrc/layout) agrees byte for byte with layouts.py, both directions."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rockjit.lowering.layouts import CubeLayout, DepthwiseWeightLayout, WeightLayout

try:
    from rockjit._rjc import ffi, lib
    _MISSING = "" if hasattr(lib, "rj_cube_pack") else (
        "rockjit._rjc predates csrc/layout; rebuild with pip install -e . --no-build-isolation")
except ImportError as exc:  # the C core is rebuilt by others concurrently
    ffi = lib = None
    _MISSING = f"C core not built yet ({exc})"

pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING or "C core available")

ESIZE_DTYPE = {1: np.int8, 2: np.float16, 4: np.float32}


def _err():
    return ffi.new("rj_err *")


def _random(shape, dtype, seed):
    # arbitrary bit patterns: the copy must not care what the bytes mean
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return rng.integers(0, 256, n, dtype=np.uint8).view(dtype).reshape(shape)


# outputs are compared as bytes: random bit patterns include NaNs, which never compare equal


def _call(fn, layout, src: np.ndarray, dst_size: int) -> np.ndarray:
    src = np.ascontiguousarray(src)
    dst = np.full(dst_size, 0xA5, np.uint8)   # sentinel: pack must zero what it does not fill
    err = _err()
    rc = fn(layout, ffi.from_buffer(src), src.nbytes, ffi.from_buffer(dst), dst.nbytes, err)
    assert rc == 0, ffi.string(err.msg).decode()
    return dst


@settings(max_examples=80, deadline=None)
@given(h=st.integers(1, 9), w=st.integers(1, 6), c=st.integers(1, 70),
       esize=st.sampled_from([1, 2, 4]), extra_line=st.integers(0, 2),
       extra_surf=st.integers(0, 3), seed=st.integers(0, 2**31))
def test_cube_c_matches_numpy(h, w, c, esize, extra_line, extra_surf, seed) -> None:
    dt = ESIZE_DTYPE[esize]
    c2 = 16 // esize
    line = (w + extra_line) * 16 if extra_line else 0
    surf = (h * (line or w * 16) + extra_surf * 16) if extra_surf else 0
    py = CubeLayout(h, w, c, c2, dt, line_stride=line, surf_stride=surf)
    cl = ffi.new("rj_cube_layout *", dict(height=h, width=w, channels=c, c2=c2, esize=esize,
                                          line_stride=line, surf_stride=surf))
    n = ffi.new("uint64_t *")
    assert lib.rj_cube_bytes(cl, n, _err()) == 0 and n[0] == py.nbytes
    x = _random((h, w, c), dt, seed)
    packed = _call(lib.rj_cube_pack, cl, x, py.nbytes)
    assert np.array_equal(packed, py.pack(x))
    back = _call(lib.rj_cube_unpack, cl, packed, x.nbytes)
    assert np.array_equal(back, py.unpack(packed).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("h,w,c,parts", [(150, 1, 40, 1), (150, 1, 40, 4), (70, 3, 24, 2),
                                         (300, 1, 512, 3), (9, 40, 100, 1)])
def test_cube_blocks_of_many_lines_match_numpy(h, w, c, parts) -> None:
    """Heights past one block of lines (a block spans up to 64 lines, 64 KiB of rows), with a
    partial last block, whole and split into parts; both directions byte-exact."""
    py = CubeLayout(h, w, c, 8, np.float16)
    cl = ffi.new("rj_cube_layout *", dict(height=h, width=w, channels=c, c2=8, esize=2))
    x = _random((h, w, c), np.float16, h * 1000 + c)
    packed = np.full(py.nbytes, 0xA5, np.uint8)
    back = np.full(x.nbytes, 0xA5, np.uint8)
    for part in range(parts):
        for pack, src, dst in ((1, x, packed), (0, py.pack(x), back)):
            src = np.ascontiguousarray(src)
            err = _err()
            rc = lib.rj_cube_convert_part(cl, pack, ffi.from_buffer(src), src.nbytes,
                                          ffi.from_buffer(dst), dst.nbytes, part, parts, err)
            assert rc == 0, ffi.string(err.msg).decode()
    assert np.array_equal(packed, py.pack(x))
    assert np.array_equal(back, x.reshape(-1).view(np.uint8))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 70), k=st.integers(1, 80), kh=st.integers(1, 3), kw=st.integers(1, 3),
       groups=st.sampled_from([(16, 32, 2), (32, 32, 1), (16, 16, 4)]), seed=st.integers(0, 2**31))
def test_weight_c_matches_numpy(n, k, kh, kw, groups, seed) -> None:
    ng, kg, esize = groups
    dt = ESIZE_DTYPE[esize]
    py = WeightLayout(n, k, kh, kw, ng, kg, dt)
    cl = ffi.new("rj_weight_layout *", dict(kernels=n, channels=k, kh=kh, kw=kw, n_group=ng,
                                            k_group=kg, esize=esize))
    w = _random((n, k, kh, kw), dt, seed)
    packed = _call(lib.rj_weight_pack, cl, w, py.nbytes)
    assert np.array_equal(packed, py.pack(w))
    back = _call(lib.rj_weight_unpack, cl, packed, w.nbytes)
    assert np.array_equal(back, py.unpack(packed).reshape(-1).view(np.uint8))


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 130), kh=st.integers(1, 5), kw=st.integers(1, 5),
       gs=st.sampled_from([(32, 2), (64, 1)]), seed=st.integers(0, 2**31))
def test_dw_weight_c_matches_numpy(c, kh, kw, gs, seed) -> None:
    g, esize = gs
    dt = ESIZE_DTYPE[esize]
    py = DepthwiseWeightLayout(c, kh, kw, g, dt)
    cl = ffi.new("rj_dw_weight_layout *", dict(channels=c, kh=kh, kw=kw, group=g, esize=esize))
    w = _random((c, kh, kw), dt, seed)
    packed = _call(lib.rj_dw_weight_pack, cl, w, py.nbytes)
    assert np.array_equal(packed, py.pack(w))
    back = _call(lib.rj_dw_weight_unpack, cl, packed, w.nbytes)
    assert np.array_equal(back, py.unpack(packed).reshape(-1).view(np.uint8))


def test_c_errors_are_reported_not_aborted() -> None:
    err = _err()
    cl = ffi.new("rj_cube_layout *", dict(height=4, width=1, channels=8, c2=8, esize=3))
    assert lib.rj_cube_bytes(cl, ffi.NULL, err) < 0
    assert b"element size 3" in ffi.string(err.msg)
    cl = ffi.new("rj_cube_layout *", dict(height=4, width=1, channels=8, c2=8, esize=2))
    src = np.zeros(64, np.uint8)
    dst = np.zeros(10, np.uint8)
    rc = lib.rj_cube_pack(cl, ffi.from_buffer(src), src.nbytes, ffi.from_buffer(dst), dst.nbytes, err)
    assert rc < 0 and b"destination buffer holds 10 bytes, the layout needs 64" in ffi.string(err.msg)
    cl.reserved = 1
    assert lib.rj_cube_pack(cl, ffi.from_buffer(src), 64, ffi.from_buffer(src), 64, err) < 0
    assert b"reserved" in ffi.string(err.msg)
