"""Convolutions on the CNA->CORE->DPU path: the conv tasks are task.py's, a tile plan becomes
jobs in tiled.py (shared with emitters/matmul.py, a matmul being a 1x1 conv: matmul-as-conv.md).

Lowerings here:
* ``build_conv2d``: direct conv (kernel, stride, padding incl. asymmetric, dilation), fp16 ->
  fp16/fp32 and int8 -> int32; output rows, output channels and input channels tiled as the
  planner says; each output tile lands at its place in the one whole output cube.
* depthwise (``groups == channels``): CONV_MODE 3 + DW_EN with the depthwise write-out fields
  (notes: depthwise-conv.md, conformance 09), tiled over channels and rows. fp16 only on the
  raw path: the int8 depthwise writer is the requantising mode (depthwise-conv.md "int8
  depthwise"), which ``build_qconv2d`` emits.
* ``build_qconv2d``: int8 -> int8 direct or depthwise with on-chip requantization
  (``ConvRequant``: input zero point as the CNA pad, CPEND for the weight zero point, a BS-ALU
  int32 vector from BRDMA, OUT_CVT scale/shift/offset); rockjit.quant derives the numbers.
* conv1d is a conv2d with time on the height axis and width 1 (notes:
  encodings/whisper-encoder.md "Lower with time on the HEIGHT axis"; rules/conv.py).
* non-overlapping patchify as a host im2col step + a matmul: patchify.py.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.types import DType
from ..layouts import depthwise_weight_layout, weight_layout
from ..op_lowering import BufferSpec, HostStep, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError
from ..tile_choice import plan_conv
from ..tiling import ConvPlan, field_limit
# ConvSpec & co. and the task records are imported from here by rules/conv.py and quant.py
from .conv_spec import ConvLayouts, ConvSpec, conv_layouts, conv_shape, validate  # noqa: F401
from .patchify import choose_patchify, build_patchify_im2col
from .task import ConvRequant  # noqa: F401
from .tiled import (CubeRef, Scratch, TiledTasks, assemble, build_tiled, host_partials,
                    k_accumulation)


def pack_conv_weights(plan: ConvPlan, profile: ChipProfile, w: np.ndarray) -> tuple[np.ndarray, Callable[[int, int], int]]:
    """Weights OIHW (direct) or [C, 1, KH, KW] / [C, KH, KW] (depthwise) -> tile-major bytes.

    Each (kernel tile, K step) block is one contiguous weight layout; with a single K step this is
    exactly the plain layout (its kernel groups are already tile-contiguous)."""
    s = plan.shape
    dt = s.in_dtype.to_numpy()
    w = np.asarray(w)
    if w.dtype != dt:
        raise LoweringError(f"conv weights must be {dt} (got {w.dtype}); cast before lowering")
    if s.depthwise:
        w = w.reshape(w.shape[0], s.kh, s.kw)
        wp = np.zeros((s.channels, s.kh, s.kw), dt)
        wp[:w.shape[0]] = w
        lay = depthwise_weight_layout(profile, s.in_dtype, s.channels, s.kh, s.kw)
        esize = dt.itemsize
        return lay.pack(wp), lambda j, ki: plan.kernels[j].start * s.kh * s.kw * esize
    oc, ic = w.shape[0], w.shape[1]
    wp = np.zeros((s.kernels, s.channels, s.kh, s.kw), dt)
    wp[:oc, :ic] = w.reshape(oc, ic, s.kh, s.kw)
    blobs, offsets, pos = [], {}, 0
    for j, ks in enumerate(plan.kernels):
        for ki, cs in enumerate(plan.channels):
            lay = weight_layout(profile, s.in_dtype, ks.size, cs.size, s.kh, s.kw)
            blob = lay.pack(np.ascontiguousarray(wp[ks.start:ks.start + ks.size, cs.start:cs.start + cs.size]))
            offsets[(j, ki)] = pos
            blobs.append(blob)
            pos += blob.size
    return np.concatenate(blobs), lambda j, ki: offsets[(j, ki)]


def build_conv2d(spec: ConvSpec, in_dtype: DType, out_dtype: DType, profile: ChipProfile,
                 weights: np.ndarray, *, name: str = "conv", patchify: str = "auto",
                 max_rows: int | None = None, max_kernels: int | None = None,
                 max_channels: int | None = None) -> OpLowering:
    """A conv2d with constant weights -> OpLowering.

    Buffers: "x" input (bind 0, per-image cube ``conv_layouts(...).input``, images
    ``in_stride`` apart; shape NCHW), "w" const (prepacked), "y" output (bind 0, cube per image,
    ``out_stride`` apart; shape NCHW with the real channel count), "kacc"/"kpart" scratch when K
    is split, "regcmd". A non-overlapping patchify may instead lower to an im2col host step + a
    matmul (``choose_patchify``; ``patchify`` = "auto" | "direct" | "im2col"), and under "auto"
    so does any ungrouped conv the direct form cannot run (a stride past CONV_X/Y_STRIDE, or no
    direct tiling).
    """
    validate(spec, in_dtype, out_dtype)
    route = choose_patchify(spec, in_dtype, profile) if patchify == "auto" else patchify
    if route == "im2col":
        return build_patchify_im2col(spec, in_dtype, out_dtype, profile, weights, name=name)
    if route != "direct":
        raise LoweringError(f"patchify must be 'auto', 'direct' or 'im2col', got {patchify!r}")
    top = field_limit("CNA_CONV_CON3", "CONV_X_STRIDE", profile.encoding)
    if max(spec.stride) > top:
        raise LoweringError(
            f"stride {spec.stride} of a {'depthwise' if spec.depthwise else 'direct'} conv is past "
            f"CNA_CONV_CON3.CONV_X_STRIDE/CONV_Y_STRIDE (1..{top}), and only an ungrouped conv has "
            f"the im2col + matmul form that takes any stride: use strides <= {top}, or a stride "
            f"dividing it followed by a strided slice (y[..., ::s])")
    shape = conv_shape(spec, in_dtype, out_dtype, profile)
    try:
        plan = plan_conv(shape, profile, max_rows=max_rows, max_kernels=max_kernels,
                         max_channels=max_channels, images=spec.batch)
    except LoweringError:
        if patchify != "auto" or spec.groups != 1:
            raise
        # no direct form for this geometry (a register field, a too-wide input, no CBUF
        # tile): the im2col + matmul route takes any ungrouped conv
        return build_patchify_im2col(spec, in_dtype, out_dtype, profile, weights, name=name)
    lay = conv_layouts(spec, in_dtype, out_dtype, profile)
    want = (spec.out_c, 1 if spec.depthwise else spec.in_c, spec.kh, spec.kw)
    if tuple(np.shape(weights)) != want:
        raise LoweringError(f"conv weights must have shape {want} (OIHW), got {np.shape(weights)}")
    wbytes, woff = pack_conv_weights(plan, profile, np.asarray(weights))
    return _conv_program(spec, plan, profile, lay, wbytes, woff, name)


def _conv_program(spec: ConvSpec, plan: ConvPlan, profile: ChipProfile, lay: ConvLayouts,
                  wbytes: np.ndarray, woff: Callable[[int, int], int], name: str) -> OpLowering:
    s = plan.shape
    tiled = TiledTasks()
    scratch = Scratch("kacc")
    out_total = lay.out_stride * spec.batch
    host = host_partials(plan, out_total)
    for b in range(spec.batch):
        feat = CubeRef("x", b * lay.in_stride, lay.input.line_stride, lay.input.surf_stride)
        out = CubeRef("y", b * lay.out_stride, lay.output.line_stride, lay.output.surf_stride)
        build_tiled(plan, profile, feature=feat, weight_buffer="w", weight_offset=woff, out=out,
                    scratch=scratch, host_partials=host, name=f"{name}.b{b}", into=tiled)
    buffers = [
        BufferSpec("x", "input", lay.in_stride * spec.batch, lay.input, s.in_dtype.value,
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0),
        BufferSpec("w", "const", int(wbytes.size), None, s.in_dtype.value, None, data=wbytes),
        BufferSpec("y", "output", out_total, lay.output, s.out_dtype.value,
                   (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0),
    ]
    steps: list[HostStep] = []
    kbufs, ksteps = k_accumulation(plan, scratch, "y", out_total)
    buffers += kbufs
    steps += ksteps
    return assemble(profile, tiled, buffers, steps, spec.macs())


def build_qconv2d(spec: ConvSpec, profile: ChipProfile, weights: np.ndarray, vector: np.ndarray,
                  requant: ConvRequant, *, name: str = "qconv", max_rows: int | None = None,
                  max_kernels: int | None = None, max_channels: int | None = None) -> OpLowering:
    """An int8 -> int8 conv2d / depthwise with on-chip requantization (``ConvRequant``).

    ``vector``: the int32 per-output-channel operand the BS ALU adds (rockjit.quant folds the
    bias, the zero-point cross term and its range offset into it). Buffers as build_conv2d
    ("x" int8 cube in, "y" int8 cube out, "w" packed weights) plus the const "bias" vector.
    The requant is one pass over the whole accumulator, so the input channels must fit one K
    step (an integer K split sums int32 partials on the host, after which no on-chip requant
    is left); a split is refused, naming the limit."""
    validate(spec, DType.I8, DType.I32)
    if spec.height < profile.min_feature_rows:
        raise LoweringError(
            f"quantized conv input height {spec.height} < {profile.min_feature_rows}: the cube is "
            f"padded with zero rows below the image, which would read as 0 instead of the input "
            f"zero point {requant.pad_value}; pad the image to {profile.min_feature_rows} rows "
            f"with the zero point first")
    shape = conv_shape(spec, DType.I8, DType.I8, profile)
    plan = plan_conv(shape, profile, max_rows=max_rows, max_kernels=max_kernels,
                     max_channels=max_channels, images=spec.batch)
    if plan.k_steps != 1:
        raise LoweringError(
            f"quantized conv {spec.in_c} input channels x {spec.kh}x{spec.kw} need {plan.k_steps} "
            f"K steps in CBUF; the on-chip requant needs the whole sum in one pass. Split the "
            f"input channels into convs that fit (or run this conv as int8 -> int32 and "
            f"requantize on the host)")
    lay = conv_layouts(spec, DType.I8, DType.I8, profile)
    want = (spec.out_c, 1 if spec.depthwise else spec.in_c, spec.kh, spec.kw)
    if tuple(np.shape(weights)) != want:
        raise LoweringError(f"conv weights must have shape {want} (OIHW), got {np.shape(weights)}")
    wbytes, woff = pack_conv_weights(plan, profile, np.asarray(weights))
    vec = np.zeros(lay.output.channels, "<i4")
    vec[:spec.out_c] = np.asarray(vector, np.int64)
    tiled = TiledTasks()
    for b in range(spec.batch):
        feat = CubeRef("x", b * lay.in_stride, lay.input.line_stride, lay.input.surf_stride)
        out = CubeRef("y", b * lay.out_stride, lay.output.line_stride, lay.output.surf_stride)
        build_tiled(plan, profile, feature=feat, weight_buffer="w", weight_offset=woff, out=out,
                    scratch=Scratch("kacc"), host_partials=None, name=f"{name}.b{b}", into=tiled,
                    requant=requant, bias_buffer="bias")
    vb = vec.view(np.uint8)
    buffers = [
        BufferSpec("x", "input", lay.in_stride * spec.batch, lay.input, "i8",
                   (spec.batch, spec.in_c, spec.height, spec.width), bind=0),
        BufferSpec("w", "const", int(wbytes.size), None, "i8", None, data=wbytes),
        BufferSpec("bias", "const", int(vb.size), None, "i32", None, data=vb),
        BufferSpec("y", "output", lay.out_stride * spec.batch, lay.output, "i8",
                   (spec.batch, spec.out_c, spec.out_h, spec.out_w), bind=0),
    ]
    return assemble(profile, tiled, buffers, [], spec.macs())
