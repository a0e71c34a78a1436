"""dot_general -> matmul-as-1x1-conv OpCalls (notes: matmul-as-conv.md).

Operand mapping: the lhs becomes A[M, K] (its free axes folded into M, the contraction last),
the rhs B[N, K] (one row per output column). A compile-time rhs (a resident weight) is packed
into the weight layout once, at compile time (a ``const`` buffer). A run-time rhs (attention's
K and V) has no on-device route into the weight layout, so the op asks for it as row-major fp16
and packs it with a host ``pack_weight`` step (counted in the stats). Batch axes (attention's
heads) become one OpCall per batch element; they are independent, so their jobs share one NPU
step and spread over the cores.

The emitter is ``emitters.matmul.build_matmul`` (tiled over M, N and K).
"""
from __future__ import annotations

import math
import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ...weight_timing import timed
from ..regcmd import LoweringError
from ..weight_cast import to_float16
from .base import NoNpuForm, OpCall, RuleContext, RuleResult, Use, WeightForm, npu_dtype_of
from .row_sum import row_sum_column


def lower_dot_general(ctx: RuleContext) -> RuleResult:
    lhs, rhs = ctx.node.inputs
    out = ctx.node.out
    s = ctx.row_sums.get(out.id)
    why = ""
    if s is not None and out.id in ctx.fp32_values and \
            not (ctx.sliced is not None and ctx.sliced(out)):
        also: list = []
        try:
            call = _matmul_call(ctx, lhs, rhs, out, ctx.node.attrs, row_sum=(s, also))
            return RuleResult([call], also=tuple(also),
                              note=f"the row sums %{s.id} from a ones kernel (rules/row_sum.py)")
        except NoNpuForm as e:
            # the widened product has no form (e.g. its tiles no longer fit): the plain
            # product, and the row sums by their own pass
            why = f"no ones kernel for the row sums %{s.id}: {e}"
    return RuleResult([_matmul_call(ctx, lhs, rhs, out, ctx.node.attrs)], note=why)


def lower_matmul_epilogue(ctx: RuleContext) -> RuleResult:
    """matmul_epilogue{bias}: the bias added by the matmul's own DPU (EW stage, a resident
    broadcast cube), one NPU step instead of the matmul and a channel-add pass. The pipeline
    forms the op only where ``epilogue_accepts`` says the emitter takes it."""
    node = ctx.node
    a = node.attrs
    if a["scale"] or a["residual"] or a["act"] != "none":
        raise NoNpuForm("a matmul epilogue other than a bias is not lowered fused yet "
                        "(expand it: ir/composites.py)")
    lhs, rhs, bias = node.inputs
    b = ctx.const(bias)
    if b is None:
        raise NoNpuForm("a matmul epilogue bias that is not a compile-time constant")
    try:
        return RuleResult([_matmul_call(ctx, lhs, rhs, node.out, a, bias=np.asarray(b))])
    except NoNpuForm as e:
        why = str(e)
    # the emitter refused the fused bias: today's decomposition, the matmul into an
    # intermediate and the bias as a channel-add pass over its cube
    from collections import ChainMap
    from dataclasses import replace

    from ...ir.graph import Node
    from .eltwise import lower_binary_op

    mid = ctx.fresh(node.out.type)
    mm = _matmul_call(ctx, lhs, rhs, mid, a)
    # the add rule reads its operands from a node; the bias as a constant of the output's shape
    add = Node(Op.ADD, (mid, bias), (node.out,), {}, node.loc)
    try:
        full = np.broadcast_to(np.asarray(b), node.out.type.shape)
        res = lower_binary_op(replace(ctx, node=add, consts=ChainMap({bias.id: full}, ctx.consts)))
    except NoNpuForm as e2:
        raise NoNpuForm(f"fused bias refused ({why}); bias pass: {e2}") from None
    return RuleResult([mm, *res.calls], note=f"bias as a separate pass: {why}")


def epilogue_accepts(dot, bias) -> bool:
    """Whether ``lower_matmul_epilogue`` takes ``dot`` + ``bias`` (ir/passes/epilogue.py's
    accept): a matmul this rule maps onto the fp16 NPU path (on that path the emitter's
    bias epilogue refuses nothing: fp16 K steps accumulate on the DPU)."""
    lhs, rhs = dot.inputs
    if any(npu_dtype_of(v.type.dtype) is not DType.F16 for v in (lhs, rhs)):
        return False
    a = dot.attrs
    nb = len(a["lhs_batch"])
    return (len(a["lhs_contract"]) == 1 and len(a["rhs_contract"]) == 1
            and tuple(a["lhs_batch"]) == tuple(range(nb)) == tuple(a["rhs_batch"]))


def _matmul_call(ctx: RuleContext, lhs, rhs, out, attrs, bias: np.ndarray | None = None,
                 row_sum: tuple | None = None) -> OpCall:
    """``row_sum`` = (the row-sum value, a list the call appends its ``also`` entry to):
    the rhs widened by a ones kernel whose output column is that value (rules/row_sum.py)."""
    from ..emitters import matmul as mm

    for v in (lhs, rhs):
        if npu_dtype_of(v.type.dtype) is not DType.F16:
            raise NoNpuForm(f"operand dtype {v.type.dtype.value}: the NPU matmul runs float "
                            f"(as fp16) here; int8 matmuls need quantized graphs")
    lc, rc = tuple(attrs["lhs_contract"]), tuple(attrs["rhs_contract"])
    lb, rb = tuple(attrs["lhs_batch"]), tuple(attrs["rhs_batch"])
    if len(lc) != 1 or len(rc) != 1:
        raise NoNpuForm("a contraction over several axes (reshape them into one first)")
    nb = len(lb)
    if lb != tuple(range(nb)) or rb != tuple(range(nb)):
        raise NoNpuForm("batch axes that are not the leading axes of both operands")
    ls, rs = lhs.type.shape, rhs.type.shape
    if rs[:nb] != ls[:nb]:
        raise NoNpuForm("batch extents differ between the operands")
    lfree = [i for i in range(nb, len(ls)) if i != lc[0]]
    rfree = [i for i in range(nb, len(rs)) if i != rc[0]]
    if len(rfree) != 1:
        raise NoNpuForm(f"rhs with {len(rfree)} free axes (the NPU matmul has one N axis)")
    k, n = ls[lc[0]], rs[rfree[0]]
    m = int(math.prod([ls[i] for i in lfree])) if lfree else 1
    batch = int(math.prod(ls[:nb])) if nb else 1
    if min(m, k, n, batch) < 1:
        raise NoNpuForm("an empty matmul")
    # A = lhs with the contraction last; B = rhs as [N, K]
    a_perm = None
    if lc[0] != len(ls) - 1:
        a_perm = tuple(range(nb)) + tuple(lfree) + (lc[0],)
    b_perm = None if rc[0] == len(rs) - 1 else tuple(range(nb)) + (len(rs) - 1, len(rs) - 2)
    w = ctx.const(rhs)
    if w is not None:
        with timed("pack"):      # its bytes are counted once, packed (emitters/matmul.py)
            # cast in the weight's own memory order (a dense run for the C cast), then
            # transposed as a view: the packer reads it strided (emitters/matmul.py)
            w = to_float16(w)
            if b_perm:
                w = np.transpose(w, b_perm)
            w = w.reshape((batch, n, k) if batch > 1 else (n, k))
    bshape = (batch,) if batch > 1 else ()
    try:
        # N padded to the K atom: the output cube is then the next matmul's A (K%32,
        # cross-op-chaining.md) and a dense run of whole EW chunks, so the element-wise ops
        # that follow keep it in place
        # ... except for a concat piece, which is written into its channel slice of the
        # concat's cube: padding it past the N atom would reach into the next piece
        align = None if ctx.sliced is not None and ctx.sliced(out) else \
            ctx.profile.input(DType.F16).k_align
        ep = None if bias is None else mm.MatmulEpilogue(bias=bias.astype(np.float16))
        out_dt = DType.F32 if out.id in ctx.fp32_values and bias is None else DType.F16
        col = None if row_sum is None or bias is not None or out_dt is not DType.F32 else \
            row_sum_column(n, align or 1)
        if col is not None:
            # the ones kernel right after the product's own padded kernels; no further
            # output padding: the column is read by the host tail only
            if w is not None:
                w = col.weights(w, n)
            prog = mm.build_matmul(m, k, col.kernels, DType.F16, out_dt, ctx.profile,
                                   batch=batch, b=w, name=f"mm{out.id}")
        else:
            prog = mm.build_matmul(m, k, n, DType.F16, out_dt, ctx.profile, batch=batch, b=w,
                                   out_channel_align=align, name=f"mm{out.id}", epilogue=ep)
        emitter = "matmul.lower_matmul"
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    ops = [Use(lhs, (), a_perm, bshape + (m, k))]
    if w is None:
        ops.append(Use(rhs, (), b_perm, bshape + (n, k)))
    plus = "" if bias is None else " + bias"
    res = Use(out, (), None, bshape + (m, n))
    if col is None:
        return OpCall(prog, tuple(ops), (res,), label=f"matmul {batch}x{m}x{k}x{n}{plus}",
                      emitter=emitter)
    c = prog.buffer("c")
    item = c.nbytes // batch
    forms_in = None
    if w is None:
        b = prog.buffer("b")
        forms_in = (None, WeightForm(b.layout, bshape + (n, k), b.nbytes // batch
                                     if batch > 1 else 0, ones=col.n_pad))
    s_form, s_off = col.sum_form(c.layout, m, batch, item)
    row_sum[1].append((row_sum[0], out, s_form, s_off))
    return OpCall(prog, tuple(ops), (res,), label=f"matmul {batch}x{m}x{k}x{n} + row sum",
                  emitter=emitter + " + ones kernel (row sum)", forms_in=forms_in,
                  forms_out=(col.product_form(c.layout, bshape + (m, n), batch, item),))


RULES = {Op.DOT_GENERAL: lower_dot_general, Op.MATMUL_EPILOGUE: lower_matmul_epilogue}
