"""Reductions over the feature (last) axis: the sum on the NPU (MACs), the max on the PPU.

* ``reduce_sum`` over the last axis of a float tensor -> a feature
  reduce: a matmul against a ones row with fp32 accumulation and an fp32 result (notes:
  encodings/feature-reduce.md). The result stays in the matmul's fp32 output cube (value of
  row p in channel 0, at byte 16 p); its consumers -- the O(rows) tails of LayerNorm and
  softmax -- read it from there. A single long cube whose channels are the flat split's equal
  whole K groups is summed per plane range, each part on the core holding those planes, the
  host adding the fp32 partials (``_plane_split_sum``); else its rows are offered as one job
  per core (``row_chain.row_parts``). A tensor held as several cubes (attention's heads) is one
  batched matmul whose jobs are independent.
* ``reduce_max`` over the last axis: the NPU's matmul and feature reduce only sum (notes:
  encodings/whisper-encoder.md), but the PPU max-pools. A matrix cube's channel groups are
  also the lines of a cube the PPU can pool (emitters/pool.build_row_max), which leaves the
  max over the groups per row and lane; the host takes the max over the 8 lanes (and a last
  partial group's real lanes) into the fp32 per-row vector the consumers read. Where that
  does not apply or the cost model puts the host lower, the host-op library reduces each row
  of the operand (read in place from its cube, strided_conversion.py).

Anything else (other axes, integer sums) has no NPU form here and goes to the host rules.
"""
from __future__ import annotations

import math
import numpy as np

from ... import debugflags
from ...ir.ops import Op
from ...ir.types import DType
from ..compile_cache import memo
from ..host_descriptor import view_runs
from ..layouts import CubeLayout
from ..op_lowering import BufferSpec, HostStep, OpLowering
from ..profile import ChipProfile
from ..regcmd import LoweringError
from .base import CubeForm, NoNpuForm, OpCall, RowForm, RuleContext, RuleResult, Use
from .eltwise import operand_form
from .row_chain import row_parts
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
        return 1, int(math.prod(shape[:-1])) if len(shape) > 1 else 1, 0
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
    if batch == 1:
        by_planes = _plane_split_sum(ctx, form, m, k)
        if by_planes is not None:
            return by_planes
    ones = np.ones((1, k), np.float16)
    try:
        prog = build_matmul(m, k, 1, DType.F16, DType.F32, ctx.profile, batch=batch, b=ones,
                            name=f"rsum{node.out.id}", max_m=row_parts(ctx, batch, m, k))
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


def _plane_split_sum(ctx: RuleContext, form: CubeForm, m: int, k: int) -> RuleResult | None:
    """The feature reduce of one long cube split by channel planes instead of rows (issue 9):
    part i sums channels [i K/P, (i+1) K/P) of every row into an fp32 partial (a batched ones
    matmul whose items are the cube's own plane ranges, read in place), and the host adds the
    P partials into the cube the unsplit reduce writes. The parts are the flat view's
    (``flat_parts``, the cuts of ``eltwise_row._kernel_parts``): the planes the producing pass
    or matmul tile wrote on a core are the planes its part sums, so placement keeps each part
    on that core, the sum joins its producer's NPU step (coalesce.py) and no row of the cube
    crosses cores -- only P small partials reach the host, which reads the sum anyway (a norm's
    or a softmax's O(rows) tail). A row split moves two thirds of the cube between contexts
    before every norm statistic (ModernBERT-512: 0.52 MB each, eight per layer).

    The sum is the same fp32 sum of the same fp16 terms in another order (each part in the
    CORE's fp32 accumulator, the parts in f32 on the host): range_rewrites' bounds hold for any
    order. None where the parts are not whole, equal K groups of a dense single-plane-row
    cube (the row split then), or the matmul's item layout is not the cube's own."""
    from ..emitters.eltwise_row import _kernel_parts
    from ...ir.types import TensorType
    from .eltwise_vectors import flat_parts

    if debugflags.enabled(debugflags.ROW_SPLIT.name) or ctx.fresh is None or \
            debugflags.enabled(debugflags.NO_PLANE_SPLIT.name):
        return None
    node = ctx.node
    x = node.inputs[0]
    if x.id in ctx.consts:
        return None
    lay = form.layout
    p = ctx.profile.input(DType.F16)
    if lay.dtype != np.float16 or lay.width != 1 or form.roles[-1:] != ("c",) or \
            lay.surf_stride != lay.height * ctx.profile.atom_bytes or lay.channels != k:
        return None
    parts = flat_parts(ctx, form)
    if parts < 2:
        return None
    cuts = _kernel_parts(lay, ctx.profile, parts)
    kp = k // parts
    if len(cuts) != parts - 1 or k % parts or kp % p.k_align or \
            cuts != tuple(kp * i for i in range(1, parts)):
        return None
    # a function of the geometry alone, once per compile (every layer's norm asks again; the
    # task names reach error messages only, as a reused matmul's do)
    progs = memo(("plane_split_sum", lay, m, k, parts, ctx.profile),
                 lambda: _plane_split_programs(ctx.profile, lay, m, kp, parts,
                                               f"rsum{node.out.id}"))
    if progs is None:
        return None
    prog, host_prog = progs
    c = prog.buffer("c")
    item = c.nbytes // parts
    partials = ctx.fresh(TensorType(DType.F32, (parts, m)))
    part_form = F.cube_form(c.layout, (parts, m), ("b", "h"), item_stride=item)
    npu = OpCall(prog, (Use(x),), (Use(partials, shape=(parts, m), roles=("b", "h")),),
                 f"reduce_sum {m}x{k} in {parts} plane ranges",
                 emitter="reduce.feature_reduce (ones matmul per plane range)",
                 forms_in=(form,), forms_out=(part_form,))
    out_form = F.cube_form(c.layout, (m,), ("h",))
    host = OpCall(host_prog, (Use(partials),), (Use(node.out, shape=(m,), roles=("h",)),),
                  "sum of the plane-range partials", where="host",
                  emitter="host sum of a feature reduce's partials", forms_in=(part_form,),
                  forms_out=(out_form,))
    return RuleResult([npu, host])


def _plane_split_programs(profile: ChipProfile, lay: CubeLayout, m: int, kp: int, parts: int,
                          name: str) -> tuple[OpLowering, OpLowering] | None:
    """``_plane_split_sum``'s two programs: the batched ones matmul whose items are the cube's
    plane ranges, and the host sum of its partials (None: the matmul's items would not be the
    cube's own planes)."""
    from ..emitters.matmul import build_matmul
    from ..host_rules import REDUCE_CODES, HostView, host_op_step

    p = profile.input(DType.F16)
    try:
        prog = build_matmul(m, kp, 1, DType.F16, DType.F32, profile, batch=parts,
                            b=np.ones((1, kp), np.float16), name=name)
    except LoweringError:
        return None
    a, c = prog.buffer("a"), prog.buffer("c")
    plane = lay.surf_stride
    if a.layout.surf_stride != plane or a.layout.height != lay.height or \
            a.nbytes != parts * (kp // p.feature_c2) * plane:
        return None       # the matmul would not read the cube's own planes as its items
    item = c.nbytes // parts
    if item != c.layout.nbytes or item % 4:
        return None
    # the host adds channel 0 of each row (the sum; the ones matmul's other channels are 0)
    # into a result whose other bytes stay zero (``zero``: filled once, never shared), as the
    # unsplit matmul's cube holds them
    row = c.layout.line_stride // 4
    sizes = {"parts": c.nbytes, "out": item, "d0": 0}
    views = (HostView("out", DType.F32, 0, (row, 0)),
             HostView("parts", DType.F32, 0, (row, item // 4)))
    step, desc = host_op_step("reduce", (m, parts), views[0], views[1:], sizes, "d0",
                              code=REDUCE_CODES[Op.REDUCE_SUM], axis_mask=2,
                              what="the sum of a feature reduce's plane-range partials")
    # it reads channel 0 of each partial's rows and writes channel 0: only those bytes cross
    # contexts, and the cost model counts them alone
    step = HostStep(step.kind, step.operands, {
        "bytes": m * 4 * (parts + 1), "runs": view_runs((m, parts), views)})
    host_prog = OpLowering((BufferSpec("parts", "input", c.nbytes, dtype="f32",
                                       shape=(parts, m), bind=0),
                            BufferSpec("out", "output", item, dtype="f32", shape=(m,), bind=0,
                                       zero=True),
                            desc), (step,))
    return prog, host_prog


def _row_max_host(ctx: RuleContext, why: str) -> RuleResult:
    from ..host_rules import REDUCE_CODES, HostView, host_op_step, row_major_strides

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
                              emitter="host row max", forms_in=(rows_in,), forms_out=(out,))],
                      note=why)


def _row_max_ppu(ctx: RuleContext) -> list[OpCall]:
    """The lane maxima over the operand's whole 8-channel groups on the PPU
    (pool.build_row_max), then on the host the max over the 8 lanes and the real lanes of a
    last partial group (padding lanes are never read): every step selects, so the result is
    the host row max's, bit for bit, for any finite or infinite input. NaN: the PPU's max
    never selects one (simulator; not measured on silicon) where the host row max returns
    NaN -- no NaN reaches an NPU value here (inputs holding NaN are refused,
    value_checks.py; fp16 values are range-planned)."""
    from ..emitters.pool import build_row_max
    from ..host_rules import BINARY_CODES, REDUCE_CODES, HostView, host_op_step
    from ...ir.types import TensorType

    node = ctx.node
    x = node.inputs[0]
    shape = x.type.shape
    if x.id in ctx.consts or ctx.fresh is None:
        raise NoNpuForm("a compile-time operand (folded)")
    form = operand_form(ctx, x)
    lay = form.layout
    roles = [r for r in form.roles if r != "b"]
    nb_lead = len(form.roles) - len(roles)
    if lay.dtype != np.float16 or any(r != "b" for r in form.roles[:nb_lead]) or \
            roles[-1:] != ["c"]:
        raise NoNpuForm("the operand is not an fp16 matrix cube with leading batch axes")
    split = batch_split(form, shape)
    if split is None:
        raise NoNpuForm("the operand's cubes are not a matrix per item")
    batch, rows, step = split
    if batch > 1 and step == rows * lay.line_stride:
        batch, rows, step = 1, batch * rows, 0          # items folded into H: one cube
    c = shape[-1]
    c2 = lay.c2
    try:
        # a function of the geometry alone (its task names reach error messages only, as a
        # reused matmul's do): once per compile for each (every layer's softmax asks again)
        prog = memo(("build_row_max", lay, rows, c, batch, step, ctx.profile),
                    lambda: build_row_max(lay, rows, c, batch, step, ctx.profile,
                                          name=f"rmax{node.out.id}"))
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    lanes_form = RowForm(DType.F16, (batch, rows, c2))
    lanes = ctx.fresh(TensorType(DType.F16, lanes_form.shape))
    ppu = OpCall(prog, (Use(x),), (Use(lanes),), f"row max lanes {batch}x{rows}x{c}",
                 emitter="pool.build_row_max (PPU max pools over the channel groups)",
                 forms_in=(form,), forms_out=(lanes_form,))
    # host: out = max over the 8 lanes [, then max with the partial group's real lanes]
    out = RowForm(DType.F32, node.out.type.shape)
    whole, tail = c // c2, c % c2
    es = lay.esize
    sizes = {"lanes": lanes_form.nbytes, "out": out.nbytes, "x": form.nbytes,
             "tmp": out.nbytes, "d0": 0, "d1": 0, "d2": 0}
    red = REDUCE_CODES[Op.REDUCE_MAX]
    st, d0 = host_op_step("reduce", (batch, rows, c2), HostView("out", DType.F32, 0, (rows, 1, 0)),
                          [HostView("lanes", DType.F16, 0, (rows * c2, c2, 1))], sizes, "d0",
                          code=red, axis_mask=4, what="row max over the PPU's lanes")
    steps, specs = [st], [BufferSpec("lanes", "input", lanes_form.nbytes, dtype="f16",
                                     shape=lanes_form.shape, bind=0),
                          BufferSpec("out", "output", out.nbytes, dtype="f32", shape=out.shape,
                                     bind=0), d0]
    operands, forms_in = (Use(lanes),), (lanes_form,)
    if tail:
        views = (HostView("tmp", DType.F32, 0, (rows, 1, 0)),
                 HostView("x", DType.F16, whole * lay.surf_stride // es,
                          (step // es, lay.line_stride // es, 1)))
        st, d1 = host_op_step("reduce", (batch, rows, tail), views[0], views[1:], sizes, "d1",
                              code=red, axis_mask=4, what="row max over the last group's lanes")
        # the step reads only the real lanes of one group, not the whole cube it binds: the
        # copies between contexts bring only those bytes (context_copies.host_runs; the whole
        # cube was every head's scores: Whisper-base 22.6 MB a layer)
        steps.append(HostStep(st.kind, st.operands, {
            "bytes": batch * rows * (tail * es + 4),
            "runs": view_runs((batch, rows, tail), views)}))
        n = batch * rows
        st, d2 = host_op_step("binary", (n,), HostView("out", DType.F32, 0, (1,)),
                              [HostView("out", DType.F32, 0, (1,)),
                               HostView("tmp", DType.F32, 0, (1,))], sizes, "d2",
                              code=BINARY_CODES[Op.MAX], what="row max of the two parts")
        steps.append(st)
        specs += [BufferSpec("x", "input", form.nbytes, layout=lay, bind=1),
                  BufferSpec("tmp", "scratch", out.nbytes), d1, d2]
        operands, forms_in = (Use(lanes), Use(x)), (lanes_form, form)
    host = OpCall(OpLowering(tuple(specs), tuple(steps)), operands, (Use(node.out),),
                  "row max of the lanes", where="host", emitter="host max over the PPU's lanes",
                  forms_in=forms_in, forms_out=(out,))
    return [ppu, host]


def lower_reduce_max(ctx: RuleContext) -> RuleResult:
    """On the PPU (_row_max_ppu) where the operand is a matrix cube and the cost model
    (host_or_npu.cheapest) puts it below the host row max (always with ROCKJIT_NPU_FIRST);
    the host row max otherwise."""
    from ..host_or_npu import cheapest

    _last_axis(ctx)
    host = _row_max_host(ctx, "")
    try:
        npu = _row_max_ppu(ctx)
    except NoNpuForm as e:
        host.note = f"no PPU row max: {e}"
        return host
    if debugflags.enabled(debugflags.NPU_FIRST.name):
        return RuleResult(npu, note="ROCKJIT_NPU_FIRST")
    pick, why = cheapest(ctx, [("PPU row max", npu), ("host row max", host.calls)])
    if pick == 1:
        host.note = why
        return host
    return RuleResult(npu, note=why)


RULES = {Op.REDUCE_SUM: lower_reduce_sum, Op.REDUCE_MAX: lower_reduce_max}
