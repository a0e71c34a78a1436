"""Shared helpers of the host-op tests: inputs per dtype, IR nodes, comparisons with the
numpy reference (rockjit.ir.reference), and direct descriptor runs through the C library."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from rockjit.ir.graph import Builder, Node
from rockjit.ir.ops import Op
from rockjit.ir.reference import evaluate
from rockjit.ir.types import DType, TensorType
from rockjit.lowering.host_rules import HostView, encode_descriptor
from rockjit.runtime._ffi import check, ffi, lib

FLOATS = (DType.F32, DType.F16, DType.BF16)
INTS = (DType.I32, DType.I8, DType.U8, DType.I64, DType.U32, DType.I16)
ALL = FLOATS + INTS + (DType.BOOL,)

# Relative tolerance of libm-vs-numpy transcendental results, by result dtype: a few f32 ulps
# (two libraries' exp/erf/... differ by up to ~4 ulp), or one ulp of the narrow type (an f32
# difference of 1 ulp may flip a rounding to f16/bf16).
REL_TOL = {DType.F32: 8 * 2.0 ** -23, DType.F16: 2.0 ** -10, DType.BF16: 2.0 ** -7}
ABS_FLOOR = {DType.F32: 1e-37, DType.F16: 2.0 ** -24, DType.BF16: 1e-37}


def gen(rng: np.random.Generator, dtype: DType, shape: Sequence[int], special: bool = False,
        low: float | None = None, high: float | None = None) -> np.ndarray:
    """Random values of one dtype; ``special`` plants NaN/inf/-0 (floats) or the type's
    extremes (ints) to exercise wrapping, saturation and NaN propagation."""
    shape = tuple(shape)
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_float:
        if low is not None:
            x = rng.uniform(low, high, shape).astype(np.float32)
        else:
            x = (rng.standard_normal(shape) * 3).astype(np.float32)
        if special and x.size >= 6:
            flat = x.reshape(-1)
            pos = rng.choice(x.size, 4, replace=False)
            flat[pos] = [np.nan, np.inf, -np.inf, -0.0]
        return x.astype(dtype.to_numpy())
    info = np.iinfo(dtype.to_numpy())
    lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
    x = rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64)
    if special and x.size >= 4:
        flat = x.reshape(-1)
        pos = rng.choice(x.size, 3, replace=False)
        flat[pos] = [int(info.min), int(info.max), 0]
    return x.astype(dtype.to_numpy())


def make_node(op: Op, in_types: Sequence[TensorType], attrs: Mapping[str, Any] | None = None,
              out_type: TensorType | None = None) -> Node:
    b = Builder()
    ins = [b.input(t) for t in in_types]
    b.add(op, ins, out_type, attrs or {})
    return b.nodes[-1]


def reference(node: Node, inputs: Sequence[np.ndarray]) -> np.ndarray:
    return evaluate(node.op, inputs, node.attrs, node.out.type)


def assert_exact(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal values (NaN where the reference has NaN; -0 == 0), same dtype and shape."""
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != reference {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != reference {ref.shape}"
    if ref.dtype.kind == "f" or ref.dtype.name == "bfloat16":
        with np.errstate(invalid="ignore"):  # NaN payloads widen with a warning
            g, r = got.astype(np.float64), ref.astype(np.float64)
        nan = np.isnan(r)
        assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ"
        bad = ~nan & (g != r)
        if bad.any():
            i = np.argwhere(bad)[0]
            raise AssertionError(f"{what}: {int(bad.sum())} of {r.size} differ; first at "
                                 f"{tuple(i)}: got {g[tuple(i)]!r}, want {r[tuple(i)]!r}")
    else:
        np.testing.assert_array_equal(got, ref, err_msg=what)


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: DType, what: str,
                 rel: float | None = None, abs_: np.ndarray | float = 0.0) -> None:
    """|got - ref| <= rel * |ref| + abs_ (+ the type's floor); NaN and inf must match."""
    assert got.dtype == ref.dtype and got.shape == ref.shape, \
        f"{what}: {got.dtype}{got.shape} != reference {ref.dtype}{ref.shape}"
    with np.errstate(invalid="ignore"):
        g, r = got.astype(np.float64), ref.astype(np.float64)
    nan = np.isnan(r)
    assert np.array_equal(np.isnan(g), nan), f"{what}: NaN positions differ"
    inf = np.isinf(r)
    assert np.array_equal(g[inf], r[inf]), f"{what}: infinities differ"
    fin = ~nan & ~inf
    tol = (REL_TOL[dtype] if rel is None else rel) * np.abs(r) + ABS_FLOOR[dtype] + abs_
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf (checked above)
        err = np.abs(g - r)
    bad = fin & (err > tol)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {r.size} out of tolerance; first at "
                             f"{i}: got {g[i]!r}, want {r[i]!r}")


# ---------------------------------------------------------------- direct descriptor runs

def run_desc(kind: str, shape: Sequence[int], out: np.ndarray, out_view: HostView,
             ins: Sequence[tuple[np.ndarray, HostView]], code: int = 0, axis_mask: int = 0,
             iparams: Sequence[int] = (), desc: np.ndarray | None = None,
             sizes: Sequence[int] | None = None) -> int:
    """Run one descriptor on numpy buffers (out is written in place); returns bytes moved.
    ``desc`` overrides the encoded bytes (error tests), ``sizes`` the buffer sizes."""
    if desc is None:
        desc = encode_descriptor(kind, shape, [out_view, *[v for _, v in ins]], code, axis_mask,
                                 iparams)
    arrays = [out, *[a for a, _ in ins]]
    bufs = ffi.new("rj_host_buf[]", len(arrays))
    for i, a in enumerate(arrays):
        bufs[i].data = ffi.from_buffer(a, require_writable=False)
        bufs[i].size = a.nbytes if sizes is None else sizes[i]
    d = ffi.new("rj_host_op *")
    ffi.memmove(d, desc.tobytes(), ffi.sizeof("rj_host_op"))
    moved = ffi.new("uint64_t *")
    err = ffi.new("rj_err *")
    check(lib.rj_host_op_run(d, bufs, len(arrays), moved, err), err)
    return int(moved[0])
