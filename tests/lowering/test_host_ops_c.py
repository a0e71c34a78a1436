"""The C host-op library through its own API (rj_host_op_run on numpy buffers): non-contiguous
and negative strides, offsets, broadcasting by zero strides, conversions bit for bit against
numpy / ml_dtypes, the byte counts, and every error path of the descriptor check."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rockjit.ir.reference import convert_array
from rockjit.ir.types import DType, TensorType
from rockjit.lowering.host_descriptor import MAGIC
from rockjit.lowering.host_rules import (DESC_BYTES, DESC_DTYPE, DTYPE_CODES, HOST_KINDS,
                                         HostView, encode_descriptor)
from rockjit.runtime import host_abi as ABI
from rockjit.runtime._ffi import ffi, lib
from rockjit.runtime.errors import AddressError, ProgramError

from host_ops_testutil import assert_close, assert_exact, run_desc

F32 = DType.F32
RNG = np.random.default_rng(2024)


# ---------------------------------------------------------------- ABI: Python == C

def test_descriptor_layout_matches_c():
    assert DESC_BYTES == ffi.sizeof("rj_host_op") == 448
    assert ffi.sizeof("rj_host_view") == 80
    for name in DESC_DTYPE.names:
        assert DESC_DTYPE.fields[name][1] == ffi.offsetof("rj_host_op", name), name
    assert MAGIC == lib.RJ_HOST_OP_MAGIC
    assert HOST_KINDS == {lib.rj_host_op_kind_name(k) and ffi.string(lib.rj_host_op_kind_name(k))
                          .decode(): k for k in range(lib.RJ_HOST_OPS_FIRST, lib.RJ_HOST_OPS_END)}
    # the fused step's header and records (lowering/host_fuse.py writes them)
    assert ABI.FUSED_DTYPE.itemsize == ffi.sizeof("rj_host_fused") == 16
    assert ABI.FUSED_OP_DTYPE.itemsize == ffi.sizeof("rj_host_fused_op") == 464
    assert ABI.FUSED_OP_DTYPE.fields["op"][1] == ffi.offsetof("rj_host_fused_op", "op")
    assert ABI.KINDS["fused"] == lib.RJ_HOST_FUSED and "fused" not in HOST_KINDS
    assert ffi.string(lib.rj_host_op_kind_name(lib.RJ_HOST_FUSED)).decode() == "fused"
    for dt, code in DTYPE_CODES.items():
        assert ffi.string(lib.rj_host_dtype_name(code)).decode() == dt.value
        assert lib.rj_host_dtype_size(code) == dt.to_numpy().itemsize


# ---------------------------------------------------------------- strided views

def test_binary_on_strided_views():
    """out (padded rows) = a (a transposed, offset, step-2 window of a bigger buffer)
    + b (one row broadcast over the rows by a zero stride)."""
    big = RNG.standard_normal((9, 12)).astype(np.float32)
    a = big[1:, 2::2].T            # (5, 8), strides (2, 12) elements, offset 1*12+2
    b = RNG.standard_normal(8).astype(np.float32)
    out = np.full((5, 10), 7.0, np.float32)  # rows padded to 10
    run_desc("binary", (5, 8), out, HostView("o", F32, 0, (10, 1)),
             [(big, HostView("a", F32, 14, (2, 12))), (b, HostView("b", F32, 0, (0, 1)))],
             code=1)
    np.testing.assert_array_equal(out[:, :8], a + b[None, :])
    np.testing.assert_array_equal(out[:, 8:], 7.0)  # padding untouched


def test_negative_strides_reverse():
    x = RNG.standard_normal((4, 6)).astype(np.float16)
    out = np.zeros((4, 6), np.float16)
    run_desc("copy", (4, 6), out, HostView("o", DType.F16, 0, (6, 1)),
             [(x, HostView("x", DType.F16, 23, (-6, -1)))])
    np.testing.assert_array_equal(out, x[::-1, ::-1])


@pytest.mark.parametrize("dtype,shape", [(DType.F16, (3, 100, 70)), (DType.I64, (45, 33)),
                                         (DType.U8, (2, 2, 64, 97))])
def test_tiled_transpose_of_the_two_inner_dims(dtype, shape):
    x = RNG.integers(0, 100, shape).astype(dtype.to_numpy())
    perm = tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2)
    want = np.ascontiguousarray(np.transpose(x, perm))
    out = np.zeros_like(want)
    xs = [s // x.itemsize for s in x.strides]
    run_desc("copy", want.shape, out, HostView("o", dtype, 0, [s // x.itemsize for s in want.strides]),
             [(x, HostView("x", dtype, 0, [xs[p] for p in perm]))])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype,groups,rows,lanes", [(DType.F16, 6, 32, 8), (DType.F16, 3, 9, 5),
                                                     (DType.U8, 4, 40, 8), (DType.F32, 2, 11, 4),
                                                     (DType.I64, 3, 8, 6)])
def test_cube_lanes_to_rows_transpose(dtype, groups, rows, lanes):
    """[group][row][lane] -> [group][lane][row]: a transpose whose lane dim is narrower than
    a tile (the cube unpack of a head), with leftover rows and lanes."""
    x = RNG.integers(0, 100, (groups, rows, lanes)).astype(dtype.to_numpy())
    want = np.ascontiguousarray(np.transpose(x, (0, 2, 1)))
    out = np.zeros_like(want)
    run_desc("copy", want.shape, out, HostView("o", dtype, 0, (lanes * rows, rows, 1)),
             [(x, HostView("x", dtype, 0, (rows * lanes, 1, lanes)))])
    np.testing.assert_array_equal(out, want)


def test_short_rows_walk_the_widest_dim():
    """A relayout of 16-byte atoms whose second-innermost dim is 2 wide (an image packed into
    cube atoms): every atom lands where numpy's transpose puts it."""
    x = RNG.standard_normal((14, 3, 16, 2, 8)).astype(np.float16)
    perm = (2, 0, 1, 3, 4)
    want = np.ascontiguousarray(np.transpose(x, perm))
    out = np.zeros_like(want)
    xs = [s // 2 for s in x.strides]
    run_desc("copy", want.shape, out, HostView("o", DType.F16, 0, [s // 2 for s in want.strides]),
             [(x, HostView("x", DType.F16, 0, [xs[p] for p in perm]))])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("rows,row,pitch,at", [(1, (1 << 20) + 77, 0, 3), (187, 12032, 24000, 5)])
def test_large_copies_stream_byte_exact(rows, row, pitch, at):
    """Copies of a MiB or more (streaming stores on x86): every byte lands, from an odd
    destination offset, with a tail shorter than a vector, and nothing around is touched."""
    pitch = pitch or row
    src = RNG.integers(0, 256, rows * pitch + 64, dtype=np.uint8)
    dst = np.full(rows * pitch + 64, 0xA5, np.uint8)
    run_desc("copy", (rows, row), dst, HostView("o", DType.U8, at, (pitch, 1)),
             [(src, HostView("s", DType.U8, 1, (pitch, 1)))])
    want = np.full_like(dst, 0xA5)
    for r in range(rows):
        want[at + r * pitch:at + r * pitch + row] = src[1 + r * pitch:1 + r * pitch + row]
    assert np.array_equal(dst, want)


def test_half_row_copies_walk_blocks_of_rows():
    """[head][row][half of 64] f32 -> [head][row][64] with the other half left as it is (a
    rotary half-swap): 128-byte rows, moved by the block walker."""
    x = RNG.standard_normal((3, 40, 32)).astype(np.float32)
    out = np.full((3, 40, 64), 9.0, np.float32)
    run_desc("copy", (3, 40, 32), out, HostView("o", F32, 32, (40 * 64, 64, 1)),
             [(x, HostView("x", F32, 0, (40 * 32, 32, 1)))])
    np.testing.assert_array_equal(out[:, :, 32:], x)
    np.testing.assert_array_equal(out[:, :, :32], 9.0)


@pytest.mark.parametrize("lanes", [8, 5, 12])
def test_converting_short_rows_round_as_numpy(lanes):
    """f32 rows -> f16 cube atoms ([row][lane] -> [group][row][lane]) and back: bit for bit
    numpy's astype (nearest even; ties, subnormals, overflow to inf), lane counts with and
    without a vector tail."""
    groups, rows = 7, 33
    x = (RNG.standard_normal((rows, groups * lanes)) *
         10.0 ** RNG.integers(-8, 6, (rows, groups * lanes))).astype(np.float32)
    x[0, :4] = [1.00048828125, 65520.0, 2.98e-8, -np.inf]     # a tie, overflow, underflow
    cube = np.zeros((groups, rows, lanes), np.float16)
    run_desc("copy", (groups, rows, lanes), cube,
             HostView("o", DType.F16, 0, (rows * lanes, lanes, 1)),
             [(x, HostView("x", F32, 0, (lanes, groups * lanes, 1)))])
    want = np.transpose(x.reshape(rows, groups, lanes), (1, 0, 2)).astype(np.float16)
    assert_exact(cube, want, "f32 rows to f16 atoms")
    back = np.zeros((rows, groups * lanes), np.float32)
    run_desc("copy", (groups, rows, lanes), back,
             HostView("o", F32, 0, (lanes, groups * lanes, 1)),
             [(cube, HostView("c", DType.F16, 0, (rows * lanes, lanes, 1)))])
    assert_exact(back, np.transpose(want, (1, 0, 2)).reshape(rows, -1).astype(np.float32),
                 "f16 atoms to f32 rows")


def test_in_place_unary_and_converting_strided_copy():
    x = RNG.standard_normal(1000).astype(np.float32)
    want = np.tanh(x)
    run_desc("unary", (1000,), x, HostView("x", F32, 0, (1,)),
             [(x, HostView("x", F32, 0, (1,)))], code=5)
    assert_close(x, want, F32, "in-place tanh")
    # f32 column -> bf16 row: a strided source and a converting store
    m = RNG.standard_normal((7, 3)).astype(np.float32)
    out = np.zeros(7, ml_dtypes.bfloat16)
    run_desc("copy", (7,), out, HostView("o", DType.BF16, 0, (1,)),
             [(m, HostView("m", F32, 1, (3,)))])
    assert_exact(out, m[:, 1].astype(ml_dtypes.bfloat16), "column to bf16")


def test_reduce_general_axes_with_strided_input():
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)
    t = np.transpose(x, (2, 0, 3, 1))  # iterate x in a permuted order: strides (6, 120, 1, 30)
    out = np.zeros((5, 6), np.float32)
    run_desc("reduce", t.shape, out, HostView("o", F32, 0, (6, 0, 1, 0)),
             [(x, HostView("x", F32, 0, (6, 120, 1, 30)))], code=1, axis_mask=0b1010)
    np.testing.assert_allclose(out, t.sum(axis=(1, 3)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k,p,q,lanes", [(3, 5, 7, 8), (1, 16, 1, 8), (2, 4, 4, 4), (2, 9, 3, 8),
                                         (2, 6, 5, 16)])
def test_atom_retiling_copy_equals_numpy(k, p, q, lanes):
    """A copy of 16-byte atoms between two orders of them ([k][p][q] atoms -> [k][q][p], the
    re-tiling of attention heads between cube layouts): the 2-D tile walker where it applies
    (p x q >= 16, atoms shorter than a line), the widest-dim walker elsewhere; bits equal
    numpy's transpose (NaN payloads kept: the bytes are random)."""
    x = RNG.integers(0, 65536, (k, p, q, lanes), dtype=np.uint16).view(np.float16)
    out = np.zeros((k, q, p, lanes), np.float16)
    a = lanes
    run_desc("copy", (k, p, q, lanes), out,
             HostView("o", DType.F16, 0, (q * p * a, a, p * a, 1)),
             [(x, HostView("x", DType.F16, 0, (p * q * a, q * a, a, 1)))])
    assert np.array_equal(out.view(np.uint16), x.transpose(0, 2, 1, 3).view(np.uint16))


@pytest.mark.parametrize("heads,rows,groups,nan", [(2, 700, 5, False), (1, 3, 1, False),
                                                    (3, 130, 4, True)])
def test_row_max_over_a_cube_view_reads_whole_atoms(heads, rows, groups, nan):
    """A row max over a score cube [head][group][row][8 lanes] (rows 8 lanes apart, the lanes
    between them reduced: the C runtime's interleaved max path) equals numpy's max over
    (group, lane), NaN propagating; more rows than one scratch chunk holds."""
    x = RNG.standard_normal((heads, groups, rows, 8)).astype(np.float16)
    if nan:
        x[1, 2, 17, 5] = np.nan
    x[0, 0, 0, 0] = -np.inf
    out = np.zeros((heads, rows), np.float32)
    e = x.strides
    run_desc("reduce", (heads, rows, groups, 8), out, HostView("o", F32, 0, (rows, 1, 0, 0)),
             [(x, HostView("x", DType.F16, 0, (e[0] // 2, e[2] // 2, e[1] // 2, 1)))],
             code=2, axis_mask=0b1100)
    want = x.astype(np.float32).max(axis=(1, 3))
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("lanes,rows", [(4, 700), (1, 300), (7, 65), (3, 2)])
def test_row_max_over_the_first_lanes_of_each_atom(lanes, rows):
    """A max over the first ``lanes`` of each 8-lane atom and the groups (Whisper's 1500 rows x
    4 of 8 lanes): the interleaved path loads whole spans and skips each atom's other lanes;
    bits equal numpy's max, NaN propagating, the trailing unreduced lanes left unread in
    effect (they hold NaN and +inf here, which must not show)."""
    x = RNG.standard_normal((2, 3, rows, 8)).astype(np.float16)
    x[..., lanes:] = np.float16(np.inf)
    x[1, 1, rows // 2, lanes:] = np.nan
    x[0, 2, rows - 1, 0] = np.nan
    x[1, :, 0, :lanes] = -0.0
    out = np.zeros((2, rows), np.float32)
    e = x.strides
    run_desc("reduce", (2, rows, 3, lanes), out, HostView("o", F32, 0, (rows, 1, 0, 0)),
             [(x, HostView("x", DType.F16, 0, (e[0] // 2, e[2] // 2, e[1] // 2, 1)))],
             code=2, axis_mask=0b1100)
    want = x[..., :lanes].astype(np.float32).max(axis=(1, 3))
    np.testing.assert_array_equal(out, want)
    assert np.array_equal(np.signbit(out), np.signbit(want))


def test_row_gather_wider_than_a_chunk_loads_one_index_per_chunk():
    """Rows of 700 (more than one 512-element chunk): each chunk's one index is loaded and
    checked once; a bad index is still named."""
    table = RNG.standard_normal((40, 700)).astype(np.float32)
    idx = np.array([39, 0, -2, 7], np.int32)
    out = np.zeros((4, 700), np.float32)
    run_desc("take", (4, 700), out, HostView("o", F32, 0, (700, 1)),
             [(table, HostView("t", F32, 0, (0, 1))), (idx, HostView("i", DType.I32, 0, (1, 0)))],
             iparams=(700, 40))
    np.testing.assert_array_equal(out, table[idx])
    idx[2] = 40
    with pytest.raises(ProgramError, match="index 40"):
        run_desc("take", (4, 700), out, HostView("o", F32, 0, (700, 1)),
                 [(table, HostView("t", F32, 0, (0, 1))),
                  (idx, HostView("i", DType.I32, 0, (1, 0)))], iparams=(700, 40))


def test_row_gather_fast_path_and_scalar_broadcast_fill():
    table = RNG.standard_normal((50, 64)).astype(np.float32)
    idx = np.array([[4, 49], [0, -1]], np.int32)
    out = np.zeros((2, 2, 64), np.float32)
    moved = run_desc("take", (2, 2, 64), out, HostView("o", F32, 0, (128, 64, 1)),
                     [(table, HostView("t", F32, 0, (0, 0, 1))),
                      (idx, HostView("i", DType.I32, 0, (2, 1, 0)))], iparams=(64, 50))
    np.testing.assert_array_equal(out, table[idx])
    assert moved == 2 * out.nbytes + idx.nbytes  # rows written + rows read + indices read
    fill = np.array(3.5, np.float32)
    dst = np.zeros((3, 5), np.float32)
    moved = run_desc("copy", (3, 5), dst, HostView("o", F32, 0, (5, 1)),
                     [(fill, HostView("v", F32, 0, (0, 0)))])
    np.testing.assert_array_equal(dst, 3.5)
    assert moved == dst.nbytes + 4  # a broadcast input counts its one element once
    for dt, v in ((DType.F16, -0.0), (DType.U8, 200)):   # pad fills into padded rows
        fill = np.array(v, dt.to_numpy())
        dst = np.full((3, 8), 7, dt.to_numpy())
        run_desc("copy", (3, 5), dst, HostView("o", dt, 0, (8, 1)),
                 [(fill, HostView("v", dt, 0, (0, 0)))])
        assert_exact(dst[:, :5], np.full((3, 5), v, dt.to_numpy()), f"{dt} fill")
        assert np.array_equal(np.signbit(dst[:, :5]), np.signbit(np.full((3, 5), v)))
        assert (dst[:, 5:] == 7).all()


# ---------------------------------------------------------------- conversions, bit for bit

def _convert(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    out = np.zeros(x.shape, dst.to_numpy())
    run_desc("copy", x.shape, out, HostView("o", dst, 0, (1,)),
             [(np.ascontiguousarray(x), HostView("x", src, 0, (1,)))])
    return out


def test_f16_all_bit_patterns_to_f32_and_back():
    h = np.arange(65536, dtype=np.uint16).view(np.float16)
    f = _convert(h, DType.F16, F32)
    with np.errstate(invalid="ignore"):
        assert_exact(f, h.astype(np.float32), "f16 -> f32")
    back = _convert(f, F32, DType.F16)
    nan = np.isnan(h)
    assert np.array_equal(back.view(np.uint16)[~nan], h.view(np.uint16)[~nan])
    assert np.isnan(back[nan]).all()


def test_f32_to_f16_and_bf16_round_to_nearest_even():
    bits = RNG.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    # plus the values around f16's overflow, its subnormals and exact ties
    extra = np.array([65504.0, 65519.99, 65520.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1 + 2.0**-11,
                      1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.4e38], np.float32)
    f = np.concatenate([bits.view(np.float32), extra, -extra])
    nan = np.isnan(f)
    with np.errstate(over="ignore", invalid="ignore"):
        for dst, ref in ((DType.F16, f.astype(np.float16)),
                         (DType.BF16, f.astype(ml_dtypes.bfloat16))):
            got = _convert(f, F32, dst)
            assert np.array_equal(got.view(np.uint16)[~nan], ref.view(np.uint16)[~nan]), dst
            assert np.isnan(got[nan].astype(np.float32)).all()


def test_float_to_int_saturates_truncates_and_maps_nan_to_zero():
    f = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.9, -2.9, 127.5, -128.7, 255.9, -0.5,
                  9.3e18, -9.3e18, 4294967295.0, 2147483520.0], np.float32)
    for dst in (DType.I8, DType.U8, DType.I16, DType.I32, DType.U32, DType.I64, DType.BOOL):
        want = convert_array(f, TensorType(dst, f.shape))
        assert_exact(_convert(f, F32, dst), want, f"f32 -> {dst.value}")


def test_int_conversions_wrap():
    x = np.array([-2**63, 2**63 - 1, -1, 255, 256, -129, 2**31, 70000, 0], np.int64)
    for dst in (DType.I8, DType.U8, DType.I16, DType.I32, DType.U32, DType.F16, DType.BF16,
                F32, DType.BOOL):
        with np.errstate(over="ignore"):  # i64 beyond f16's range is inf: intended
            want = convert_array(x, TensorType(dst, x.shape))
        assert_exact(_convert(x, DType.I64, dst), want, f"i64 -> {dst.value}")


# ---------------------------------------------------------------- error paths

def _good() -> tuple[np.ndarray, list]:
    """A valid binary-add descriptor over (3, 4) f32 and its buffers."""
    bufs = [np.zeros((3, 4), np.float32), np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)]
    views = [HostView("o", F32, 0, (4, 1)), HostView("a", F32, 0, (4, 1)),
             HostView("b", F32, 0, (4, 1))]
    return encode_descriptor("binary", (3, 4), views, code=1), bufs


def _run_raw(desc: np.ndarray, bufs: list, sizes=None, nbufs=None, null=()):
    views = np.frombuffer(desc.tobytes(), DESC_DTYPE)[0]
    n = len(bufs) if nbufs is None else nbufs
    cbufs = ffi.new("rj_host_buf[]", max(n, 1))
    for i in range(min(n, len(bufs))):
        cbufs[i].data = ffi.NULL if i in null else ffi.from_buffer(bufs[i])
        cbufs[i].size = bufs[i].nbytes if sizes is None else sizes[i]
    d = ffi.new("rj_host_op *")
    ffi.memmove(d, desc.tobytes(), DESC_BYTES)
    err = ffi.new("rj_err *")
    rc = lib.rj_host_op_run(d, cbufs, n, ffi.NULL, err)
    del views
    return rc, ffi.string(err.msg).decode()


def _mutate(**fields) -> np.ndarray:
    desc, _ = _good()
    d = np.frombuffer(desc.tobytes(), DESC_DTYPE).copy()
    for path, value in fields.items():
        target = d[0]
        *head, last = path.split("__")
        for h in head:
            target = target[int(h)] if h.isdigit() else target[h]
        if last.isdigit():
            target[int(last)] = value
        else:
            target[last] = value
    return np.frombuffer(d.tobytes(), np.uint8).copy()


ERROR_CASES = [
    # (descriptor changes, message fragment, rc)
    ({"magic": 0}, "magic is 0x00000000", lib.RJ_EINVAL),
    ({"version": 9}, "version 9", lib.RJ_EINVAL),
    ({"kind": 99}, "unknown kind 99", lib.RJ_EINVAL),
    ({"reserved": 1}, "reserved field is 1", lib.RJ_EINVAL),
    ({"rank": 9}, "rank 9 exceeds the maximum 8", lib.RJ_EINVAL),
    ({"shape__1": -4}, "shape[1] = -4 is negative", lib.RJ_EINVAL),
    ({"shape__5": 2}, "shape[5] = 2 beyond rank 2 must be 0", lib.RJ_EINVAL),
    ({"view__3__dtype": 1}, "view 3 is unused", lib.RJ_EINVAL),
    ({"view__1__dtype": 42}, "input 1 has unknown dtype 42", lib.RJ_EINVAL),
    ({"view__2__reserved": 5}, "input 2 view reserved field is 5", lib.RJ_EINVAL),
    ({"view__1__stride__4": 1}, "input 1 stride[4] beyond rank 2", lib.RJ_EINVAL),
    ({"code": 0}, "unknown code 0", lib.RJ_EINVAL),
    ({"code": 8}, "unknown code 8", lib.RJ_EINVAL),
    ({"view__2__dtype": DTYPE_CODES[DType.F16]}, "inputs must share one dtype, got f32 and f16",
     lib.RJ_EINVAL),
    ({"view__1__dtype": 3, "view__2__dtype": 3, "code": 7}, "binary pow: needs float inputs",
     lib.RJ_EINVAL),
    ({"axis_mask": 1}, "axis_mask 0x1 is only meaningful for reduce", lib.RJ_EINVAL),
    ({"iparam__2": 1}, "iparam[2] = 1 is unused", lib.RJ_EINVAL),
    ({"view__0__stride__1": 0}, "output strides [4, 0] over shape [3, 4] write some element "
     "more than once", lib.RJ_EINVAL),
    ({"view__0__stride__0": 2}, "write some element more than once", lib.RJ_EINVAL),
    ({"view__1__offset": 1}, "input 1 (f32, offset 1, strides [4, 1] over shape [3, 4]) reaches "
     "element 12 (bytes up to 52) but its buffer holds 48 bytes", lib.RJ_EFAULT),
    ({"view__2__offset": -1}, "reaches element -1, before the start", lib.RJ_EFAULT),
    ({"view__1__stride__0": 2**62}, "overflow 64-bit offsets", lib.RJ_EINVAL),
]


@pytest.mark.parametrize("changes,fragment,code", ERROR_CASES,
                         ids=[f"{next(iter(c))}" for c, _, _ in ERROR_CASES])
def test_descriptor_errors(changes, fragment, code):
    _, bufs = _good()
    rc, msg = _run_raw(_mutate(**changes), bufs)
    assert rc == code, msg
    assert fragment in msg, msg
    assert not bufs[0].any(), "a refused op must not write its output"


def test_buffer_count_size_and_null_errors():
    desc, bufs = _good()
    rc, msg = _run_raw(desc, bufs, nbufs=2)
    assert rc == lib.RJ_EINVAL and "got 2 buffers, needs 3" in msg
    rc, msg = _run_raw(desc, bufs, sizes=[48, 48, 40])
    assert rc == lib.RJ_EFAULT and "input 2" in msg and "holds 40 bytes" in msg
    rc, msg = _run_raw(desc, bufs, null=(1,))
    assert rc == lib.RJ_EINVAL and "input 1 buffer pointer is NULL" in msg


KIND_ERRORS = [
    ("unary", (4,), [F32, DType.I32], dict(code=3), "unary exp: needs a float input"),
    ("unary", (4,), [DType.I32, DType.I32], dict(code=12, iparams=(-2,)),
     "negative exponent -2 needs a float input"),
    ("unary", (4,), [DType.BOOL, DType.BOOL], dict(code=1), "needs a numeric input, got bool"),
    ("reduce", (4,), [F32, F32], dict(code=1, axis_mask=0b10), "names axes beyond rank 1"),
    ("reduce", (4,), [F32, DType.I32], dict(code=1, axis_mask=1), "must both be float or both"),
    ("select", (4,), [F32, F32, F32], dict(iparams=(0, 1)), "selector must be bool or an integer"),
    ("select", (4,), [F32, DType.I32, DType.F16], dict(iparams=(0, 1)), "case 0 is f16"),
    ("select", (4,), [F32, DType.I32, F32, F32], dict(iparams=(1, 2)), "cases 1..2 of 2 total"),
    ("take", (4,), [F32, DType.F16, DType.I32], dict(iparams=(1, 4)), "the table is f16"),
    ("take", (4,), [F32, F32, F32], dict(iparams=(1, 4)), "indices must be integers, got f32"),
    ("take", (4,), [F32, F32, DType.I32], dict(iparams=(1, -1)), "axis size iparam[1] = -1"),
    ("iota", (4,), [DType.I32], dict(iparams=(1,)), "dimension iparam[0] = 1 is outside rank 1"),
    ("copy", (4,), [F32], {}, "has 0 inputs, needs 1..1"),
    ("compare", (4,), [DType.BOOL, F32, F32], dict(code=9), "compare: unknown code 9"),
]


@pytest.mark.parametrize("kind,shape,dtypes,extra,fragment", KIND_ERRORS,
                         ids=[f"{k}-{f[:24]}" for k, _, _, _, f in KIND_ERRORS])
def test_kind_errors(kind, shape, dtypes, extra, fragment):
    views = [HostView(f"v{i}", dt, 0, (1,)) for i, dt in enumerate(dtypes)]
    desc = encode_descriptor(kind, shape, views, **extra)
    bufs = [np.zeros(4, dt.to_numpy()) for dt in dtypes]
    rc, msg = _run_raw(desc, bufs)
    assert rc == lib.RJ_EINVAL, msg
    assert fragment in msg, msg


def test_run_time_value_errors_name_the_value():
    table = np.zeros((5, 2), np.float32)
    idx = np.array([1, 2, 7], np.int64)
    out = np.zeros((3, 2), np.float32)
    with pytest.raises(ProgramError, match=r"index 7 \(indices element 2\) is out of range for "
                                           r"an axis of size 5"):
        run_desc("take", (3, 2), out, HostView("o", F32, 0, (2, 1)),
                 [(table, HostView("t", F32, 0, (0, 1))), (idx, HostView("i", DType.I64, 0, (1, 0)))],
                 iparams=(2, 5))
    which = np.array([0, 1, -1], np.int32)
    with pytest.raises(ProgramError, match=r"selector value -1 at selector element 2 is outside "
                                           r"the 2 cases \(valid: 0..1\)"):
        run_desc("select", (3,), np.zeros(3, np.float32), HostView("o", F32, 0, (1,)),
                 [(which, HostView("w", DType.I32, 0, (1,))),
                  (np.zeros(3, np.float32), HostView("a", F32, 0, (1,))),
                  (np.ones(3, np.float32), HostView("b", F32, 0, (1,)))], iparams=(0, 2))


def test_buffer_too_small_raises_address_error():
    out = np.zeros(3, np.float32)
    with pytest.raises(AddressError, match="output .* reaches element 3 .* holds 12 bytes"):
        run_desc("iota", (4,), out, HostView("o", F32, 0, (1,)), [], iparams=(0,))


def test_large_contiguous_add_is_fast_path():
    """A dense 4M-element f32 add: one merged row, checked against numpy."""
    a = RNG.standard_normal(1 << 22).astype(np.float32)
    b = RNG.standard_normal(1 << 22).astype(np.float32)
    out = np.empty_like(a)
    v = HostView("x", F32, 0, (1024, 1))
    moved = run_desc("binary", (4096, 1024), out, v, [(a, v), (b, v)], code=1)
    np.testing.assert_array_equal(out, a + b)
    assert moved == 3 * a.nbytes
