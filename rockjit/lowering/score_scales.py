"""Attention's score scale moved off the scores (a range-plan rewrite, range_plan.py).

``(q @ k^T) * c`` with a constant ``c`` below 1 (``head_dim^-0.5``) is computed as
``(q 2^k) @ k^T * (c 2^-k)``: the scale's power-of-two part 2^k moves onto the matmul's first
activation operand (as HF's Whisper and torch's SDPA scale q) and only the rest, in [1, 2),
stays after the matmul (none at all for head_dim 64). Two reasons:

* range: the matmul writes its product in fp16 before any scale. Logits of 8192 (head_dim 64)
  are 65536 unscaled and overflow though the scaled logits fit;
* work: the scores are [heads, q, keys], q is [heads, q, head_dim], so the scale costs a pass
  over the smaller of the two -- and nothing at all where q is a projection with resident
  weights reached through reshapes and transposes only: 2^k then goes into its weights and
  bias (``W 2^k``, ``b 2^k``); nor where q is a product of constants (RoPE's ``q cos +
  rotate_half(q) sin``, rotation_fold.py): 2^k goes into the constants (``cos 2^k``,
  ``sin 2^k``), which the element-wise products read anyway.

Exact: a power of two scales an fp16 value without rounding; a weight or value below 2^-14
after the scale loses low bits as a subnormal, an absolute error under 2^-25 of the unit it
multiplies, far below the matmul's own rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..ir.types import TensorType
from ..weight_timing import timed
from .const_views import distinct_view, uniform_value
from .gain_fold import feature_vector
from .range_rewrites import GraphEditor

# the ops that carry q from its projection to the score matmul without changing its values
_CARRY = (Op.RESHAPE, Op.TRANSPOSE)


@dataclass
class ScoreScaleSite:
    """One ``(a @ b) * c`` computed as ``(a 2^k) @ b * (c 2^-k)``."""

    scaled_operand: Value   # a * 2^k
    shift: int              # -k: the power of two moved onto the operand is 2^-shift
    loc: str
    into_weights: bool = False   # 2^k went into the projection's weights and bias, or into
    #                              the constants q is a product of (RoPE's cos/sin tables)


def _uniform_scale(v: Value, consts: Mapping[int, np.ndarray]) -> float | None:
    """The positive finite value every element of constant ``v`` holds, or None."""
    c = consts.get(v.id)
    s = None if c is None else uniform_value(c)
    return s if s is not None and math.isfinite(s) and s > 0.0 else None


def _projection(x: Value, producers, users, consts, outputs
                ) -> tuple[Node, Node | None, np.ndarray | None] | None:
    """(dot, bias add, bias vector) when ``x`` is ``x_in @ W (+ b)`` (W, b resident) carried
    to its one reader by reshapes and transposes, each value on the way read once."""
    v = x
    while True:
        if v.id in outputs or len(users.get(v.id, [])) != 1:
            return None
        n = producers.get(v.id)
        if n is None or n.op not in _CARRY:
            break
        v = n.inputs[0]

    def weights_dot(d: Value) -> Node | None:
        dot = producers.get(d.id)
        ok = dot is not None and dot.op is Op.DOT_GENERAL and d.id not in outputs \
            and len(users.get(d.id, [])) == 1 and dot.inputs[1].id in consts \
            and dot.inputs[0].id not in consts and dot.inputs[1].type.dtype.is_float
        return dot if ok else None

    top = producers.get(v.id)
    if top is None:
        return None
    if top.op is Op.DOT_GENERAL:
        dot = weights_dot(v)
        return None if dot is None else (dot, None, None)
    if top.op is not Op.ADD:
        return None
    for d, b in (top.inputs, top.inputs[::-1]):
        dot = weights_dot(d)
        vec = feature_vector(b, consts)
        if dot is not None and vec is not None:
            return dot, top, vec
    return None


def _table_products(x: Value, producers, users, consts, outputs
                    ) -> list[tuple[Node, int]] | None:
    """(mul, index of its constant operand) of each term when ``x`` is ``a * C`` or
    ``a * C1 + b * C2`` with C, C1, C2 constants (RoPE's ``q cos + rotate_half(q) sin``),
    ``x`` and each term read once: 2^k goes into the constants."""
    if x.id in outputs or len(users.get(x.id, [])) != 1:
        return None
    n = producers.get(x.id)
    if n is None:
        return None
    if n.op is Op.ADD:
        if n.inputs[0].id == n.inputs[1].id or any(
                v.id in outputs or len(users.get(v.id, [])) != 1 for v in n.inputs):
            return None
        terms = [producers.get(v.id) for v in n.inputs]
    else:
        terms = [n]
    out = []
    for t in terms:
        if t is None or t.op is not Op.MUL:
            return None
        ci = [i for i, v in enumerate(t.inputs) if v.id in consts]
        if len(ci) != 1 or not t.inputs[ci[0]].type.dtype.is_float:
            return None
        out.append((t, ci[0]))
    return out


def _scaled_const(ed: GraphEditor, out_nodes: list[Node], c: np.ndarray, k: int, t: TensorType,
                  loc) -> Value:
    """``c 2^k`` as a constant of its distinct values broadcast to ``t`` (a table over 12
    heads is stored once)."""
    d = distinct_view(c)
    ds = np.ascontiguousarray(d * np.asarray(2.0 ** k, d.dtype))
    ds.setflags(write=False)
    v = ed.node(out_nodes, Op.CONSTANT, (), {"value": ds}, TensorType(t.dtype, ds.shape), loc)
    return ed.node(out_nodes, Op.BROADCAST_IN_DIM, (v,),
                   {"broadcast_dimensions": tuple(range(len(t.shape)))}, t, loc)


def rewrite_score_scales(graph: Graph, consts: Mapping[int, np.ndarray]
                         ) -> tuple[Graph, list[ScoreScaleSite]]:
    """Every ``(a @ b) * c`` of two activations with a uniform constant c < 1, the product
    read by nothing else, rewritten as the module docstring says."""
    producers = graph.producers()
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple] = {}       # id(score dot) -> (k, rest, d, c, mul, projection)
    for n in graph.nodes:
        if n.op is not Op.MUL or not n.out.type.dtype.is_float:
            continue
        for d, c in (n.inputs, n.inputs[::-1]):
            dot = producers.get(d.id)
            if dot is None or dot.op is not Op.DOT_GENERAL or d.id in consts:
                continue      # before scanning c: a mask or gain constant is a large array
            scale = _uniform_scale(c, consts)
            if scale is None:
                continue
            if d.id in outputs or len(users.get(d.id, [])) != 1 or d.type != n.out.type:
                continue
            if not all(x.id not in consts and x.type.dtype.is_float for x in dot.inputs):
                continue
            k = math.floor(math.log2(scale))
            if k >= 0:
                continue
            x = dot.inputs[0]
            proj = _projection(x, producers, users, consts, outputs)
            tables = None if proj is not None else \
                _table_products(x, producers, users, consts, outputs)
            plans[id(dot)] = (k, scale * 2.0 ** -k, d, c, n, proj, tables)
            break
    if not plans:
        return graph, []
    ed = GraphEditor(graph)
    muls = {id(p[4]): p for p in plans.values()}
    weights = {id(p[5][0]): p[0] for p in plans.values() if p[5] is not None}
    biases = {id(p[5][1]): (p[0], p[5][2]) for p in plans.values()
              if p[5] is not None and p[5][1] is not None}
    tables = {id(m): (p[0], i) for p in plans.values() if p[6] for m, i in p[6]}
    sites: list[ScoreScaleSite] = []
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in weights:
            w = consts[n.inputs[1].id]
            with timed("fold") as folded:       # the projection's weight scaled: weight work
                ws = np.asarray(w * np.asarray(2.0 ** weights[id(n)], w.dtype))
                folded[0] = ws.nbytes
            ws.setflags(write=False)
            w2 = ed.node(out_nodes, Op.CONSTANT, (), {"value": ws}, n.inputs[1].type, n.loc)
            ed.node(out_nodes, n.op, (n.inputs[0], w2), dict(n.attrs), loc=n.loc, result=n.out)
            continue
        if id(n) in biases:
            k, vec = biases[id(n)]
            t = n.out.type
            bs = np.asarray(vec * np.asarray(2.0 ** k, vec.dtype))
            bs.setflags(write=False)
            c = ed.node(out_nodes, Op.CONSTANT, (), {"value": bs}, TensorType(t.dtype, bs.shape),
                        n.loc)
            cb = ed.node(out_nodes, Op.BROADCAST_IN_DIM, (c,),
                         {"broadcast_dimensions": (len(t.shape) - 1,)}, t, n.loc)
            dot_in = next(v for v in n.inputs if v.id not in consts)
            ed.node(out_nodes, Op.ADD, (dot_in, cb), {}, loc=n.loc, result=n.out)
            continue
        if id(n) in tables:
            k, i = tables[id(n)]
            ins = list(n.inputs)
            ins[i] = _scaled_const(ed, out_nodes, consts[ins[i].id], k, ins[i].type, n.loc)
            ed.node(out_nodes, n.op, tuple(ins), dict(n.attrs), loc=n.loc, result=n.out)
            continue
        if id(n) in plans:
            k, rest, d, c, mul, proj, tab = plans[id(n)]
            i = next(j for j, x in enumerate(n.inputs) if x.id not in consts)
            x = n.inputs[i]
            if tab:         # the constants' products now hold q 2^k
                xs, ins = x, list(n.inputs)
            elif proj is None:
                two_k = ed.const(out_nodes, 2.0 ** k, x.type, n.loc)
                xs = ed.node(out_nodes, Op.MUL, (x, two_k), loc=n.loc)
                ins = list(n.inputs)
                ins[i] = xs
            else:       # the projection's own output now holds q 2^k
                xs, ins = (proj[1] or proj[0]).out, list(n.inputs)
            ed.node(out_nodes, n.op, tuple(ins), dict(n.attrs), loc=n.loc,
                    result=mul.out if rest == 1.0 else d)
            sites.append(ScoreScaleSite(xs, -k, str(n.loc) if n.loc else "",
                                        proj is not None or bool(tab)))
            continue
        if id(n) in muls:
            k, rest, d, c, mul = muls[id(n)][:5]
            if rest != 1.0:
                r = ed.const(out_nodes, rest, d.type, n.loc)
                ed.node(out_nodes, Op.MUL, (d, r), loc=n.loc, result=n.out)
            continue
        out_nodes.append(n)
    return Graph(graph.name, graph.inputs, out_nodes, graph.outputs), sites
