"""The ``rj_host_op`` descriptor of one host-library op (csrc/runtime/rj_host_ops.h): its
operand views (buffer, dtype, element offset, element strides) and the descriptor bytes, made
once per structure in a compile (compile_cache.py). host_rules.py builds host steps on them."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.types import DType
from ..runtime import host_abi as ABI
from .compile_cache import memo
from .regcmd import LoweringError

MAX_RANK = ABI.MAX_RANK
MAX_OPERANDS = ABI.MAX_OPERANDS
MAGIC = ABI.OP_MAGIC
VERSION = ABI.OP_VERSION
# the op kinds; "fused" is a runtime step running several of them (host_fuse.py), never an op's
HOST_KINDS: dict[str, int] = {k: v for k, v in ABI.KINDS.items() if k != "fused"}
DTYPE_CODES: dict[DType, int] = {dt: ABI.DTYPES[dt.value] for dt in DType if dt.value in ABI.DTYPES}
DESC_DTYPE = ABI.DESC_DTYPE


class HostView:
    """One operand of a host op: its buffer name, dtype, element offset and element strides
    over the op's iteration shape (0 = broadcast)."""

    __slots__ = ("buffer", "dtype", "offset", "strides")

    def __init__(self, buffer: str, dtype: DType, offset: int, strides: Sequence[int]) -> None:
        self.buffer = buffer
        self.dtype = dtype
        self.offset = int(offset)
        self.strides = tuple(int(s) for s in strides)


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense row-major array."""
    out, acc = [], 1
    for d in reversed(tuple(shape)):
        out.append(acc)
        acc *= int(d)
    return tuple(reversed(out))


def encode_descriptor(kind: str, shape: Sequence[int], views: Sequence[HostView], code: int = 0,
                      axis_mask: int = 0, iparams: Sequence[int] = ()) -> np.ndarray:
    """The ``rj_host_op`` bytes (np.uint8[DESC_BYTES]) of one op; views[0] is the output.
    Encoded once per compile per structure (layers repeat them; the cross-context copies of an
    image differ in their offsets only), each caller's offsets set in its own copy."""
    shape, iparams = tuple(int(d) for d in shape), tuple(int(p) for p in iparams)
    key = ("host_descriptor", kind, shape, tuple((v.dtype, v.strides) for v in views),
           int(code), int(axis_mask), iparams)
    at_zero = [HostView(v.buffer, v.dtype, 0, v.strides) for v in views]
    out = memo(key, lambda: _encode(kind, shape, at_zero, code, axis_mask, iparams)).copy()
    return set_offsets(out, [v.offset for v in views])


def set_offsets(desc: np.ndarray, offsets: Sequence[int]) -> np.ndarray:
    """``desc`` (a descriptor's bytes, the caller's own copy) with view i at ``offsets[i]``."""
    fields = desc.view(DESC_DTYPE)["view"][0]
    for i, off in enumerate(offsets):
        fields["offset"][i] = off      # as _encode sets it (an out-of-range one raises)
    return desc


def _encode(kind: str, shape: tuple[int, ...], views: Sequence[HostView], code: int,
            axis_mask: int, iparams: Sequence[int]) -> np.ndarray:
    if len(shape) > MAX_RANK:
        raise LoweringError(f"host op {kind}: rank {len(shape)} exceeds the host library's "
                            f"{MAX_RANK} dimensions; reshape to fewer dimensions first")
    if not 1 <= len(views) <= MAX_OPERANDS:
        raise LoweringError(f"host op {kind}: {len(views)} operands, the library takes 1.."
                            f"{MAX_OPERANDS}")
    d = np.zeros((), DESC_DTYPE)
    d["magic"], d["version"], d["kind"], d["code"] = MAGIC, VERSION, HOST_KINDS[kind], code
    d["rank"], d["ninputs"], d["axis_mask"] = len(shape), len(views) - 1, axis_mask
    d["shape"][:len(shape)] = shape
    for i, v in enumerate(views):
        if len(v.strides) != len(shape):
            raise LoweringError(f"host op {kind}: operand {i} has {len(v.strides)} strides for "
                                f"rank {len(shape)}")
        d["view"][i]["dtype"], d["view"][i]["offset"] = DTYPE_CODES[v.dtype], v.offset
        d["view"][i]["stride"][:len(shape)] = v.strides
    d["iparam"][:len(iparams)] = iparams
    return np.frombuffer(d.tobytes(), np.uint8).copy()


def view_span(shape: Sequence[int], offset: int, strides: Sequence[int]) -> tuple[int, int] | None:
    """Lowest and highest element a view reaches, or None when the shape is empty."""
    if any(int(n) == 0 for n in shape):
        return None
    lo = hi = int(offset)
    for n, s in zip(shape, strides):
        span = (int(n) - 1) * int(s)
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi


def view_run(shape: Sequence[int], offset: int, strides: Sequence[int],
             esize: int) -> tuple[int, int, int, int] | None:
    """The bytes a view reads or writes as one strided run (byte offset, pieces, pitch, chunk):
    its widest-strided axis as the pieces, everything inside one piece as the chunk (the span
    of the other axes). None where that would not cover the view exactly enough to be worth it
    (a negative stride, or pieces that overlap) or the shape is empty."""
    dims = [(int(s), int(n)) for n, s in zip(shape, strides) if int(n) > 1 and int(s) != 0]
    if any(int(n) == 0 for n in shape) or any(s < 0 for s, _ in dims):
        return None
    if not dims:
        return int(offset) * esize, 1, esize, esize
    dims.sort(reverse=True)
    (pitch, pieces), inner = dims[0], dims[1:]
    chunk = (sum((n - 1) * s for s, n in inner) + 1) * esize
    if chunk >= pitch * esize:
        span = (sum((n - 1) * s for s, n in dims) + 1) * esize
        return int(offset) * esize, 1, span, span
    return int(offset) * esize, pieces, pitch * esize, chunk


def view_runs(shape: Sequence[int], views: Sequence[HostView]) -> dict[str, tuple[int, int, int, int]]:
    """``view_run`` of every view over ``shape``, by buffer name (views it declines left out)."""
    return {v.buffer: r for v in views
            if (r := view_run(shape, v.offset, v.strides, v.dtype.to_numpy().itemsize)) is not None}
