"""Reductions over the feature (last) axis: the sum on the NPU, the max on the host.

* ``reduce_sum`` over the last axis of a float tensor -> a feature
  reduce: a matmul against a ones row with fp32 accumulation and an fp32 result (notes:
  encodings/feature-reduce.md). The result stays in the matmul's fp32 output cube (value of
  row p in channel 0, at byte 16 p); its consumers -- the O(rows) tails of LayerNorm and
  softmax -- read it from there. A tensor held as several cubes (attention's heads) is one
  batched matmul whose jobs are independent.
* ``reduce_max`` over the last axis -> host: the NPU's matmul and feature reduce only sum
  (notes: encodings/whisper-encoder.md), so the operand is read row-major (fp16 rows, unpacked
  from its cube; max commutes with the fp16 rounding) and the host-op library reduces each row
  into an fp32 per-row vector.

Anything else (other axes, integer sums) has no NPU form here and goes to the host rules.
"""
from __future__ import annotations

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ..op_lowering import BufferSpec, OpLowering
from ..regcmd import LoweringError
from .base import CubeForm, NoNpuForm, OpCall, RowForm, RuleContext, RuleResult, Use
from .eltwise import operand_form
from . import forms as F


def _last_axis(ctx: RuleContext) -> None:
    node = ctx.node
    x = node.inputs[0]
    r = len(x.type.shape)
    if r < 1 or tuple(node.attrs["axes"]) != (r - 1,):
        raise NoNpuForm(f"a reduction over axes {tuple(node.attrs['axes'])} (only the last, "
                        f"feature axis has an on-device form)")
    if not x.type.dtype.is_float:
        raise NoNpuForm(f"{x.type.dtype.value} reductions run on the host")


def batch_split(form: CubeForm, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(batch, rows per item, item stride) when ``form`` holds a matrix-like value [..., rows,
    C] as equally spaced cubes with the rows in H; None otherwise."""
    items = form.batch_items()
    if form.roles[-1] != "c" or "w" in form.roles and form.hwc()[1] != 1:
        return None
    if len(items) == 1:
        return 1, int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1, 0
    offs = [off for _, off in items]
    step = offs[1] - offs[0]
    if any(b - a != step for a, b in zip(offs, offs[1:])) or step <= 0:
        return None
    return len(items), form.hwc()[0], step


def lower_reduce_sum(ctx: RuleContext) -> RuleResult:
    from ..emitters.matmul import build_matmul

    _last_axis(ctx)
    node = ctx.node
    x = node.inputs[0]
    shape = x.type.shape
    k = shape[-1]
    form = operand_form(ctx, x)
    split = batch_split(form, shape)
    if split is None:
        raise NoNpuForm("the operand's cubes are not a matrix per item")
    batch, m, _ = split
    ones = np.ones((1, k), np.float16)
    try:
        prog = build_matmul(m, k, 1, DType.F16, DType.F32, ctx.profile, batch=batch, b=ones,
                            name=f"rsum{node.out.id}")
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    c = prog.buffer("c")
    if batch > 1:
        use_in = Use(x, shape=(batch, m, k))
        use_out, roles = (batch, m), ("b", "h")
        out_form = F.cube_form(c.layout, use_out, roles, item_stride=c.nbytes // batch)
    else:
        use_in = Use(x, shape=(m, k))
        use_out, roles = (m,), ("h",)
        out_form = F.cube_form(c.layout, use_out, roles)
    return RuleResult([OpCall(prog, (use_in,), (Use(node.out, shape=use_out, roles=roles),),
                              f"reduce_sum {batch}x{m}x{k}", emitter="reduce.feature_reduce "
                              "(ones matmul)", forms_out=(out_form,))])


def lower_reduce_max(ctx: RuleContext) -> RuleResult:
    from ..host_rules import REDUCE_CODES, HostView, host_op_step, row_major_strides

    _last_axis(ctx)
    node = ctx.node
    x = node.inputs[0]
    shape = x.type.shape
    rank = len(shape)
    rows_in = RowForm(DType.F16, shape)
    out = RowForm(DType.F32, node.out.type.shape)
    ostr = tuple(row_major_strides(shape[:-1])) + (0,)
    sizes = {"x": rows_in.nbytes, "out": out.nbytes, "desc0": 0}
    step, desc = host_op_step("reduce", shape, HostView("out", DType.F32, 0, ostr),
                              [HostView("x", DType.F16, 0, row_major_strides(shape))], sizes,
                              "desc0", code=REDUCE_CODES[Op.REDUCE_MAX],
                              axis_mask=1 << (rank - 1), what="row max")
    prog = OpLowering((BufferSpec("x", "input", rows_in.nbytes, dtype="f16", shape=shape, bind=0),
                      BufferSpec("out", "output", out.nbytes, dtype="f32", shape=out.shape,
                                 bind=0), desc), (step,))
    return RuleResult([OpCall(prog, (Use(x),), (Use(node.out),), "row max", where="host",
                              emitter="host row max (no NPU max over channels)",
                              forms_in=(rows_in,), forms_out=(out,))],
                      note="the NPU reduces channels only by summing")


RULES = {Op.REDUCE_SUM: lower_reduce_sum, Op.REDUCE_MAX: lower_reduce_max}
