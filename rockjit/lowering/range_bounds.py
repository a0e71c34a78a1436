"""The range plan's bounds (range_plan.py): a magnitude bound for every float value by interval
arithmetic over the IR with the resident weights known, one rule per op in ``BOUND_RULES``,
and the structural patterns (norm statistics, softmax) the bounds and the rewrites recognise."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..weight_timing import timed
from .compile_cache import memo_of_array
from .fp16_range import INPUT_BOUND, extremes

INF = math.inf
# |c| at or below this squares within fp16 with room: 128^2 = 16384, a quarter of 65504 (the
# DPU rounds the product to fp16; the fp32 feature reduce then sums the squares)
SQUARE_SAFE = 128.0
# pass 2 scales every row so its largest element is at most this (same reason)
ROW_TARGET = 128.0
# pass 1's power of two never exceeds this: |c| <= 65504 -> |c 2^-8| < 256 -> square < 65536;
# fp16 cannot hold a larger |c| at all
MAX_PRESCALE = 8
# t = 2^k with k in [T_MIN_LOG2, T_MAX_LOG2]: every such power of two is exact in fp16
# (2^-24 is its smallest subnormal, 2^15 its largest power of two)
T_MAX_LOG2 = 14.0
T_MIN_LOG2 = -24.0


# ---------------------------------------------------------------------------------------------
# bounds
# ---------------------------------------------------------------------------------------------

@dataclass
class BoundCtx:
    graph: Graph
    consts: Mapping[int, np.ndarray]
    producers: Mapping[int, Node]
    bounds: dict[int, float]

    def const(self, v: Value) -> np.ndarray | None:
        return self.consts.get(v.id)

    def of(self, v: Value) -> float:
        c = self.consts.get(v.id)
        if c is not None:
            return absmax(c)
        return self.bounds.get(v.id, INF)


def absmax(a: np.ndarray) -> float:
    a = np.asarray(a)
    if a.size == 0:
        return 0.0
    if a.dtype.kind == "b":
        return 1.0
    # the extremes in the array's own dtype (exact), widened only as two scalars: a float64
    # copy of every weight, once per bound query, was most of compute_bounds' time; once per
    # weight and compile (fp16_range.extremes)
    lo, hi = extremes(a)
    if not (math.isfinite(hi) and math.isfinite(lo)):
        return INF
    return max(abs(hi), abs(lo))


def _b_first(n: Node, ctx: BoundCtx) -> float:
    return ctx.of(n.inputs[0])


def _b_max(n: Node, ctx: BoundCtx) -> float:
    return max((ctx.of(v) for v in n.inputs), default=INF)


def _b_add(n: Node, ctx: BoundCtx) -> float:
    return ctx.of(n.inputs[0]) + ctx.of(n.inputs[1])


def _b_mul(n: Node, ctx: BoundCtx) -> float:
    a, b = (ctx.of(v) for v in n.inputs)
    if a == 0 or b == 0:
        return 0.0
    norm = _norm_output(n, ctx)
    if norm is not None:
        return norm
    return a * b


def _b_div(n: Node, ctx: BoundCtx) -> float:
    from ..ir.passes.softmax_dot import deferred_division
    from .calibrate import is_max_subtracted

    x, y = n.inputs
    if _is_softmax_div(n, ctx):
        return 1.0
    dot = deferred_division(n, ctx.producers)
    if dot is not None and is_max_subtracted(lambda v: ctx.producers.get(v.id), ctx.const,
                                             ctx.producers[dot.inputs[0].id].inputs[0]):
        # (e @ v) / sum(e): each quotient an average of v's entries (ir/passes/softmax_dot.py)
        return ctx.of(dot.inputs[1])
    cy = ctx.const(y)
    if cy is not None:
        m = float(np.min(np.abs(np.asarray(cy, np.float64)))) if np.size(cy) else 0.0
        return ctx.of(x) / m if m > 0 else INF
    return INF


def _b_exp(n: Node, ctx: BoundCtx) -> float:
    from .calibrate import is_max_subtracted

    if is_max_subtracted(lambda v: ctx.producers.get(v.id), ctx.const, n.inputs[0]):
        return 1.0
    a = ctx.of(n.inputs[0])
    return math.exp(a) if a < 700 else INF


def _b_one(n: Node, ctx: BoundCtx) -> float:
    return 1.0


def _b_activation(n: Node, ctx: BoundCtx) -> float:
    from ..ir.activations import activation

    return activation(n.attrs["kind"]).bound(ctx.of(n.inputs[0]))


def _b_layer_norm(n: Node, ctx: BoundCtx) -> float:
    # |c_i| <= sqrt(sum c^2) = sqrt(H mean(c^2)): the normalised row is at most sqrt(H)
    shape = n.inputs[0].type.shape
    return math.sqrt(float(np.prod([shape[a] for a in n.attrs["axes"]], dtype=np.int64)))


def _b_pow(n: Node, ctx: BoundCtx) -> float:
    a = ctx.of(n.inputs[0])
    y = int(n.attrs["y"])
    if y < 0:
        return INF
    try:
        return a ** y
    except OverflowError:
        return INF


def _b_reduce_sum(n: Node, ctx: BoundCtx) -> float:
    shape = n.inputs[0].type.shape
    count = int(np.prod([shape[a] for a in n.attrs["axes"]], dtype=np.int64))
    return ctx.of(n.inputs[0]) * count


def _b_window_sum(n: Node, ctx: BoundCtx) -> float:
    count = int(np.prod(n.attrs["window_dimensions"], dtype=np.int64))
    return ctx.of(n.inputs[0]) * count


def _b_select(n: Node, ctx: BoundCtx) -> float:
    return max((ctx.of(v) for v in n.inputs[1:]), default=INF)


def _b_iota(n: Node, ctx: BoundCtx) -> float:
    shape = n.out.type.shape
    return float(max(shape[n.attrs["dimension"]] - 1, 0)) if shape else 0.0


def _b_dot(n: Node, ctx: BoundCtx) -> float:
    lhs, rhs = n.inputs
    a = ctx.of(lhs)
    w = ctx.const(rhs)
    if w is None:
        k = int(np.prod([lhs.type.shape[i] for i in n.attrs["lhs_contract"]], dtype=np.int64))
        return a * ctx.of(rhs) * k
    rc = tuple(n.attrs["rhs_contract"])
    # the largest L1 norm over the contracted axes, over every output column (and batch);
    # once per weight and compile (the range plan bounds the graph several times)
    return a * memo_of_array("l1_dot", w, lambda: _max_l1(w, rc), rc)


def _max_l1(w: np.ndarray, rc: tuple[int, ...]) -> float:
    # a read of the weight's bytes: weight work (weight_timing "scan")
    with timed("scan") as scanned:
        scanned[0] = w.nbytes
        if w.ndim == 2 and rc == (1,) and w.size:
            return _max_row_l1(w)
        w = np.array(w, np.float64)         # a copy of its own: made absolute in place
        np.abs(w, out=w)
        return float(np.max(np.sum(w, axis=rc))) if w.size else 0.0


_L1_BLOCK = 1 << 17     # float64s per block of _max_row_l1 (1 MB: stays in cache)


def _max_row_l1(w: np.ndarray) -> float:
    """The largest row L1 norm of the 2-D ``w`` in float64, as ``_max_l1``'s whole-array
    copy computes it: each row's sum is its own reduction over the row, so rows go through
    in blocks whose float64 copy stays in cache (a fresh whole copy of every weight, 19 MB
    for 3072 x 768, was faulted in page by page)."""
    rows = max(1, _L1_BLOCK // w.shape[1])
    buf = np.empty(min(rows, w.shape[0]) * w.shape[1], np.float64)
    tops = []        # each block's largest (np.max of them: a NaN row sum stays NaN)
    for s in range(0, w.shape[0], rows):
        blk = buf[:min(rows, w.shape[0] - s) * w.shape[1]].reshape(-1, w.shape[1])
        np.copyto(blk, w[s:s + rows])
        np.abs(blk, out=blk)
        tops.append(np.max(np.sum(blk, axis=1)))
    return float(np.max(tops))


def _b_conv(n: Node, ctx: BoundCtx) -> float:
    x, w = n.inputs[:2]
    wc = ctx.const(w)
    if wc is None:
        return INF
    with timed("scan") as scanned:      # weight work, as _max_l1
        scanned[0] = np.asarray(wc).nbytes
        wc = np.abs(np.asarray(wc, np.float64))
        if wc.size == 0:
            return 0.0
        # rhs is [O, I/groups, *K]: one output channel's L1 norm over its inputs and taps
        l1 = float(np.max(wc.reshape(wc.shape[0], -1).sum(axis=1)))
    return ctx.of(x) * l1


BOUND_RULES: dict[Op, Callable[[Node, BoundCtx], float]] = {
    Op.NEG: _b_first, Op.ABS: _b_first, Op.EXP: _b_exp, Op.TANH: _b_one, Op.LOGISTIC: _b_one,
    Op.ERF: _b_one, Op.SIN: _b_one, Op.COS: _b_one, Op.INTEGER_POW: _b_pow,
    Op.ACTIVATION: _b_activation, Op.SOFTMAX: _b_one, Op.LAYER_NORM: _b_layer_norm,
    Op.ADD: _b_add, Op.SUB: _b_add, Op.MUL: _b_mul, Op.DIV: _b_div, Op.MAX: _b_max,
    Op.MIN: _b_max,
    Op.SELECT_N: _b_select,
    Op.REDUCE_SUM: _b_reduce_sum, Op.REDUCE_MAX: _b_first,
    Op.REDUCE_WINDOW_MAX: _b_first, Op.REDUCE_WINDOW_SUM: _b_window_sum,
    Op.BROADCAST_IN_DIM: _b_first, Op.RESHAPE: _b_first, Op.TRANSPOSE: _b_first,
    Op.SLICE: _b_first, Op.CONCATENATE: _b_max, Op.PAD: _b_max, Op.CONVERT: _b_first,
    Op.TAKE: _b_first, Op.IOTA: _b_iota,
    Op.DOT_GENERAL: _b_dot, Op.CONV: _b_conv,
}
"""Op -> rule(node, ctx) -> a bound on |result|. An op without a rule gets no bound (inf);
log, sqrt, rsqrt and pow have none: their results depend on how close inputs come to 0."""


# ---------------------------------------------------------------------------------------------
# patterns the bounds and the rewrite recognise
# ---------------------------------------------------------------------------------------------

def _through(v: Value, producers: Mapping[int, Node],
             ops=(Op.BROADCAST_IN_DIM, Op.RESHAPE)) -> Value:
    """``v`` seen through shape-only ops that keep its element count per row."""
    while True:
        p = producers.get(v.id)
        if p is None or p.op not in ops:
            return v
        v = p.inputs[0]


def is_square(n: Node) -> Value | None:
    """The c of ``c * c`` / ``c ** 2``, else None."""
    if n.op is Op.MUL and n.inputs[0].id == n.inputs[1].id:
        return n.inputs[0]
    if n.op is Op.INTEGER_POW and n.attrs["y"] == 2:
        return n.inputs[0]
    return None


def last_axis_sum(n: Node) -> bool:
    r = len(n.inputs[0].type.shape)
    return n.op is Op.REDUCE_SUM and r >= 1 and tuple(n.attrs["axes"]) == (r - 1,)


def row_factor(n: Node, c: Value, producers: Mapping[int, Node]) -> Value | None:
    """If ``n`` is ``c * broadcast(g)`` for a per-row ``g`` (one value per row of c), g's
    broadcast operand; else None."""
    if n.op is not Op.MUL or len(n.inputs) != 2:
        return None
    a, b = n.inputs
    other = b if a.id == c.id else a if b.id == c.id else None
    if other is None or other.id == c.id:
        return None
    p = producers.get(other.id)
    if p is None or p.op is not Op.BROADCAST_IN_DIM:
        return None
    src = p.inputs[0]
    rows = math.prod(c.type.shape[:-1])      # exact ints (np.prod costs microseconds)
    if src.type.size != rows:
        return None
    dims = tuple(p.attrs["broadcast_dimensions"])
    last = len(c.type.shape) - 1
    if last in dims and src.type.shape[dims.index(last)] != 1:
        return None
    return other


def _norm_output(n: Node, ctx: BoundCtx) -> float | None:
    """``c * broadcast(rsqrt(sum(c*c)/H + eps))``-shaped products (a norm's output): at most
    sqrt(H) in magnitude, whatever c is (|c_i| <= sqrt(sum c^2))."""
    for c in n.inputs:
        if row_factor(n, c, ctx.producers) is None:
            continue
        g = n.inputs[1] if n.inputs[0].id == c.id else n.inputs[0]
        v = _through(g, ctx.producers)
        p = ctx.producers.get(v.id)
        if p is None or p.op is not Op.RSQRT:
            continue
        s = p.inputs[0]
        # rsqrt(sum/H + eps) / rsqrt(mean + eps): look through the add of eps and the divide
        while True:
            q = ctx.producers.get(s.id)
            if q is None:
                break
            if q.op in (Op.ADD, Op.DIV, Op.MUL) and \
                    sum(ctx.const(u) is not None for u in q.inputs) == 1:
                s = next(u for u in q.inputs if ctx.const(u) is None)
                continue
            if q.op in (Op.BROADCAST_IN_DIM, Op.RESHAPE):
                s = q.inputs[0]
                continue
            break
        q = ctx.producers.get(s.id)
        if q is None or not last_axis_sum(q):
            continue
        sq = ctx.producers.get(q.inputs[0].id)
        if sq is None or (sq2 := is_square(sq)) is None or sq2.id != c.id:
            continue
        return math.sqrt(c.type.shape[-1])
    return None


def _is_softmax_div(n: Node, ctx: BoundCtx) -> bool:
    """e / broadcast(sum(e)) with e = exp(x - max x): every quotient lies in [0, 1]."""
    e, s = n.inputs
    pe = ctx.producers.get(e.id)
    if pe is None or pe.op is not Op.EXP:
        return False
    src = _through(s, ctx.producers)
    ps = ctx.producers.get(src.id)
    return ps is not None and last_axis_sum(ps) and ps.inputs[0].id == e.id


def compute_bounds(graph: Graph, consts: Mapping[int, np.ndarray],
                   known: Mapping[int, float] | None = None,
                   input_bound: float = INPUT_BOUND) -> dict[int, float]:
    """A bound on |v| for every float value of ``graph`` (inf where no rule bounds it);
    ``known``: bounds already established for some value ids (kept as they are);
    ``input_bound``: the assumed bound of every float graph input."""
    known = known or {}
    ctx = BoundCtx(graph, consts, graph.producers(), {})
    for v in graph.inputs:
        if v.type.dtype.is_float:
            ctx.bounds[v.id] = input_bound
    for n in graph.nodes:
        v = n.out
        if not v.type.dtype.is_float:
            continue
        if v.id in consts:
            ctx.bounds[v.id] = absmax(consts[v.id])
            continue
        if v.id in known:
            ctx.bounds[v.id] = known[v.id]
            continue
        rule = BOUND_RULES.get(n.op)
        ctx.bounds[v.id] = rule(n, ctx) if rule is not None else INF
    return ctx.bounds
