"""The range plan: a compile-time bound for every float value, and what the lowering does where
a value could leave fp16's range (design.md, convention 13).

Bounds are magnitudes (a bound B means |v| <= B for every element), from interval arithmetic
over the IR with the resident weights known: one rule per op in ``BOUND_RULES``. A matmul's
output is bounded by each output column's weight L1 norm times the input bound; a LayerNorm's
output by sqrt(H) (each centred element is at most sqrt(H) row deviations) times its gain,
plus its shift; a softmax lies in [0, 1]; saturating functions in their limits.

Input assumption (one place: ``fp16_range.INPUT_BOUND``): a float32 argument's dtype range says
nothing useful, so graph inputs are assumed to lie within fp16's finite range (the NPU reads
them as fp16; the call-time input check enforces it). Worst-case bounds through a residual
stream then grow layer by layer past fp16 -- real streams do not, but the bound cannot know
that -- so the plan does not prescale by such bounds (that would flush every ordinary value to
zero). Instead it handles the known overflow sites *structurally*, with a method exact for any
fp16 input, and prescales by a bound only where the bound is tight enough to use:

* Norm statistics (LayerNorm's and RMSNorm's sum of squares). ``c * c`` overflows fp16 for
  |c| >= 256 (real Whisper checkpoints carry a channel at ~620; a ModernBERT-large stream
  passes 29000), and rsqrt(inf) = 0 would silently turn the row into the LayerNorm bias. Every
  ``sum(c * c)`` over the last axis whose operand bound exceeds ``SQUARE_SAFE`` is rewritten
  into a per-row-scaled form (``rewrite_square_sums``):

      pass 1  c1 = c * 2^-s0 (s0 from c's bound, at most 8: |c| <= 65504 -> |c1| < 256),
              r1 = sum(c1 * c1)                     NPU: exact scale, fp32 reduce
      host    t  = 2^floor(log2(ROW_TARGET / sqrt(4^s0 r1 + floor)))   per row, O(rows)
      pass 2  c2 = c * t,  r2 = sum(c2 * c2)        NPU: per-row multiply, fp32 reduce
      host    sum(c * c) = r2 / t^2;  and every per-row multiply c * g of the norm's output
              becomes c2 * (g / t), so the output is computed from the same c2 the
              statistics saw.

  The floor (H 2^(2 s0 - 24)) covers the squares pass 1 flushed to zero, so |c2| <= ROW_TARGET
  for every element of every row: no square overflows whatever the row holds, and a row of
  small values is scaled *up* (no fp16 underflow of its squares either). t is a power of two,
  so c * t is exact in fp16 and the host's divisions by t are exact: where the original would
  not have overflowed, the output is what it would have been.
  The mean path needs nothing: the NPU's feature reduce sums fp16 inputs in fp32.

* Gated-MLP products (the down-projection's input). ``p * q`` of two in-range values whose
  bound passes fp16, read only by matmuls with resident weights, becomes ``p * (q 2^-s)`` with
  the weights scaled by 2^s (``rewrite_matmul_inputs``): exact powers of two, the matmul's
  result unchanged. This one is driven by the bound (finite here: LayerNorm output bound x the
  weights' L1 norms), so it may prescale where real data would not need it; the cost is an
  absolute error of 2^(s-25) per element, below the matmul's own rounding.

What the plan guarantees: no fp16 overflow in a norm's statistics for any fp16 input, none in a
value whose bound is finite and below 65504 (``fp16``), none in a prescaled product; values it
cannot bound (``assumed``: the residual stream and what is computed from it before a norm)
stay within fp16 only if the data does -- and if they do not, the program raises
``NumericsError`` (program.py) instead of returning the result.

Every record says what the plan decided for one value: ``fp16`` (bound within fp16), ``fp32``
(the NPU writes it in fp32: the feature reduce), ``host`` (computed on the host in f32),
``prescale 2^-s`` / ``row prescale`` (the rewrite above), or ``assumed`` (an NPU fp16 value
whose worst-case bound exceeds fp16 -- a residual stream -- that relies on the input
assumption; an overflow there shows as inf/NaN in the output, never as a plausible number,
because the norm rewrite turns an infinite deviation into NaN instead of the bias).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..ir.graph import Graph, Loc, Node, Value
from ..ir.ops import Group, Op
from ..ir.rules import infer_type
from ..ir.types import DType, TensorType
from .fp16_range import FP16_MAX, INPUT_BOUND

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
            return _absmax(c)
        return self.bounds.get(v.id, INF)


def _absmax(a: np.ndarray) -> float:
    a = np.asarray(a)
    if a.size == 0:
        return 0.0
    if a.dtype.kind == "b":
        return 1.0
    # the extremes in the array's own dtype (exact), widened only as two scalars: a float64
    # copy of every weight, once per bound query, was most of compute_bounds' time
    hi, lo = float(np.max(a)), float(np.min(a))
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
    x, y = n.inputs
    if _is_softmax_div(n, ctx):
        return 1.0
    cy = ctx.const(y)
    if cy is not None:
        m = float(np.min(np.abs(np.asarray(cy, np.float64)))) if np.size(cy) else 0.0
        return ctx.of(x) / m if m > 0 else INF
    return INF


def _b_exp(n: Node, ctx: BoundCtx) -> float:
    from .calibrate import is_max_subtracted

    if is_max_subtracted(ctx.producers.get, ctx.const, n.inputs[0]):
        return 1.0
    a = ctx.of(n.inputs[0])
    return math.exp(a) if a < 700 else INF


def _b_one(n: Node, ctx: BoundCtx) -> float:
    return 1.0


def _b_activation(n: Node, ctx: BoundCtx) -> float:
    from ..ir.activations import activation

    return activation(n.attrs["kind"]).bound(ctx.of(n.inputs[0]))


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
    w = np.abs(np.asarray(w, np.float64))
    rc = tuple(n.attrs["rhs_contract"])
    # the largest L1 norm over the contracted axes, over every output column (and batch)
    return a * float(np.max(np.sum(w, axis=rc))) if w.size else 0.0


def _b_conv(n: Node, ctx: BoundCtx) -> float:
    x, w = n.inputs[:2]
    wc = ctx.const(w)
    if wc is None:
        return INF
    wc = np.abs(np.asarray(wc, np.float64))
    if wc.size == 0:
        return 0.0
    # rhs is [O, I/groups, *K]: one output channel's L1 norm over its inputs and taps
    return ctx.of(x) * float(np.max(wc.reshape(wc.shape[0], -1).sum(axis=1)))


BOUND_RULES: dict[Op, Callable[[Node, BoundCtx], float]] = {
    Op.NEG: _b_first, Op.ABS: _b_first, Op.EXP: _b_exp, Op.TANH: _b_one, Op.LOGISTIC: _b_one,
    Op.ERF: _b_one, Op.SIN: _b_one, Op.COS: _b_one, Op.INTEGER_POW: _b_pow,
    Op.ACTIVATION: _b_activation, Op.SOFTMAX: _b_one,
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


def _is_square(n: Node) -> Value | None:
    """The c of ``c * c`` / ``c ** 2``, else None."""
    if n.op is Op.MUL and n.inputs[0].id == n.inputs[1].id:
        return n.inputs[0]
    if n.op is Op.INTEGER_POW and n.attrs["y"] == 2:
        return n.inputs[0]
    return None


def _last_axis_sum(n: Node) -> bool:
    r = len(n.inputs[0].type.shape)
    return n.op is Op.REDUCE_SUM and r >= 1 and tuple(n.attrs["axes"]) == (r - 1,)


def _row_factor(n: Node, c: Value, producers: Mapping[int, Node]) -> Value | None:
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
    rows = int(np.prod(c.type.shape[:-1], dtype=np.int64))
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
        if _row_factor(n, c, ctx.producers) is None:
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
        if q is None or not _last_axis_sum(q):
            continue
        sq = ctx.producers.get(q.inputs[0].id)
        if sq is None or (sq2 := _is_square(sq)) is None or sq2.id != c.id:
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
    return ps is not None and _last_axis_sum(ps) and ps.inputs[0].id == e.id


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
            ctx.bounds[v.id] = _absmax(consts[v.id])
            continue
        if v.id in known:
            ctx.bounds[v.id] = known[v.id]
            continue
        rule = BOUND_RULES.get(n.op)
        ctx.bounds[v.id] = rule(n, ctx) if rule is not None else INF
    return ctx.bounds


# ---------------------------------------------------------------------------------------------
# the norm-statistics rewrite
# ---------------------------------------------------------------------------------------------

class _Editor:
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
    prescaled: Value       # c1 = c * 2^-s0
    loc: str


def rewrite_square_sums(graph: Graph, consts: Mapping[int, np.ndarray],
                        bounds: Mapping[int, float]) -> tuple[Graph, list[NormSite]]:
    """Rewrite every ``sum(c * c)`` over the last axis whose c may exceed ``SQUARE_SAFE``
    (module docstring). The result equals the original graph in exact arithmetic; the values
    it makes differ from the original's only where the original would have overflowed."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[Node, Node, Value, list[Node]]] = {}
    for n in graph.nodes:
        c = _is_square(n)
        if c is None or not c.type.dtype.is_float or c.id in consts or len(c.type.shape) < 1:
            continue
        if n.out.id in outputs:
            continue
        us = users.get(n.out.id, [])
        if len(us) != 1 or not _last_axis_sum(us[0]) or us[0].out.id in outputs:
            continue
        if bounds.get(c.id, INF) <= SQUARE_SAFE:
            continue
        others = [u for u in users.get(c.id, []) if u is not n]
        if c.id in outputs or any(_row_factor(u, c, producers) is None for u in others):
            continue   # c has other uses: left as is (recorded as a plain fp16 square)
        plans[n.out.id] = (n, us[0], c, others)
    if not plans:
        return graph, []

    ed = _Editor(graph)
    # per-row multiplies to redo: node id(old user) -> (c2, the per-row power of two t)
    redo: dict[int, tuple[Value, Value]] = {}
    drop: set[int] = set()
    sites: list[NormSite] = []
    new_nodes: list[Node] = []
    f32 = DType.F32

    for n in graph.nodes:
        if id(n) in drop:
            continue
        if id(n) in redo:
            c2, tp = redo[id(n)]
            c = next(u for u in n.inputs if u.id != c2.id and _row_factor(n, u, producers)
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
            sq, red, c, others = plans[n.out.id]
            loc = n.loc
            shape = c.type.shape
            h = shape[-1]
            rows_t = TensorType(f32, shape[:-1])
            bound = bounds.get(c.id, INF)
            s0 = MAX_PRESCALE if not math.isfinite(bound) else \
                min(MAX_PRESCALE, max(0, math.ceil(math.log2(max(bound, 1.0) / 255.0))))
            # pass 1: an exact power-of-two prescale, squares in fp16 range, fp32 reduce
            c1 = ed.node(new_nodes, Op.MUL, (c, ed.const(new_nodes, 2.0 ** -s0, c.type, loc)),
                         loc=loc) if s0 else c
            q1 = ed.node(new_nodes, Op.MUL, (c1, c1), loc=loc)
            r1 = ed.node(new_nodes, Op.REDUCE_SUM, (q1,), dict(red.attrs), loc=loc)
            # host: a per-row upper bound of sum(c^2): the squares pass 1 flushed to zero are
            # each below 2^-24 4^s0 (fp16's smallest subnormal, unscaled)
            v = ed.node(new_nodes, Op.MUL, (r1, ed.const(new_nodes, 4.0 ** s0 * (1 + 2.0 ** -9),
                                                         rows_t, loc)), loc=loc)
            v = ed.node(new_nodes, Op.ADD, (v, ed.const(new_nodes, h * 2.0 ** (2 * s0 - 24),
                                                        rows_t, loc)), loc=loc)
            # t = the power of two 2^floor(log2(ROW_TARGET / sqrt(v))): exact in fp16 and f32,
            # so c * t is exact on the NPU and the host's division by t exact too. floor via
            # a truncating convert of a value made positive by +64 (t is far above 2^-64)
            t = ed.node(new_nodes, Op.RSQRT, (v,), loc=loc)
            t = ed.node(new_nodes, Op.LOG, (t,), loc=loc)
            t = ed.node(new_nodes, Op.MUL, (t, ed.const(new_nodes, 1 / math.log(2), rows_t, loc)),
                        loc=loc)
            t = ed.node(new_nodes, Op.ADD, (t, ed.const(new_nodes, 64.0 + math.log2(ROW_TARGET),
                                                        rows_t, loc)), loc=loc)
            k = ed.node(new_nodes, Op.CONVERT, (t,), {}, TensorType(DType.I32, rows_t.shape), loc)
            t = ed.node(new_nodes, Op.CONVERT, (k,), {}, rows_t, loc)
            t = ed.node(new_nodes, Op.SUB, (t, ed.const(new_nodes, 64.0, rows_t, loc)), loc=loc)
            t = ed.node(new_nodes, Op.MIN, (t, ed.const(new_nodes, T_MAX_LOG2, rows_t, loc)),
                        loc=loc)
            t = ed.node(new_nodes, Op.MAX, (t, ed.const(new_nodes, T_MIN_LOG2, rows_t, loc)),
                        loc=loc)
            tp = ed.node(new_nodes, Op.POW, (ed.const(new_nodes, 2.0, rows_t, loc), t), loc=loc)
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
            sites.append(NormSite(sq.out, c, bound, s0, c2, c1, str(loc) if loc else ""))
            continue
        new_nodes.append(n)
    return Graph(graph.name, graph.inputs, new_nodes, graph.outputs), sites


@dataclass
class ProductSite:
    """One product prescaled into fp16 range, undone in the weights of the matmuls it feeds."""

    scaled_operand: Value   # q * 2^-s
    product: Value          # p * (q * 2^-s), the matmuls' new input
    shift: int
    bound: float            # the original product's bound
    loc: str


def rewrite_matmul_inputs(graph: Graph, consts: Mapping[int, np.ndarray],
                          bounds: Mapping[int, float]) -> tuple[Graph, list[ProductSite]]:
    """A product ``p * q`` of two in-range values whose bound exceeds fp16 (a gated MLP's
    ``gelu(a) * b`` with large gains), consumed only by matmuls with resident weights (the
    down-projection): computed as ``p * (q 2^-s)`` and each matmul's weights scaled by 2^s, so
    the product stays in fp16 and the matmul's result is unchanged. Both scalings are exact
    powers of two; the cost is an absolute error of 2^(s-25) per element where q 2^-s falls
    into fp16's subnormals, far below the matmul's own rounding."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[int, Value, Value, list[Node]]] = {}
    for n in graph.nodes:
        if n.op is not Op.MUL or _is_square(n) is not None or not n.out.type.dtype.is_float:
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
                    _absmax(w) * 2.0 ** shift > FP16_MAX:
                ok = False
                break
        if not ok:
            continue
        if bounds.get(p.id, INF) > bounds.get(q.id, INF):
            p, q = q, p
        plans[n.out.id] = (shift, p, q, us)
    if not plans:
        return graph, []
    ed = _Editor(graph)
    sites: list[ProductSite] = []
    redo: dict[int, tuple[Value, int]] = {}
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in redo:
            v2, shift = redo[id(n)]
            w = n.inputs[1]
            wv = (np.asarray(consts[w.id], np.float64) * 2.0 ** shift).astype(
                w.type.dtype.to_numpy())
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


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RangeRecord:
    value: int              # IR value id (%value)
    op: str
    loc: str                # the user's source line
    bound: float            # |value| <= bound (inf: no finite bound)
    action: str             # fp16 | fp32 | host | prescale 2^-s | row prescale | assumed
    note: str = ""

    def __str__(self) -> str:
        b = "inf" if not math.isfinite(self.bound) else f"{self.bound:.4g}"
        note = f"  [{self.note}]" if self.note else ""
        return f"%{self.value:<6} {self.op:<14} |v| <= {b:<10} {self.action:<14} {self.loc}{note}"


@dataclass
class RangePlan:
    bounds: dict[int, float]
    sites: list[NormSite]
    records: list[RangeRecord] = field(default_factory=list)
    products: list[ProductSite] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Counts for Program.stats(): prescaled / fp32 / host-kept / assumed values."""
        out = {"range_prescaled": 0, "range_fp32": 0, "range_host": 0, "range_fp16": 0,
               "range_assumed": 0, "range_norm_rewrites": len(self.sites),
               "range_matmul_input_rewrites": len(self.products)}
        for r in self.records:
            key = ("range_prescaled" if "prescale" in r.action else f"range_{r.action}")
            if key in out:
                out[key] += 1
        return out

    def report(self) -> str:
        return "\n".join(str(r) for r in self.records)


def plan_ranges(graph: Graph, params: Mapping[str, np.ndarray]) -> tuple[Graph, RangePlan]:
    """Bounds for ``graph``, the norm-statistics rewrite where a square could overflow, and
    the bounds of the rewritten graph (its records are filled in by ``finish_plan`` once the
    partition knows where each value is computed)."""
    from .fp16_range import saturate_consts
    from .fold import fold_consts

    consts = saturate_consts(fold_consts(graph, params))
    bounds = compute_bounds(graph, consts)
    g2, sites = rewrite_square_sums(graph, consts, bounds)
    known = dict(bounds)
    if sites:
        # the rewrite equals the original in exact arithmetic: a value it kept keeps its bound
        for s in sites:
            # pass 2's operand is <= ROW_TARGET by construction (no bound rule can see it)
            known[s.scaled.id] = ROW_TARGET
            known[s.prescaled.id] = min(bounds.get(s.c.id, INF), FP16_MAX) * 2.0 ** -s.shift
        consts = saturate_consts(fold_consts(g2, params))
        bounds = compute_bounds(g2, consts, known)
    g3, products = rewrite_matmul_inputs(g2, consts, bounds)
    if products:
        known = dict(bounds)
        for ps in products:
            known[ps.product.id] = ps.bound * 2.0 ** -ps.shift
        bounds = compute_bounds(g3, saturate_consts(fold_consts(g3, params)), known)
    plan = RangePlan(bounds, sites)
    plan.products = products
    return g3, plan


def finish_plan(plan: RangePlan, graph: Graph, decisions) -> None:
    """One record per float value the lowering computes: what it runs as and its bound."""
    where: dict[int, str] = {}
    for d in decisions:
        try:
            vid = int(d.node.split("=")[0].strip().lstrip("%"))
        except ValueError:
            continue
        where[vid] = d.where
    pre = {s.prescaled.id: (s.shift, "norm statistics, pass 1") for s in plan.sites if s.shift}
    pre.update({ps.scaled_operand.id: (ps.shift, "a matmul input's operand; undone in its "
                "weights") for ps in plan.products})
    scaled = {s.scaled.id for s in plan.sites}
    recs = []
    for n in graph.nodes:
        v = n.out
        w = where.get(v.id)
        if w not in ("npu", "host") or not v.type.dtype.is_float:
            continue
        b = plan.bounds.get(v.id, INF)
        loc = str(n.loc) if n.loc else ""
        note = ""
        if w == "host":
            action = "host"
        elif n.op is Op.REDUCE_SUM:
            action = "fp32"       # the feature reduce's ones-matmul writes fp32
        elif v.id in pre:
            action = f"prescale 2^-{pre[v.id][0]}"
            note = pre[v.id][1]
        elif v.id in scaled:
            action = "row prescale"
            note = "norm statistics, pass 2: each row to <= 128"
        elif b <= FP16_MAX:
            action = "fp16"
        else:
            action = "assumed"
            note = ("worst-case bound exceeds fp16; relies on inputs within fp16 "
                    "(fp16_range.INPUT_BOUND) -- an overflow shows as inf/NaN")
        recs.append(RangeRecord(v.id, n.op.text, loc, b, action, note))
    plan.records = recs
