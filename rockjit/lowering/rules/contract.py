"""dot_general -> matmul-as-1x1-conv OpCalls (notes: matmul-as-conv.md).

Operand mapping: the lhs becomes A[M, K] (its free axes folded into M, the contraction last),
the rhs B[N, K] (one row per output column). A compile-time rhs (a resident weight) is packed
into the weight layout once, at compile time (a ``const`` buffer). A run-time rhs (attention's
K and V) has no on-device route into the weight layout, so the op asks for it as row-major fp16
and packs it with a host ``pack_weight`` step (counted in the stats). Batch axes (attention's
heads) become one OpCall per batch element; they are independent, so their jobs share one NPU
step and spread over the cores.

The emitter is ``emitters.matmul.lower_matmul`` when the matmul engineer's tiled version is
present. Until then ``single_k_program`` below builds the OpProgram from the single-tile task
emitter (``plan_matmul_tile`` + ``emit_matmul``): N is cut into CBUF-fitting tiles, each a
task writing its channel groups of one output cube, chained into one kick per job, and the
tiles spread over ``jobs`` parallel jobs. Shapes whose A (all of K for the padded M rows) does
not fit the CBUF need K-accumulation or M tiles and are refused (NoNpuForm).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from ...ir.ops import Op
from ...ir.types import DType
from ..layouts import matrix_output_layout
from ..opprogram import BufferSpec, HostStep, NpuJob, NpuStep, OpProgram, Slice
from ..profile import ChipProfile
from ..regcmd import LoweringError, Reloc, link
from .base import NoNpuForm, OpCall, RuleContext, RuleResult, Use, npu_dtype_of

MAX_JOBS = 3   # one per NPU core (profile.cores); independent N tiles


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _plan_n_tiles(m: int, k: int, n: int, profile: ChipProfile):
    from ..emitters.matmul import plan_matmul_tile

    p = profile.input(DType.F16)
    n_pad = _round_up(n, p.n_align)
    nt = n_pad
    last_err: Exception | None = None
    while nt >= p.n_align:
        try:
            plan_matmul_tile(m, k, nt, DType.F16, DType.F16, profile)
            break
        except LoweringError as e:
            last_err = e
            nt = _round_up(nt // 2, p.n_align) if nt > p.n_align else 0
    else:
        nt = 0
    if nt == 0:
        raise NoNpuForm(f"matmul M={m} K={k} does not fit one CBUF pass even for "
                        f"{p.n_align} output columns ({last_err}); it needs K-accumulation or "
                        f"M tiles (emitters.matmul tiled lowering)")
    tiles = []
    for n0 in range(0, n, nt):
        ni = min(nt, n - n0)
        tiles.append((n0, plan_matmul_tile(m, k, ni, DType.F16, DType.F16, profile)))
    return tiles


def single_k_program(m: int, k: int, n: int, profile: ChipProfile, weights: np.ndarray | None,
                     name: str = "matmul") -> OpProgram:
    """C[m, n] = A[m, k] . B[n, k]^T (fp16 in, fp32 accumulate, fp16 out) over N tiles.

    Buffers: ``a`` (input 0, the A cube), ``b`` (const: the packed weight tiles) or ``b_rows``
    (input 1, row-major fp16 [n, k]) + ``b`` (scratch, packed by host steps), ``c`` (output 0),
    ``regcmd``."""
    from ..emitters.matmul import emit_matmul

    tiles = _plan_n_tiles(m, k, n, profile)
    t0 = tiles[0][1]
    p = profile.input(DType.F16)
    c_layout = matrix_output_layout(profile, DType.F16, DType.F16, t0.m_pad,
                                    _round_up(n, p.n_align))
    b_offsets, off = [], 0
    for _, t in tiles:
        b_offsets.append(off)
        off += t.b_bytes
    b_total = off
    bufs: list[BufferSpec] = [BufferSpec("a", "input", t0.a_bytes, layout=t0.a_layout, bind=0)]
    steps: list = []
    if weights is not None:
        w = np.asarray(weights, np.float16)
        if w.shape != (n, k):
            raise LoweringError(f"matmul weights must be [{n}, {k}], got {w.shape}")
        data = np.concatenate([t.pack_b(w[n0:n0 + t.n]) for n0, t in tiles])
        bufs.append(BufferSpec("b", "const", b_total, data=data))
    else:
        bufs.append(BufferSpec("b_rows", "input", n * k * 2, dtype="f16", shape=(n, k), bind=1))
        bufs.append(BufferSpec("b", "scratch", b_total))
        for (n0, t), bo in zip(tiles, b_offsets):
            steps.append(HostStep("pack_weight", {
                "src": Slice("b_rows", n0 * k * 2, t.n * k * 2),
                "dst": Slice("b", bo, t.b_bytes)},
                {"kernels": t.n, "channels": k, "kh": 1, "kw": 1, "n_group": p.weight_n_group,
                 "k_group": p.weight_k_group, "esize": p.esize}))
    bufs.append(BufferSpec("c", "output", c_layout.nbytes, layout=c_layout, bind=0))
    # spread the N tiles over up to MAX_JOBS jobs, each one chained kick
    njobs = min(MAX_JOBS, profile.cores, len(tiles))
    groups = [tiles[i::njobs] for i in range(njobs)]
    gofs = [b_offsets[i::njobs] for i in range(njobs)]
    kicks, base = [], 0
    for gi, (grp, bos) in enumerate(zip(groups, gofs)):
        tasks = [emit_matmul(t, profile, Reloc("a"), Reloc("b", bo),
                             Reloc("c", (n0 // c_layout.c2) * c_layout.surf_stride),
                             name=f"{name}_n{n0}") for (n0, t), bo in zip(grp, bos)]
        kick = link(tasks, profile, "regcmd", base)
        kicks.append(kick)
        base += _round_up(kick.nbytes, profile.regcmd_align_bytes)
    bufs.append(BufferSpec("regcmd", "regcmd", base))
    reads = ("a", "b")
    jobs = tuple(NpuJob((kk,), reads=reads, writes=("c",)) for kk in kicks)
    steps.append(NpuStep(jobs))
    return OpProgram(tuple(bufs), tuple(steps), macs=m * k * n)


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
    lower = getattr(mm, "lower_matmul", None)
    bshape = (batch,) if batch > 1 else ()
    try:
        if lower is not None:
            # N padded to the K atom: the output cube is then the next matmul's A (K%32,
            # cross-op-chaining.md) and a dense run of whole EW chunks, so the element-wise
            # ops that follow keep it in place
            # ... except for a concat piece, which is written into its channel slice of the
            # concat's cube: padding it past the N atom would reach into the next piece
            align = None if ctx.sliced is not None and ctx.sliced(out) else \
                ctx.profile.input(DType.F16).k_align
            prog = lower(m, k, n, DType.F16, DType.F16, ctx.profile, batch=batch, b=w,
                         out_channel_align=align,
                         name=f"mm{out.id}")
            emitter = "matmul.lower_matmul"
        else:
            if batch > 1:
                raise NoNpuForm("batched matmul needs emitters.matmul.lower_matmul")
            prog = single_k_program(m, k, n, ctx.profile, w, f"mm{out.id}")
            emitter = "matmul.emit_matmul (N tiles)"
    except LoweringError as e:
        raise NoNpuForm(str(e)) from None
    ops = [Use(lhs, (), a_perm, bshape + (m, k))]
    if w is None:
        ops.append(Use(rhs, (), b_perm, bshape + (n, k)))
    call = OpCall(prog, tuple(ops), (Use(out, (), None, bshape + (m, n)),),
                  label=f"matmul {batch}x{m}x{k}x{n}", emitter=emitter)
    return RuleResult([call])


RULES = {Op.DOT_GENERAL: lower_dot_general}
