"""float32 -> float16 rounding of compile-time values (weights, constants) through the C host
library's copy, which converts with F16C where the build has it, on the host threads.

numpy's float32 -> float16 cast runs at ~0.6-0.9 GB/s of input on this kind of machine, about a
fifth of a memcpy, and a compile casts every projection weight once: at ModernBERT-base that
was most of the "fp16 cast + packing" bucket of bench/compile_vs_xla.py. The host library's
copy rounds to nearest even like numpy (rj_half.h; tests/lowering/test_weight_cast.py checks
the bits against numpy), takes the source and destination as strided views, so a transposed
weight is cast without a float32 copy of it first, and splits a large copy over the threads.

A NaN comes out quiet with its payload's top bits (F16C's rule), where numpy keeps the payload
as it is; every other value gives numpy's bits. A compile refuses NaN weights before this runs
(value_checks.py), so only a constant's NaN could tell the two apart, and it stays a NaN.
"""
from __future__ import annotations

import numpy as np

from .host_descriptor import MAX_RANK, HostView, encode_descriptor
from ..ir.types import DType

_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
# below this many elements the descriptor and the call cost more than numpy's loop
_MIN_ELEMENTS = 1 << 14


def _element_strides(a: np.ndarray) -> tuple[int, ...] | None:
    if any(s < 0 or s % a.itemsize for s in a.strides):
        return None
    return tuple(s // a.itemsize for s in a.strides)


def cast_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` rounded to nearest even, for float32 ``src`` and float16 ``dst`` of
    the same shape (any non-negative strides); other dtypes and small arrays go through
    numpy, which rounds the same way."""
    if dst.shape != src.shape:
        raise ValueError(f"cast_into: destination shape {dst.shape} is not the source's "
                         f"{src.shape}")
    ds, ss = _element_strides(dst), _element_strides(src)
    if (src.dtype != _F32 or dst.dtype != _F16 or ds is None or ss is None
            or src.size < _MIN_ELEMENTS or src.ndim > MAX_RANK or src.ndim == 0
            or not dst.flags.writeable):
        np.copyto(dst, src, casting="unsafe")
        return
    from ..runtime._ffi import check, ffi, lib
    from ..runtime.host_threads import host_threads

    desc = encode_descriptor("copy", src.shape, [HostView("dst", DType.F16, 0, ds),
                                                 HostView("src", DType.F32, 0, ss)])
    op = ffi.new("rj_host_op *")
    ffi.memmove(op, desc.tobytes(), desc.nbytes)
    bufs = ffi.new("rj_host_buf[]", 2)
    for i, a, strides in ((0, dst, ds), (1, src, ss)):
        reach = sum((n - 1) * s for n, s in zip(a.shape, strides)) + 1
        bufs[i].data = ffi.cast("void *", a.ctypes.data)
        bufs[i].size = reach * a.itemsize
    err = ffi.new("rj_err *")
    check(lib.rj_host_op_run_threads(op, bufs, 2, host_threads(), ffi.NULL, ffi.NULL, err), err)


def to_float16(a: np.ndarray) -> np.ndarray:
    """A new C-contiguous float16 array of ``a``'s values rounded to nearest even (numpy's
    ``astype(np.float16)``, faster for a large float32 array)."""
    a = np.asarray(a)
    out = np.empty(a.shape, _F16)
    cast_into(out, a)
    return out



def cast_to(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A new C-contiguous array of ``a`` in ``dtype`` (``to_float16`` for float32 to float16,
    numpy's cast otherwise)."""
    a = np.asarray(a)
    if np.dtype(dtype) == _F16:
        return to_float16(a)
    return np.ascontiguousarray(a.astype(dtype))
