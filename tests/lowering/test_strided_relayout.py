"""One-pass strided re-layouts (strided_relayout.py) run through the C host copy, against
layouts.py's numpy pack/unpack (the independent reference), on odd shapes: tokens not a
multiple of 16/32, channels not a multiple of 8/32, several heads."""
from __future__ import annotations

import numpy as np
import pytest

from rockjit.ir.types import DType
from rockjit.lowering import strided_relayout as SR
from rockjit.lowering.host_rules import MAX_RANK, HostView, host_op_step
from rockjit.lowering.host_run import run_on_host
from rockjit.lowering.layouts import CubeLayout, WeightLayout
from rockjit.lowering.op_lowering import BufferSpec, OpLowering


def _run(pieces, src_bytes: np.ndarray, dst_nbytes: int, src_dt: DType, dst_dt: DType) -> np.ndarray:
    """The pieces as host copy steps from a byte buffer into a zeroed one."""
    specs = [BufferSpec("src", "input", src_bytes.size, dtype="u8", shape=(src_bytes.size,), bind=0),
             BufferSpec("dst", "output", dst_nbytes, dtype="u8", shape=(dst_nbytes,), bind=0)]
    steps = []
    for j, p in enumerate(pieces):
        st, desc = host_op_step("copy", p.shape, HostView("dst", dst_dt, p.dst_offset, p.dst_strides),
                                [HostView("src", src_dt, p.src_offset, p.src_strides)],
                                {"src": src_bytes.size, "dst": dst_nbytes, f"d{j}": 0}, f"d{j}")
        steps.append(st)
        specs.append(desc)
    (out,) = run_on_host(OpLowering(tuple(specs), tuple(steps)), [src_bytes])
    return out


def _heads_cube(rng, heads: int, tokens: int, dim: int) -> tuple[np.ndarray, CubeLayout, np.ndarray]:
    """A projection's [tokens, heads * dim] fp16 cube, its layout and the per-head values."""
    x = rng.standard_normal((tokens, heads * dim)).astype(np.float16)
    lay = CubeLayout(tokens, 1, heads * dim, 8, np.float16)
    return lay.pack(x.reshape(tokens, 1, -1)), lay, x.reshape(tokens, heads, dim).transpose(1, 0, 2)


@pytest.mark.parametrize("heads,tokens,dim,transposed", [
    (3, 37, 24, False), (3, 37, 24, True), (2, 50, 40, True), (1, 16, 64, False), (4, 33, 8, True)])
def test_cube_to_weights_all_heads(heads, tokens, dim, transposed) -> None:
    """K ([heads, T, D] as weights N=T, K=D) and V ([heads, D, T]: the transpose) from the
    projection cube: one strided pass equals pack_weight of each head's numpy slice."""
    rng = np.random.default_rng(heads * 1000 + tokens)
    cube, lay, per_head = _heads_cube(rng, heads, tokens, dim)
    head_stride = dim // lay.c2 * lay.surf_stride
    src = SR.cube_axis_maps(lay, ("b", "h", "c"), (head_stride, 0, 0))
    n, k = (dim, tokens) if transposed else (tokens, dim)
    # a padded N (as the score matmul's 224-kernel tile over 196 keys) must stay zero
    wl = WeightLayout(n + 16, k, 1, 1, 16, 32, np.float16)
    shape = (heads, n, k)
    if transposed:
        src = [src[0], src[2], src[1]]
    pieces = SR.relayout_pieces(shape, src, SR.weight_axis_maps(wl, (heads,), wl.nbytes), 2, 2, MAX_RANK)
    assert pieces is not None and len(pieces) <= 4
    got = _run(pieces, cube, heads * wl.nbytes, DType.F16, DType.F16)
    for h in range(heads):
        w = per_head[h].T if transposed else per_head[h]
        want = np.zeros((wl.kernels, k), np.float16)
        want[:n] = w
        np.testing.assert_array_equal(got[h * wl.nbytes:(h + 1) * wl.nbytes], wl.pack(want))


@pytest.mark.parametrize("tokens,channels,dst", [(37, 13, DType.F16), (21, 40, DType.F32),
                                                 (5, 3, DType.F32)])
def test_cube_to_rows_and_back(tokens, channels, dst) -> None:
    """cube -> rows (with an fp16 -> fp32 widening on the way) and rows -> cube for a channel
    count that leaves padding lanes: the padding is never read, never written."""
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((tokens, 1, channels)).astype(np.float16)
    lay = CubeLayout(tokens, 1, channels, 8, np.float16)
    cube = lay.pack(x)
    maps = SR.cube_axis_maps(lay, ("h", "w", "c"), (0, 0, 0))
    es = dst.to_numpy().itemsize
    rows_p = SR.relayout_pieces(x.shape, maps, SR.row_axis_maps(x.shape, es), 2, es, MAX_RANK)
    rows = _run(rows_p, cube, x.size * es, DType.F16, dst).view(dst.to_numpy()).reshape(x.shape)
    np.testing.assert_array_equal(rows, x.astype(dst.to_numpy()))
    back_p = SR.relayout_pieces(x.shape, SR.row_axis_maps(x.shape, es), maps, es, 2, MAX_RANK)
    back = _run(back_p, rows.reshape(-1).view(np.uint8), lay.nbytes, dst, DType.F16)
    np.testing.assert_array_equal(back, cube)


def test_per_head_rows_to_batched_cubes() -> None:
    """A per-head row value [heads, T] packed as one [T, 1] cube per head (items a fixed stride
    apart), as the softmax's row max is: equal to numpy packing each head."""
    heads, tokens = 5, 29
    rng = np.random.default_rng(3)
    x = rng.standard_normal((heads, tokens)).astype(np.float32)
    lay = CubeLayout(tokens, 1, 32, 8, np.float16)
    step = -(-lay.nbytes // 64) * 64
    # value [heads, T] as cubes: heads a b axis, T the cube's h, c a unit axis
    maps = SR.cube_axis_maps(lay, ("b", "h"), (step, 0))
    pieces = SR.relayout_pieces(x.shape, SR.row_axis_maps(x.shape, 4), maps, 4, 2, MAX_RANK)
    assert len(pieces) == 1
    got = _run(pieces, x.reshape(-1).view(np.uint8), heads * step, DType.F32, DType.F16)
    for h in range(heads):
        col = np.zeros((tokens, 1, 32), np.float16)
        col[:, 0, 0] = x[h].astype(np.float16)
        np.testing.assert_array_equal(got[h * step:h * step + lay.nbytes], lay.pack(col))


def test_moduli_that_do_not_nest_are_refused() -> None:
    """A 12-lane group against a 32-wide block cannot be cut affinely: no pieces (the caller
    keeps the per-item route) rather than a wrong copy."""
    a = SR.AxisMap(2, 12, 1000)
    b = SR.AxisMap(2, 32, 4000)
    assert SR.relayout_pieces((100,), [a], [b], 2, 2, MAX_RANK) is None


def test_row_max_reads_the_score_cube_in_place() -> None:
    """A host row max over a batched matmul's cube (3 heads, 37 keys: a lane tail) reads the
    cube through a strided view, never unpacking it, and only real keys are reduced: the
    scores are all negative, so a padding lane (0) read into the max would show."""
    import jax.numpy as jnp

    import rockjit

    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.0, (3, 21, 16)).astype(np.float32)
    w = -rng.uniform(0.5, 1.0, (3, 16, 37)).astype(np.float32)

    def f(x, w):
        return jnp.max(jnp.einsum("htd,hdk->htk", x, w), axis=-1)

    g = rockjit.compile(f, backend="sim")
    got = np.asarray(g(x, w))
    ref = np.einsum("htd,hdk->htk", x.astype(np.float64), w.astype(np.float64)).max(-1)
    np.testing.assert_allclose(got, ref, rtol=4e-3)
    st = g.compiled(x, w).stats()
    assert st["host_bytes_unpacked"] < 3 * 21 * 37 * 2, st["host_bytes_unpacked"]


@pytest.mark.parametrize("mods", [[8], [8, 32], [4, 16], [16, 8, 32]])
def test_axis_cut_covers_each_index_once_at_its_address(mods) -> None:
    """Every cut of [first, first + n) visits each index once, and the digits' strides give
    each index its grouped address (i // m) * outer + (i % m) * inner, for every map."""
    maps = [SR.AxisMap(3, m, 1000 + m) for m in mods] + [SR.AxisMap(7)]
    for first in (0, 1, 5, 8, 13, 31, 32, 40):
        for n in (1, 3, 8, 9, 31, 33, 64, 77):
            pieces = SR._axis_pieces(n, mods, first)
            seen = []
            for start, digits in pieces:
                idx = [(start, {id(m): m.at(start) for m in maps})]
                for cnt, w in digits:
                    idx = [(i + k * w, {id(m): a[id(m)] + k * SR.digit_stride(m, w) for m in maps})
                           for i, a in idx for k in range(cnt)]
                for i, a in idx:
                    seen.append(i)
                    assert all(a[id(m)] == m.at(i) for m in maps), (first, n, start, digits, i)
            assert sorted(seen) == list(range(first, first + n)), (first, n)
