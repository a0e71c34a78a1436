"""Host steps as the C library defines them (csrc/runtime/host_steps.c), built from Python.

``HOST_STEPS`` is the registry: one constructor per kind. The compiler's partition pass maps
an IR op to a kind name here; each constructor returns a filled ``rj_host_step``.

The host-op kinds (copy, unary, binary, compare, select, reduce, take, iota:
csrc/runtime/rj_host_ops.h, built by rockjit.lowering.host_rules) take their shapes, dtypes
and strides from a descriptor already written into a BO (``desc``); their operands are plain
(BO, byte offset) addresses."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from . import host_abi
from ._ffi import ffi, lib
from .errors import ProgramError

# the runtime's dtypes (RJ_DT_*: the host-op codes 1..RJ_DT_U8, rj_host_ops.h), by short name
DTYPES: dict[str, int] = {n: c for n, c in host_abi.DTYPES.items() if c <= lib.RJ_DT_U8}


def dtype_code(dtype: str | np.dtype) -> int:
    """The runtime code of a dtype given by short name ("f16") or as numpy spells it."""
    name = dtype if isinstance(dtype, str) and dtype in DTYPES else None
    if name is None:
        try:
            d = np.dtype(dtype)
            name = f"{d.kind}{8 * d.itemsize}"
        except TypeError:
            name = str(dtype)
    try:
        return DTYPES[name]
    except KeyError:
        raise ProgramError(f"host steps support dtypes {sorted(DTYPES)}, not {dtype!r}") from None


@dataclass(frozen=True)
class Operand:
    """``bo`` (program BO index) + byte ``offset``, element dtype and row stride in bytes."""

    bo: int
    offset: int = 0
    dtype: str = "f32"
    row_stride: int = 0


def _fill(dst, op: Operand | None) -> None:
    if op is None:
        dst.bo = lib.RJ_NO_BO
        return
    dst.bo = op.bo
    dst.dtype = dtype_code(op.dtype)
    dst.offset = op.offset
    dst.row_stride = op.row_stride


def _step(kind: int, src: Operand, dst: Operand, aux: Operand | None = None, rows: int = 0,
          cols: int = 0, eps: float = 0.0, params: tuple[int, ...] = (),
          params64: tuple[int, ...] = ()):
    s = ffi.new("rj_host_step *")
    s.kind = kind
    _fill(s.src, src)
    _fill(s.dst, dst)
    _fill(s.aux, aux)
    s.rows, s.cols, s.eps = rows, cols, eps
    for i, p in enumerate(params):
        s.param[i] = p
    for i, p in enumerate(params64):
        s.param64[i] = p
    return s


def _cube(kind: int, src: Operand, dst: Operand, height: int, width: int, channels: int, c2: int,
          esize: int, line_stride: int = 0, surf_stride: int = 0):
    return _step(kind, src, dst, params=(lib.RJ_LAYOUT_CUBE, height, width, channels, c2, esize),
                 params64=(line_stride, surf_stride))


def pack_cube(src: Operand, dst: Operand, **layout: int):
    """Row-major [H][W][C] at src -> feature cube at dst (csrc/layout rj_cube_pack)."""
    return _cube(lib.RJ_HOST_PACK, src, dst, **layout)


def unpack_cube(src: Operand, dst: Operand, **layout: int):
    """Feature cube at src -> row-major [H][W][C] at dst (rj_cube_unpack)."""
    return _cube(lib.RJ_HOST_UNPACK, src, dst, **layout)


def _weight(kind: int, src: Operand, dst: Operand, kernels: int, channels: int, kh: int, kw: int,
            n_group: int, k_group: int, esize: int):
    return _step(kind, src, dst, params=(lib.RJ_LAYOUT_WEIGHT, kernels, channels, kh, kw, n_group,
                                         k_group, esize))


def pack_weight(src: Operand, dst: Operand, **layout: int):
    """Row-major [N][K][KH][KW] -> weight blocks (rj_weight_pack)."""
    return _weight(lib.RJ_HOST_PACK, src, dst, **layout)


# name -> kind code, generated from rj_host_ops.h (tools/gen_host_abi.py)
HOST_OP_KINDS: dict[str, int] = host_abi.KINDS


def _address(dst, op: Operand | None) -> None:
    """A host-op operand: only (BO, offset) matter; the descriptor has dtype and strides, so
    the dtype field is left as bytes and a row stride (which C rejects) is passed through."""
    if op is None:
        dst.bo = lib.RJ_NO_BO
        return
    dst.bo, dst.offset, dst.dtype, dst.row_stride = op.bo, op.offset, lib.RJ_DT_U8, op.row_stride


def host_op(kind: str, dst: Operand, desc: Operand, src: Operand | None = None,
            src1: Operand | None = None, src2: Operand | None = None):
    """A host-op step: ``dst`` the output, ``src``/``src1``/``src2`` inputs 1..3, ``desc`` the
    ``rj_host_op`` descriptor (host_abi.DESC_BYTES bytes; write it into its BO first)."""
    if kind not in HOST_OP_KINDS:
        raise ProgramError(f"host-op kind {kind!r} is not one of {sorted(HOST_OP_KINDS)}")
    s = ffi.new("rj_host_step *")
    s.kind = HOST_OP_KINDS[kind]
    _address(s.dst, dst)
    _address(s.src, src)
    _address(s.aux, desc)
    for i, extra in enumerate((src1, src2)):
        s.param[i] = lib.RJ_NO_BO if extra is None else extra.bo
        s.param64[i] = 0 if extra is None else extra.offset
    return s


HOST_STEPS: dict[str, Callable] = {
    "pack_cube": pack_cube,
    "unpack_cube": unpack_cube,
    "pack_weight": pack_weight,
}
HOST_STEPS.update({name: partial(host_op, name) for name in HOST_OP_KINDS})
