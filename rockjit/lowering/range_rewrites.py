"""The range plan's rewrites (range_plan.py's docstring): norm statistics in a per-row-scaled
form, and gated-MLP products prescaled into the down-projection's weights."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..ir.rules import infer_type
from ..ir.types import DType, TensorType
from ..weight_timing import timed
from .fp16_range import FP16_MAX
from .range_bounds import (INF, MAX_PRESCALE, ROW_TARGET, SQUARE_SAFE, T_MAX_LOG2, T_MIN_LOG2,
                           _through, absmax, is_square, last_axis_sum, row_factor)


# ---------------------------------------------------------------------------------------------
# the norm-statistics rewrite
# ---------------------------------------------------------------------------------------------

class GraphEditor:
    """Builds replacement nodes with fresh value ids (types from the IR's shape rules)."""

    def __init__(self, graph: Graph) -> None:
        ids = [v.id for n in graph.nodes for v in n.outputs] + [v.id for v in graph.inputs]
        self.next = max(ids, default=0) + 1

    def node(self, out: list[Node], op: Op, inputs, attrs=None, out_type=None, loc=None,
             result: Value | None = None) -> Value:
        attrs = dict(attrs or {})
        t = infer_type(op, [v.type for v in inputs], attrs,
                       out_type if result is None else result.type)
        if result is None:
            result = Value(self.next, t)
            self.next += 1
        out.append(Node(op, tuple(inputs), (result,), attrs, loc))
        return result

    def const(self, out: list[Node], value: float, t: TensorType, loc) -> Value:
        """A scalar constant broadcast to ``t`` (binary ops take operands of one type)."""
        s = self.node(out, Op.CONSTANT, (), {"value": np.array(value, np.float32)},
                      TensorType(DType.F32, ()), loc)
        if t.shape == ():
            return s
        return self.node(out, Op.BROADCAST_IN_DIM, (s,), {"broadcast_dimensions": ()}, t, loc)


@dataclass
class NormSite:
    """One rewritten sum of squares."""

    square: Value          # the original c * c
    c: Value
    bound: float           # c's bound
    shift: int             # pass 1's s0
    scaled: Value          # c2 = c * t (pass 2's operand)
    prescaled: Value       # pass 1's operand: c * 2^-s0, or x * 2^-s0 where c = x - mean(x)
    loc: str
    operand_bound: float = INF   # the bound of the value pass 1 prescales (c, or x)
    from_x: bool = False         # pass 1 squared x, beside mean(x)'s own reduction


def _prescale_shift(bound: float) -> int:
    """s0: the power of two that brings a value of this bound within 255 (its fp16 square
    within range), at most MAX_PRESCALE."""
    if not math.isfinite(bound):
        return MAX_PRESCALE
    return min(MAX_PRESCALE, max(0, math.ceil(math.log2(max(bound, 1.0) / 255.0))))


def _const_of(v: Value, consts: Mapping[int, np.ndarray]) -> float | None:
    c = consts.get(v.id)
    if c is None or np.size(c) == 0:
        return None
    c = np.asarray(c)
    first = c.flat[0]
    return float(first) if np.all(c == first) else None


def mean_centred(c: Value, producers: Mapping[int, Node],
                 consts: Mapping[int, np.ndarray]) -> tuple[Value, Node] | None:
    """If ``c = x - broadcast(sum(x) / H)`` (or ``* (1/H)``) with the sum over x's last axis of
    H elements -- LayerNorm's centring as ``jnp.mean`` traces -- (x, the sum's node)."""
    p = producers.get(c.id)
    if p is None or p.op is not Op.SUB:
        return None
    x, b = p.inputs
    if x.type != c.type or not x.type.shape:
        return None
    h = x.type.shape[-1]
    mp = producers.get(_through(b, producers).id)
    if mp is None or mp.op not in (Op.DIV, Op.MUL):
        return None
    for num, k in (mp.inputs, mp.inputs[::-1]):
        kv = _const_of(k, consts)
        if kv is None or num.id in consts:
            continue
        if (mp.op is Op.DIV and kv == float(h) and k is mp.inputs[1]) or \
                (mp.op is Op.MUL and kv == float(np.float32(1.0 / h))):
            red = producers.get(_through(num, producers).id)
            if red is not None and last_axis_sum(red) and red.inputs[0].id == x.id:
                rows = int(np.prod(x.type.shape[:-1], dtype=np.int64))
                if red.out.type.size == rows and mp.out.type.size == rows:
                    return x, red
    return None


def _pass1(ed: GraphEditor, out: list[Node], v: Value, s0: int, attrs, loc) -> tuple[Value, Value]:
    """An exact power-of-two prescale, squares in fp16 range, an fp32 reduce: (v 2^-s0, r1)."""
    v1 = ed.node(out, Op.MUL, (v, ed.const(out, 2.0 ** -s0, v.type, loc)), loc=loc) if s0 else v
    q1 = ed.node(out, Op.MUL, (v1, v1), loc=loc)
    return v1, ed.node(out, Op.REDUCE_SUM, (q1,), dict(attrs), loc=loc)


class _Host:
    """f32 arithmetic on per-row values (the host's O(rows) tail)."""

    def __init__(self, ed: GraphEditor, out: list[Node], rows_t: TensorType, loc) -> None:
        self.ed, self.out, self.t, self.loc = ed, out, rows_t, loc

    def k(self, value: float) -> Value:
        # every compile-time float beyond fp16's range is saturated to 2^15, host operands
        # too (fp16_range.saturate): a larger factor must be split
        if not abs(value) <= FP16_MAX:
            raise AssertionError(f"range_rewrites: host constant {value} beyond fp16's range")
        return self.ed.const(self.out, value, self.t, self.loc)

    def op(self, op: Op, *xs) -> Value:
        ins = tuple(self.k(x) if isinstance(x, (int, float)) else x for x in xs)
        return self.ed.node(self.out, op, ins, loc=self.loc)


def _square_sum_bound(hb: _Host, r1: Value, s0: int, h: int) -> Value:
    """An upper bound of sum(v^2) per row from pass 1's r1 = sum(fp16(v 2^-s0)^2): the fp16
    squares and the fp32 sum round by < 2^-9 relative, and the squares pass 1 flushed to zero
    are each below 2^-24 4^s0 (fp16's smallest subnormal, unscaled). 4^s0 as two exact
    factors 2^s0: 4^8 = 65536 is past fp16's range and a constant would be saturated."""
    u = hb.op(Op.MUL, hb.op(Op.MUL, hb.op(Op.MUL, r1, 2.0 ** s0), 2.0 ** s0), 1 + 2.0 ** -9)
    return hb.op(Op.ADD, u, h * 2.0 ** (2 * s0 - 24))


def _centred_bound(hb: _Host, r1: Value, sx: Value, s0: int, h: int) -> Value:
    """An upper bound of sum(c^2) per row, c = fp16(x - m~) as the NPU computes it, from x's
    pass 1 r1 and the NPU's fp32 row sum Sx of x: V = A U2 - B Sx^2 + C, U2 as
    ``_square_sum_bound`` (derivation: ``rewrite_square_sums``' docstring). Seven host ops:
    every slack folds into the constants A, B, C."""
    k = h * 2.0 ** -23 + 2.0 ** -20
    a = (1 + 2.0 ** -8) * (1 + 2 * k * (1 + k) + 2 * (k + 2.0 ** -9 * (1 + k)) ** 2 + 2.0 ** -20)
    floor = h * 2.0 ** (2 * s0 - 24)
    c = floor * a + (1 + 2.0 ** -8) * h * 2.0 ** -45 + h * 2.0 ** -39
    au2 = hb.op(Op.MUL, hb.op(Op.MUL, r1, 2.0 ** s0), 2.0 ** s0 * (1 + 2.0 ** -9) * a)
    sq = hb.op(Op.MUL, hb.op(Op.MUL, sx, sx), (1 + 2.0 ** -8) / h)
    v = hb.op(Op.SUB, hb.op(Op.ADD, au2, c), sq)
    # the same floor as pass 1 on c (t never above ROW_TARGET / sqrt(H 2^(2 s0 - 24)))
    return hb.op(Op.MAX, v, floor)


def _row_scale(hb: _Host, v: Value) -> Value:
    """t = the power of two 2^floor(log2(ROW_TARGET / sqrt(v))): exact in fp16 and f32, so
    c * t is exact on the NPU and the host's division by t exact too. floor via a truncating
    convert of a value made positive by +64 (t is far above 2^-64)."""
    ed, out, rows_t, loc = hb.ed, hb.out, hb.t, hb.loc
    t = hb.op(Op.LOG, hb.op(Op.RSQRT, v))
    t = hb.op(Op.ADD, hb.op(Op.MUL, t, 1 / math.log(2)), 64.0 + math.log2(ROW_TARGET))
    k = ed.node(out, Op.CONVERT, (t,), {}, TensorType(DType.I32, rows_t.shape), loc)
    t = ed.node(out, Op.CONVERT, (k,), {}, rows_t, loc)
    t = hb.op(Op.SUB, t, 64.0)
    t = hb.op(Op.MAX, hb.op(Op.MIN, t, T_MAX_LOG2), T_MIN_LOG2)
    return hb.op(Op.POW, 2.0, t)


def rewrite_square_sums(graph: Graph, consts: Mapping[int, np.ndarray],
                        bounds: Mapping[int, float]) -> tuple[Graph, list[NormSite]]:
    """Rewrite every ``sum(c * c)`` over the last axis whose c may exceed ``SQUARE_SAFE``
    (range_plan.py's docstring). The result equals the original graph in exact arithmetic; the
    values it makes differ from the original's only where the original would have overflowed.

    Pass 1 only picks the per-row power of two t, so it only needs an upper bound V of
    sum(c^2) per row (|c_i| <= sqrt(V) -> |c_i t| <= ROW_TARGET). Where c = x - mean(x)
    (``mean_centred``: LayerNorm), pass 1 squares x instead of c: r1 = sum(fp16(x 2^-s0)^2),
    s0 from x's bound. It needs only x, so it runs in the NPU step of mean(x)'s own sum Sx:
    one host round trip fewer per norm. The host bounds sum(c^2) from it (all terms >= 0):

      m~ = the fp16 mean the NPU subtracts, c_i = fp16(x_i - m~), mu = S1 / H, S1 = sum x_i
      sum (x_i - m~)^2 = S2 - S1^2 / H + H (mu - m~)^2            (exact, any m~)
      S2 <= U2 = 2^s0 2^s0 (1 + 2^-9) r1 + H 2^(2 s0 - 24)         (as pass 1 on c)
      |Sx - S1| <= e = k sqrt(H U2),  k = H 2^-23 + 2^-20   (fp32 sum of H terms, any order,
                                          even truncating; sum |x| <= sqrt(H S2))
      S1^2 >= Sx^2 - 2 e |Sx|  and  |Sx| <= sqrt(H U2) + e, so
      S1^2 / H >= Sx^2 / H - 2 k (1 + k) U2
      |mu - m~| <= (e + 2^-9 |Sx|) / H + 2^-23   (Sx/H's f32 and m~'s fp16 rounding, < 2^-10
                                                    even truncating), so with (a+b)^2 <= 2a^2+2b^2
      H (mu - m~)^2 <= 2 (k + 2^-9 (1 + k))^2 U2 + H 2^-45
      c_i^2 <= (1 + 2^-8) (x_i - m~)^2 + 2^-39    (c's own fp16 rounding: relative 2^-11, or
                                                    2^-25 among subnormals)
      V = max(A U2 - B Sx^2 + C', H 2^(2 s0 - 24)),  B = (1 + 2^-8) / H,
          A = (1 + 2^-8) (1 + 2 k (1 + k) + 2 (k + 2^-9 (1 + k))^2 + 2^-20),
          C' = (1 + 2^-8) H 2^-45 + H 2^-39
    The 2^-20 in A covers the host's own f32 rounding (A U2 - B Sx^2 cancels when
    |mean| >> std: its absolute error is a few 2^-24 U2). The floor is pass 1 on c's. An
    overflowed c (inf) still gives NaN downstream, never the bias: c2 = inf * t.

    Precision: V is loose when |mean| >> std: its slacks (2^-9 S2 from U2, 2 k U2 from the
    fp32 sum) are ~2^-9 H m^2, so t falls below ideal by ~2^-4.5 |m| / std. t stays a power
    of two, so c t and the result are bit-identical wherever c t and (c t)^2 stay normal fp16;
    at H 768 the squares reach fp16's subnormals (< 2^-14) once std < ~2^-12.7 |m| -- within
    a few ulps of fp16's resolution of x itself (2^-10 |m|) -- and pass 2's variance is still
    within 2^-9 there, down to std = 2^-15 |m| (tests/lowering/test_norm_stat_bound.py). So
    the pass on c is not kept for mean-centred squares. 4^s0 is applied as two factors 2^s0:
    a host constant past 65504 would be saturated to 2^15 like every compile-time float
    (fp16_range.saturate)."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[Node, Node, Value, list[Node], tuple[Value, Node] | None]] = {}
    for n in graph.nodes:
        c = is_square(n)
        if c is None or not c.type.dtype.is_float or c.id in consts or len(c.type.shape) < 1:
            continue
        if n.out.id in outputs:
            continue
        us = users.get(n.out.id, [])
        if len(us) != 1 or not last_axis_sum(us[0]) or us[0].out.id in outputs:
            continue
        if bounds.get(c.id, INF) <= SQUARE_SAFE:
            continue
        others = [u for u in users.get(c.id, []) if u is not n]
        if c.id in outputs or any(row_factor(u, c, producers) is None for u in others):
            continue   # c has other uses: left as is (recorded as a plain fp16 square)
        plans[n.out.id] = (n, us[0], c, others, mean_centred(c, producers, consts))
    if not plans:
        return graph, []

    ed = GraphEditor(graph)
    # per-row multiplies to redo: node id(old user) -> (c2, the per-row power of two t)
    redo: dict[int, tuple[Value, Value]] = {}
    # the mean's sum node id -> the squares (plan keys) whose pass 1 runs beside it
    beside: dict[int, list[int]] = {}
    reduces = {id(p[1]) for p in plans.values()}
    for key, (sq, red, c, others, mc) in list(plans.items()):
        if mc is not None and id(mc[1]) in reduces:   # x is itself a rewritten square
            plans[key] = (sq, red, c, others, None)
        elif mc is not None:
            beside.setdefault(id(mc[1]), []).append(key)
    pass1_x: dict[int, tuple[int, Value, Value]] = {}   # plan key -> (s0, x 2^-s0, r1)
    drop: set[int] = set()
    sites: list[NormSite] = []
    new_nodes: list[Node] = []
    f32 = DType.F32

    for n in graph.nodes:
        if id(n) in drop:
            continue
        if id(n) in redo:
            c2, tp = redo[id(n)]
            c = next(u for u in n.inputs if u.id != c2.id and row_factor(n, u, producers)
                     is not None)
            g_b = n.inputs[1] if n.inputs[0].id == c.id else n.inputs[0]
            g = producers[g_b.id].inputs[0]
            t_g = ed.node(new_nodes, Op.RESHAPE, (tp,), {}, TensorType(f32, g.type.shape), n.loc) \
                if g.type.shape != tp.type.shape else tp
            gt = ed.node(new_nodes, Op.DIV, (g, t_g), loc=n.loc)
            bp = producers[g_b.id]
            gb = ed.node(new_nodes, Op.BROADCAST_IN_DIM, (gt,), dict(bp.attrs), g_b.type, n.loc)
            ed.node(new_nodes, n.op, (c2, gb), loc=n.loc, result=n.out)
            continue
        if n.out.id in plans:
            sq, red, c, others, mc = plans[n.out.id]
            loc = n.loc
            shape = c.type.shape
            h = shape[-1]
            hb = _Host(ed, new_nodes, TensorType(f32, shape[:-1]), loc)
            bound = bounds.get(c.id, INF)
            if mc is not None:
                s0, v1, r1 = pass1_x[n.out.id]
                v = _centred_bound(hb, r1, mc[1].out, s0, h)
                op_bound = bounds.get(mc[0].id, INF)
            else:
                s0 = _prescale_shift(bound)
                v1, r1 = _pass1(ed, new_nodes, c, s0, red.attrs, loc)
                v = _square_sum_bound(hb, r1, s0, h)
                op_bound = bound
            tp = _row_scale(hb, v)
            # pass 2: every row scaled so its largest element is <= ROW_TARGET
            r = len(shape)
            tb = ed.node(new_nodes, Op.BROADCAST_IN_DIM, (tp,),
                         {"broadcast_dimensions": tuple(range(r - 1))}, c.type, loc)
            c2 = ed.node(new_nodes, Op.MUL, (c, tb), loc=loc)
            q2 = ed.node(new_nodes, Op.MUL, (c2, c2), loc=loc)
            r2 = ed.node(new_nodes, Op.REDUCE_SUM, (q2,), dict(red.attrs), loc=loc)
            # two divisions by a power of two (exact; t * t could leave fp16 if the host
            # product were ever placed on the NPU)
            r2t = ed.node(new_nodes, Op.DIV, (r2, tp), loc=loc)
            ed.node(new_nodes, Op.DIV, (r2t, tp), loc=red.loc, result=red.out)
            drop.add(id(red))
            for u in others:
                redo[id(u)] = (c2, tp)
            sites.append(NormSite(sq.out, c, bound, s0, c2, v1, str(loc) if loc else "",
                                  op_bound, mc is not None))
            continue
        new_nodes.append(n)
        for key in beside.get(id(n), ()):
            # pass 1 on x, right beside the mean's sum of x (the same NPU step)
            x = plans[key][4][0]
            s0 = _prescale_shift(bounds.get(x.id, INF))
            pass1_x[key] = (s0, *_pass1(ed, new_nodes, x, s0, n.attrs, n.loc))
    return Graph(graph.name, graph.inputs, new_nodes, graph.outputs), sites


@dataclass
class ProductSite:
    """One product prescaled into fp16 range, undone in the weights of the matmuls it feeds."""

    scaled_operand: Value   # q * 2^-s
    product: Value          # p * (q * 2^-s), the matmuls' new input
    shift: int
    bound: float            # the original product's bound
    loc: str


def _pow2_scaled(w: np.ndarray, shift: int, dtype: np.dtype) -> np.ndarray:
    """``w * 2^shift`` rounded once to ``dtype``. A float32 product by a float32 power of two
    is one correctly rounded operation on exact inputs, so it gives the float64 route's bits
    without its two copies of the weight (ModernBERT-base's down-projections)."""
    if w.dtype == np.float32 and np.dtype(dtype) == np.float32 and -126 <= shift <= 127:
        return w * np.float32(2.0 ** shift)
    return (np.asarray(w, np.float64) * 2.0 ** shift).astype(dtype)


def rewrite_matmul_inputs(graph: Graph, consts: Mapping[int, np.ndarray],
                          bounds: Mapping[int, float]) -> tuple[Graph, list[ProductSite]]:
    """A product ``p * q`` of two in-range values whose bound exceeds fp16 (a gated MLP's
    ``gelu(a) * b`` with large gains), consumed only by matmuls with resident weights (the
    down-projection): computed as ``p * (q 2^-s)`` and each matmul's weights scaled by 2^s, so
    the product stays in fp16 and the matmul's result is unchanged. Both scalings are exact
    powers of two; the cost is an absolute error of 2^(s-25) per element where q 2^-s falls
    into fp16's subnormals, far below the matmul's own rounding."""
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[int, Value, Value, list[Node]]] = {}
    for n in graph.nodes:
        if n.op is not Op.MUL or is_square(n) is not None or not n.out.type.dtype.is_float:
            continue
        b = bounds.get(n.out.id, INF)
        if not (FP16_MAX < b < INF) or n.out.id in outputs:
            continue
        p, q = n.inputs
        if any(v.id in consts or bounds.get(v.id, INF) > FP16_MAX for v in (p, q)):
            continue
        if p.type != q.type or p.type != n.out.type:
            continue
        us = users.get(n.out.id, [])
        shift = math.ceil(math.log2(b / 32768.0))
        ok = bool(us) and shift <= 24
        for u in us:
            w = consts.get(u.inputs[1].id) if u.op is Op.DOT_GENERAL else None
            if w is None or u.inputs[0].id != n.out.id or u.inputs[1].id == n.out.id or \
                    absmax(w) * 2.0 ** shift > FP16_MAX:
                ok = False
                break
        if not ok:
            continue
        if bounds.get(p.id, INF) > bounds.get(q.id, INF):
            p, q = q, p
        plans[n.out.id] = (shift, p, q, us)
    if not plans:
        return graph, []
    ed = GraphEditor(graph)
    sites: list[ProductSite] = []
    redo: dict[int, tuple[Value, int]] = {}
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in redo:
            v2, shift = redo[id(n)]
            w = n.inputs[1]
            with timed("fold") as folded:       # the weight prescaled: weight work
                wv = _pow2_scaled(np.asarray(consts[w.id]), shift, w.type.dtype.to_numpy())
                folded[0] = wv.nbytes
            w2 = ed.node(out_nodes, Op.CONSTANT, (), {"value": wv}, w.type, n.loc)
            ed.node(out_nodes, n.op, (v2, w2), dict(n.attrs), loc=n.loc, result=n.out)
            continue
        if n.out.id in plans:
            shift, p, q, us = plans[n.out.id]
            c = ed.const(out_nodes, 2.0 ** -shift, q.type, n.loc)
            q2 = ed.node(out_nodes, Op.MUL, (q, c), loc=n.loc)
            v2 = ed.node(out_nodes, Op.MUL, (p, q2), loc=n.loc)
            for u in us:
                redo[id(u)] = (v2, shift)
            sites.append(ProductSite(q2, v2, shift, bounds[n.out.id],
                                     str(n.loc) if n.loc else ""))
            continue
        out_nodes.append(n)
    return Graph(graph.name, graph.inputs, out_nodes, graph.outputs), sites
