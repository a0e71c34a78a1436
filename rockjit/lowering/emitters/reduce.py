"""Reductions over the feature (channel) axis, per row: sum / mean on the NPU, max on the host.

* sum / mean: a matmul against a ones vector (notes: encodings/feature-reduce.md, "reduce over
  K is a matmul against a ones vector"): out[m] = sum_k x[m, k] * 1 with fp32 accumulation and
  an fp32 result (the consumer -- LayerNorm's mean and E[x^2], softmax's denominator -- wants
  every bit). The PPU cannot contract channels (same page), so no pooling form exists. The
  mean uses the weight fp16(1/K) instead of 1: one extra relative rounding of at most 2^-12
  (half an fp16 ulp of 1/K; exact when K is a power of two). This calls the tiled
  ``matmul.lower_matmul`` (N = 1, B = the ones row), so every M / K size it tiles works.
* max: the NPU has no feature-axis max datapath -- the matmul and the feature reduce only sum
  (notes: whisper-encoder.md, "matmul/the feature-reduce can only sum, never max") -- so the row
  max is a host step: ``unpack_cube`` (cube -> row-major) then ``row_max`` (csrc/runtime/
  host_steps.c; rockjit/runtime/host_steps.py names and arguments).

HostStep encoding used here (for the pipeline that turns it into ``rj_host_step``): ``kind`` is
the HOST_STEPS name; ``operands`` are keyed by the constructor's operand argument names
(src, dst, stat, ...); ``params`` holds the constructor's other keyword arguments plus
``dtypes`` {operand: dtype} and ``row_strides`` {operand: bytes} for the Operand fields.
"""
from __future__ import annotations

import numpy as np

from ...ir.types import DType
from ..layouts import CubeLayout, feature_layout
from ..opprogram import BufferSpec, HostStep, OpProgram, Slice
from ..profile import ChipProfile
from ..regcmd import LoweringError
from .eltwise import EW_VIEW_CHANNELS, check_fp16_cube, resolve_profile
from .matmul import lower_matmul

REDUCTIONS = ("sum", "mean")


def lower_feature_reduce(kind: str, rows: int, channels: int,
                         profile: ChipProfile | str | None = None) -> OpProgram:
    """out[m] = sum (or mean) over k of x[m, k] for an fp16 matrix x [rows, channels].

    The program is ``matmul.lower_matmul(rows, channels, 1, f16, f32, b=ones)``: buffers ``a``
    (input 0, the matmul's A layout: rows padded to the row atom, channels to the K atom, pad
    lanes finite -- they meet zero weights), ``b`` (const ones row), ``c`` (output 0: the fp32
    [rows_pad, 16] output cube, the result in column 0, columns 1..15 zero), plus whatever
    scratch and regcmd the tiled matmul needs."""
    profile = resolve_profile(profile)
    if kind not in REDUCTIONS:
        raise LoweringError(f"feature reduction {kind!r} is not one of {', '.join(REDUCTIONS)}; "
                            f"a row max is lower_row_max (a host step)")
    if rows < 1 or channels < 1:
        raise LoweringError(f"feature reduce of a {rows}x{channels} matrix: both must be >= 1")
    w = 1.0 if kind == "sum" else 1.0 / channels
    ones = np.full((1, channels), w, np.float16)
    return lower_matmul(rows, channels, 1, DType.F16, DType.F32, profile, b=ones,
                        name=f"reduce_{kind}")


def lower_row_max(layout: CubeLayout, out_format: str = "row_vector",
                  profile: ChipProfile | str | None = None) -> OpProgram:
    """out[p] = max over channels of x[p, :] for every position p (row) of an fp16 cube.

    ``out_format``: "row_vector" writes fp16 maxima into the per-row operand form of
    eltwise.lower_binary_row (``row_vector_layout``: the max of row p at byte 16 p), so
    softmax's ``x - rowmax`` runs on the NPU next; "f32" writes a plain float32 [P] vector.
    Buffers: ``x`` (input 0), ``rows`` (scratch, row-major fp16 [P, C]), ``out`` (output 0).
    Steps: HostStep("unpack_cube"), HostStep("row_max")."""
    profile = resolve_profile(profile)
    check_fp16_cube(layout, profile, "row max")
    if out_format not in ("row_vector", "f32"):
        raise LoweringError(f"row max out_format must be 'row_vector' or 'f32', got {out_format!r}")
    positions = layout.height * layout.width
    c = layout.channels
    dense = positions * c * 2
    if out_format == "row_vector":
        out_lay = feature_layout(profile, DType.F16, positions, 1, EW_VIEW_CHANNELS)
        out_spec = BufferSpec("out", "output", out_lay.nbytes, layout=out_lay, bind=0)
        dtype, stride, nbytes = "f16", profile.atom_bytes, out_lay.nbytes
    else:
        out_spec = BufferSpec("out", "output", positions * 4, dtype="float32", shape=(positions,),
                              bind=0)
        dtype, stride, nbytes = "f32", 4, positions * 4
    unpack = HostStep("unpack_cube", {"src": Slice("x", 0, layout.nbytes),
                                      "dst": Slice("rows", 0, dense)},
                      {"height": layout.height, "width": layout.width, "channels": c,
                       "c2": layout.c2, "esize": layout.esize,
                       "line_stride": layout.line_stride, "surf_stride": layout.surf_stride,
                       "dtypes": {"src": "f16", "dst": "f16"}, "row_strides": {}})
    rmax = HostStep("row_max", {"src": Slice("rows", 0, dense), "dst": Slice("out", 0, nbytes)},
                    {"rows": positions, "cols": c, "dtypes": {"src": "f16", "dst": dtype},
                     "row_strides": {"src": c * 2, "dst": stride}})
    bufs = (BufferSpec("x", "input", layout.nbytes, layout=layout, bind=0),
            BufferSpec("rows", "scratch", dense, dtype="float16", shape=(positions, c)),
            out_spec)
    return OpProgram(bufs, (unpack, rmax))
