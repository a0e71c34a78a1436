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
from .fp16_range import FP16_MAX
from .range_bounds import (INF, MAX_PRESCALE, ROW_TARGET, SQUARE_SAFE, T_MAX_LOG2, T_MIN_LOG2, absmax,
                           is_square, last_axis_sum, row_factor)


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
        plans[n.out.id] = (n, us[0], c, others)
    if not plans:
        return graph, []

    ed = GraphEditor(graph)
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


@dataclass
class ScoreScaleSite:
    """One ``(a @ b) * c`` computed as ``(a 2^k) @ b * (c 2^-k)``."""

    scaled_operand: Value   # a * 2^k
    shift: int              # -k: the power of two moved onto the operand is 2^-shift
    loc: str


def _uniform_scale(v: Value, consts: Mapping[int, np.ndarray]) -> float | None:
    c = consts.get(v.id)
    if c is None or c.size == 0:
        return None
    first = float(np.asarray(c).flat[0])
    if not (math.isfinite(first) and first > 0.0) or np.any(np.asarray(c) != first):
        return None
    return first


def rewrite_score_scales(graph: Graph, consts: Mapping[int, np.ndarray],
                         bounds: Mapping[int, float]) -> tuple[Graph, list[ScoreScaleSite]]:
    """A matmul of two activations scaled by a constant below 1 -- attention's
    ``q k^T * head_dim^-0.5`` -- writes the unscaled product in fp16 first: logits of 8192
    (head_dim 64) are 65536 before the scale and overflow, though the scaled logits fit.
    The scale's power-of-two part 2^k (k < 0) moves onto the matmul's first activation operand
    (as HF's Whisper and torch's SDPA scale q), so the matmul writes the scaled product; the
    rest of the scale (in [1, 2)) stays after it. Exact: a power of two scales an fp16 value
    without rounding (below 2^-14 it may lose bits of values far under the matmul's own
    rounding). Only where the product's bound exceeds fp16 and nothing else reads it."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[int, float]] = {}   # mul node's out id -> (k, remainder)
    for n in graph.nodes:
        if n.op is not Op.MUL or not n.out.type.dtype.is_float:
            continue
        for d, c in (n.inputs, n.inputs[::-1]):
            dot = producers.get(d.id)
            scale = _uniform_scale(c, consts)
            if dot is None or dot.op is not Op.DOT_GENERAL or scale is None or d.id in consts:
                continue
            if d.id in outputs or len(users.get(d.id, [])) != 1 or d.type != n.out.type:
                continue
            if bounds.get(d.id, INF) <= FP16_MAX or not any(
                    x.id not in consts and x.type.dtype.is_float for x in dot.inputs):
                continue
            k = math.floor(math.log2(scale))
            if k >= 0:
                continue
            plans[id(dot)] = (k, scale * 2.0 ** -k, d, c, n)
            break
    if not plans:
        return graph, []
    ed = GraphEditor(graph)
    muls = {id(p[4]): p for p in plans.values()}
    sites: list[ScoreScaleSite] = []
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in plans:
            k, rest, d, c, mul = plans[id(n)]
            i = next(j for j, x in enumerate(n.inputs) if x.id not in consts)
            x = n.inputs[i]
            two_k = ed.const(out_nodes, 2.0 ** k, x.type, n.loc)
            xs = ed.node(out_nodes, Op.MUL, (x, two_k), loc=n.loc)
            ins = list(n.inputs)
            ins[i] = xs
            ed.node(out_nodes, n.op, tuple(ins), dict(n.attrs), loc=n.loc,
                    result=mul.out if rest == 1.0 else d)
            sites.append(ScoreScaleSite(xs, -k, str(n.loc) if n.loc else ""))
            continue
        if id(n) in muls:
            k, rest, d, c, mul = muls[id(n)]
            if rest != 1.0:
                r = ed.const(out_nodes, rest, d.type, n.loc)
                ed.node(out_nodes, Op.MUL, (d, r), loc=n.loc, result=n.out)
            continue
        out_nodes.append(n)
    return Graph(graph.name, graph.inputs, out_nodes, graph.outputs), sites
