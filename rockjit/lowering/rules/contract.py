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

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ..regcmd import LoweringError
from .base import NoNpuForm, OpCall, RuleContext, RuleResult, Use, npu_dtype_of


def lower_dot_general(ctx: RuleContext) -> RuleResult:
    from ..emitters import matmul as mm

    node = ctx.node
    lhs, rhs = node.inputs
    out = node.out
    for v in (lhs, rhs):
        if npu_dtype_of(v.type.dtype) is not DType.F16:
            raise NoNpuForm(f"operand dtype {v.type.dtype.value}: the NPU matmul runs float "
                            f"(as fp16) here; int8 matmuls need quantized graphs")
    lc, rc = tuple(node.attrs["lhs_contract"]), tuple(node.attrs["rhs_contract"])
    lb, rb = tuple(node.attrs["lhs_batch"]), tuple(node.attrs["rhs_batch"])
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
    m = int(np.prod([ls[i] for i in lfree], dtype=np.int64)) if lfree else 1
    batch = int(np.prod(ls[:nb], dtype=np.int64)) if nb else 1
    if min(m, k, n, batch) < 1:
        raise NoNpuForm("an empty matmul")
    # A = lhs with the contraction last; B = rhs as [N, K]
    a_perm = None
    if lc[0] != len(ls) - 1:
        a_perm = tuple(range(nb)) + tuple(lfree) + (lc[0],)
    b_perm = None if rc[0] == len(rs) - 1 else tuple(range(nb)) + (len(rs) - 1, len(rs) - 2)
    w = ctx.const(rhs)
    if w is not None:
        w = np.asarray(w)
        if b_perm:
            w = np.transpose(w, b_perm)
        w = w.reshape((batch, n, k) if batch > 1 else (n, k)).astype(np.float16)
    bshape = (batch,) if batch > 1 else ()
    try:
        # N padded to the K atom: the output cube is then the next matmul's A (K%32,
        # cross-op-chaining.md) and a dense run of whole EW chunks, so the element-wise ops
        # that follow keep it in place
        # ... except for a concat piece, which is written into its channel slice of the
        # concat's cube: padding it past the N atom would reach into the next piece
        align = None if ctx.sliced is not None and ctx.sliced(out) else \
            ctx.profile.input(DType.F16).k_align
        prog = mm.build_matmul(m, k, n, DType.F16, DType.F16, ctx.profile, batch=batch, b=w,
                               out_channel_align=align, name=f"mm{out.id}")
        emitter = "matmul.lower_matmul"
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    ops = [Use(lhs, (), a_perm, bshape + (m, k))]
    if w is None:
        ops.append(Use(rhs, (), b_perm, bshape + (n, k)))
    call = OpCall(prog, tuple(ops), (Use(out, (), None, bshape + (m, n)),),
                  label=f"matmul {batch}x{m}x{k}x{n}", emitter=emitter)
    return RuleResult([call])


RULES = {Op.DOT_GENERAL: lower_dot_general}
