"""conv -> emitters/conv.py: direct conv2d, depthwise, conv1d (time on the rows), patchify.

The IR's conv is N,C,*S x O,I,*K (the frontend transposes any dimension numbers into this
order). The weight must be a compile-time value (a resident param): it is packed into the
weight layout once. The NPU reads the image as an H x W x C cube, so the operand is used
through the view N,H,W,C (a permutation of the value's axes: free when the value is already a
cube, a counted host transpose + pack when it arrives row-major NCHW); the result is written as
one cube per image whose logical axes are N,OC,OH,OW (roles b,c,h,w), so a following
transpose to N,OH,OW,OC (channels last, the matmul's K) is a view.

Routes (emitters/conv.build_conv2d): direct or depthwise convolution on the CNA, or for a
non-overlapping patchify (stride == kernel) im2col on the host + a matmul when that does less
MAC work (SigLIP's 16x16 patches; conv.choose_patchify), or for any ungrouped conv the direct
form cannot run (a stride past the 3-bit CONV_X/Y_STRIDE, no tiling). A conv1d [N,C,T] runs
with time on the cube's rows and width 1 (notes: encodings/whisper-encoder.md).
"""
from __future__ import annotations

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ..regcmd import LoweringError
from .base import CubeForm, NoNpuForm, OpCall, RuleContext, RuleResult, Use, npu_dtype_of
from . import forms as F


def lower_conv(ctx: RuleContext) -> RuleResult:
    from ..emitters import conv as cv

    node = ctx.node
    x, w = node.inputs
    a = node.attrs
    if npu_dtype_of(x.type.dtype) is not DType.F16 or not node.out.type.dtype.is_float:
        raise NoNpuForm(f"{x.type.dtype.value} conv: the NPU conv runs float graphs as fp16 "
                        f"(int8 needs quantized graphs)")
    wc = ctx.const(w)
    if wc is None:
        raise NoNpuForm("a conv whose weights are computed at run time (the weight layout is "
                        "packed at compile time; pass the weights as a resident argument)")
    if any(d != 1 for d in a["lhs_dilation"]):
        raise NoNpuForm("a transposed conv (lhs_dilation > 1)")
    rank = len(x.type.shape)
    if rank not in (3, 4):
        raise NoNpuForm(f"a {rank - 2}-D conv (only conv1d and conv2d map to the CNA)")
    xs, ws, os_ = x.type.shape, w.type.shape, node.out.type.shape
    n, c = xs[0], xs[1]
    oc = ws[0]
    groups = int(a["feature_group_count"])
    stride, pad, dil = tuple(a["window_strides"]), tuple(a["padding"]), tuple(a["rhs_dilation"])
    if rank == 3:
        spec = cv.ConvSpec(n, c, xs[2], 1, oc, ws[2], 1, (stride[0], 1),
                           (tuple(pad[0]), (0, 0)), (dil[0], 1), groups)
        w4 = np.asarray(wc).reshape(*ws, 1)
        perm_in, roles_out = (0, 2, 1), ("b", "c", "h")
        seen_in = (n, xs[2], c)
        roles_in = ("b", "h", "c")
    else:
        spec = cv.ConvSpec(n, c, xs[2], xs[3], oc, ws[2], ws[3], stride, (tuple(pad[0]),
                           tuple(pad[1])), dil, groups)
        w4 = np.asarray(wc)
        perm_in, roles_out = (0, 2, 3, 1), ("b", "c", "h", "w")
        seen_in = (n, xs[2], xs[3], c)
        roles_in = ("b", "h", "w", "c")
    if any(p < 0 for pr in spec.padding for p in pr):
        raise NoNpuForm("negative padding (a crop) in a conv")
    w16 = w4.astype(np.float16)
    try:
        prog = cv.build_conv2d(spec, DType.F16, DType.F16, ctx.profile, w16,
                               name=f"conv{node.out.id}")
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    xb, yb = prog.buffer("x"), prog.buffer("y")
    if xb.layout is None:
        # im2col route: the pixels row-major NCHW, as fp16
        use_in = Use(x)
        form_in = None
        route = "conv.lower_conv2d[im2col + matmul]"
    else:
        use_in = Use(x, (), perm_in, seen_in, roles_in)
        form_in = F.cube_form(xb.layout, seen_in, roles_in, item_stride=xb.nbytes // n)
        route = "conv.lower_conv2d[depthwise]" if spec.depthwise else "conv.lower_conv2d[direct]"
    ystride = yb.nbytes // n
    lay = yb.layout
    if xb.layout is None:
        # the matmul's cube per image: rows = oy * OW + ox, so OH steps by OW rows
        oh, ow = spec.out_h, spec.out_w
        shape = (n, oc, oh, ow) if rank == 4 else (n, oc, oh)
        if rank == 4:
            form_out = CubeForm(lay, ("b", "c", "b", "h"), (ystride, 0, ow * lay.line_stride, 0),
                                shape)
        else:
            form_out = CubeForm(lay, ("b", "c", "h"), (ystride, 0, 0), shape)
    else:
        form_out = F.cube_form(lay, os_, roles_out, item_stride=ystride)
    return RuleResult([OpCall(prog, (use_in,), (Use(node.out),),
                              f"conv {spec.kh}x{spec.kw}/{spec.stride} {c}->{oc}", emitter=route,
                              forms_in=(form_in,), forms_out=(form_out,))])


RULES = {Op.CONV: lower_conv}
