"""Which element-wise passes run split by rows (emitters/eltwise_rows.py) instead of by flat
byte ranges (issue 9).

A norm's statistics are feature reduces (rules/reduce.py), each job summing a range of rows
over every channel. The passes that make a reduce's operand -- LayerNorm's x * 2^-s0 and its
square, the centring x - mean, c * t and its square (range_rewrites.rewrite_square_sums) --
split by the same rows put every byte a reduce job reads on the core that sums it: the passes
and the reduce share one NPU step with no cross-core copy between them (coalesce.merge), and
the cube crosses cores once, into the row ranges, instead of before each reduce.

Opt-in (``ROCKJIT_ROW_SPLIT=1``, debugflags.ROW_SPLIT): a row range of an NC1HWC2 cube is a
piece of every channel plane, and the flying DPU task that runs a piece is validated only for
one flat run (flying.py), so the split runs one self-chained task per plane and row range:
SigLIP-224 ~3170 tasks per layer against ~330 with the flat split, for 16 NPU steps against
20. What that costs rests on the price of a small DPU-only task inside a chained kick, which
no published figure gives: with chained tasks free the model gave 205.4 against 206.5 ms per
forward (1024 tokens: 997.2 against 997.3); charging every operand-reading task a CBUF fill
(cost ``fill_us``, fitted on a CNN of conv tasks) it gives 397.5 against 208.4 (1232.0
against 1045.3).

A pass is split by rows when its result reaches a last-axis reduce_sum through at most
``DEPTH`` element-wise add / sub / mul nodes of the same shape, it is a single matrix cube,
and the reduce of that cube has more than one job (``reduce_row_cuts``: the cuts are the
reduce's). Other passes keep the flat split (eltwise.part_bounds), which placement spreads
by cost either way (resident_placement.py chooses the cores of each step's jobs).
"""
from __future__ import annotations

import math

from ... import debugflags
from ...ir.graph import Value
from ...ir.ops import Op
from .base import CubeForm, RuleContext
from ...ir.types import DType
from ..regcmd import LoweringError

DEPTH = 3
_PASSES = (Op.MUL, Op.ADD, Op.SUB)


def feeds_feature_reduce(ctx: RuleContext, v: Value, depth: int = DEPTH) -> bool:
    frontier = [v]
    for _ in range(depth):
        nxt = []
        for val in frontier:
            last = len(val.type.shape) - 1
            for u in ctx.users.get(val.id, []):
                if u.op is Op.REDUCE_SUM and tuple(u.attrs["axes"]) == (last,):
                    return True
                if u.op in _PASSES and u.out.type.shape == val.type.shape:
                    nxt.append(u.out)
        frontier = nxt
    return False


def row_split_cuts(ctx: RuleContext, form: CubeForm) -> tuple[int, ...]:
    """The row cuts of the node's pass over ``form``, or () for the flat split."""
    if not debugflags.enabled(debugflags.ROW_SPLIT.name):
        return ()
    lay = form.layout
    if len(form.batch_items()) != 1 or lay.width != 1 or form.roles[-1:] != ("c",) or \
            lay.surf_stride != lay.height * ctx.profile.atom_bytes:
        return ()
    if not feeds_feature_reduce(ctx, ctx.node.out):
        return ()
    rows = int(math.prod(form.shape[:-1]))
    return reduce_row_cuts(ctx, rows, lay.channels)


def row_parts(ctx: RuleContext, batch: int, m: int, k: int) -> int | None:
    """The row tile cap that gives a single cube's feature reduce a multiple of the cores'
    count of near-equal row tiles where its plan has another count (fewer tiles than cores:
    one per core; five of a 1024-row cube: six), or None. reuse.py keeps at least a job per
    core, so each core's rows are an equal share: placement can run the rows on all cores
    instead of gathering the cube onto one (a norm's operand arrives spread over the cores),
    and the passes split by the same rows (``row_split_cuts``) balance too; the cost model
    still keeps them on one core where that is cheaper. Only where the K steps stay the same:
    every row's sum then adds the same terms in the same order as the unsplit plan's."""
    from ..emitters.matmul import plan_matmul

    cores = ctx.profile.cores
    if batch != 1 or cores <= 1:
        return None
    try:
        plan, _ = plan_matmul(m, k, 1, DType.F16, DType.F32, ctx.profile)
    except LoweringError:
        return None
    tiles = len(plan.rows)
    if tiles % cores == 0:
        return None
    align = ctx.profile.row_align
    least = max(ctx.profile.ew_min_positions, ctx.profile.min_feature_rows)
    want = -(-tiles // cores) * cores
    cap = -(-(-(-m // want)) // align) * align
    if cap < least or cap >= m:
        return None
    try:
        split, _ = plan_matmul(m, k, 1, DType.F16, DType.F32, ctx.profile, max_m=cap)
    except LoweringError:
        return None
    return cap if split.channels == plan.channels and len(split.rows) % cores == 0 else None


def reduce_row_cuts(ctx: RuleContext, m: int, k: int) -> tuple[int, ...]:
    """The first rows of the second and later jobs of the feature reduce of a single [m, k]
    cube (its row tiles as reuse.py groups them into jobs): where a pass over the same cube
    split by rows must cut for each of its jobs to find its rows on the core that sums
    them. () where the reduce is one job."""
    from ..emitters.matmul import plan_matmul
    from ..emitters.reuse import reuse_groups

    try:
        plan, _ = plan_matmul(m, k, 1, DType.F16, DType.F32, ctx.profile,
                              max_m=row_parts(ctx, 1, m, k))
    except LoweringError:
        return ()
    starts = sorted({plan.rows[min(r for r, _ in tiles)].out_row
                     for _, tiles in reuse_groups(plan, ctx.profile)})
    return tuple(r for r in starts if 0 < r < m)
