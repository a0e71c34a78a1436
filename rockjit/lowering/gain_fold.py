"""Per-channel gains folded into the weights of the matmuls that read them.

A norm without a bias ends in ``y = n * g`` (g a resident vector over the feature axis; RMSNorm
and ModernBERT's LayerNorm) and ``y`` is often read only by projections with resident weights.
On the NPU ``n * g`` is one more fp16 rounding of every element and ``g`` itself is rounded to
fp16, a per-channel error that every row repeats; with gains of 10-50 (real checkpoints;
tests/models/test_modernbert_sim.py plants them) those channels dominate the projection and the
two roundings do not average out. ``(n * g) @ W^T = n @ (W * g)^T`` exactly, and ``W * g`` is
computed here in float64 and rounded once when the weights are packed, so the projection reads
``n`` and the gain costs no rounding of its own (measured on ModernBERT-base with planted gains,
fp16-rounding JAX forwards: mean per-layer cosine 0.9999926 -> 0.9999961).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops import Op
from ..weight_timing import timed
from .const_views import distinct_view
from .fp16_range import FP16_MAX
from .range_rewrites import GraphEditor


@dataclass
class GainFoldSite:
    """One ``n * g`` whose gain went into the weights of ``matmuls`` projections."""

    product: Value
    matmuls: int
    loc: str


def feature_vector(v: Value, consts: Mapping[int, np.ndarray]) -> np.ndarray | None:
    """The per-feature vector of a resident value constant along every axis but the last."""
    c = consts.get(v.id)
    if c is None or not v.type.dtype.is_float or len(v.type.shape) < 1:
        return None
    c = np.asarray(c)
    vec = c.reshape(-1, c.shape[-1])[0]
    if not np.isfinite(vec).all():
        return None
    # a 12-head broadcast of a table is compared once, not twelve times (const_views.py)
    seen = distinct_view(c, keep_last=True)
    if not np.array_equal(seen, np.broadcast_to(vec, seen.shape)):
        return None
    return vec


def _folds_into(u: Node, prod: Value, consts: Mapping[int, np.ndarray]) -> int | None:
    """The rhs axis of ``u`` that ``prod``'s feature axis contracts with, when ``u`` is a
    matmul of ``prod`` (lhs) by resident weights over ``prod``'s last axis only."""
    if u.op is not Op.DOT_GENERAL or u.inputs[0].id != prod.id or u.inputs[1].id == prod.id:
        return None
    if u.inputs[1].id not in consts or not u.inputs[1].type.dtype.is_float:
        return None
    a = u.attrs
    last = len(prod.type.shape) - 1
    if tuple(a.get("lhs_contract", ())) != (last,) or tuple(a.get("lhs_batch", ())) or \
            tuple(a.get("rhs_batch", ())):
        return None
    return int(a["rhs_contract"][0])


def fold_norm_gains(graph: Graph, consts: Mapping[int, np.ndarray]
                    ) -> tuple[Graph, list[GainFoldSite]]:
    """``graph`` with each foldable ``n * g`` removed and its projections' weights scaled
    (module docstring); the sites folded."""
    users = graph.users()
    outputs = {v.id for v in graph.outputs}
    plans: dict[int, tuple[Value, np.ndarray, list[tuple[Node, int]]]] = {}
    for n in graph.nodes:
        if n.op is not Op.MUL or n.out.id in outputs or not n.out.type.dtype.is_float:
            continue
        for x, g in (n.inputs, n.inputs[::-1]):
            vec = feature_vector(g, consts)
            if vec is None or x.id in consts or x.type != n.out.type:
                continue
            us = users.get(n.out.id, [])
            axes = [_folds_into(u, n.out, consts) for u in us]
            if not us or any(ax is None for ax in axes):
                continue
            with timed("fold") as folded:
                scaled = [_scaled(consts[u.inputs[1].id], vec, ax, u.inputs[1].type.dtype.to_numpy())
                          for u, ax in zip(us, axes)]
                folded[0] = sum(w.nbytes for w, _ in scaled)
            if not all(fits for _, fits in scaled):
                continue     # the folded weights would not fit fp16: keep the gain apart
            scaled = [w for w, _ in scaled]
            plans[id(n)] = (x, vec, list(zip(us, scaled)))
            break
    if not plans:
        return graph, []
    ed = GraphEditor(graph)
    redo: dict[int, tuple[Value, np.ndarray]] = {}
    sites: list[GainFoldSite] = []
    out_nodes: list[Node] = []
    for n in graph.nodes:
        if id(n) in plans:
            x, _, folds = plans[id(n)]
            for u, w in folds:
                redo[id(u)] = (x, w)
            sites.append(GainFoldSite(n.out, len(folds), str(n.loc) if n.loc else ""))
            continue
        if id(n) in redo:
            x, w = redo[id(n)]
            wt = n.inputs[1].type
            w2 = ed.node(out_nodes, Op.CONSTANT, (), {"value": w},
                         wt, n.loc)
            ed.node(out_nodes, n.op, (x, w2), dict(n.attrs), loc=n.loc, result=n.out)
            continue
        out_nodes.append(n)
    return Graph(graph.name, graph.inputs, out_nodes, graph.outputs), sites


def _scaled(w: np.ndarray, vec: np.ndarray, axis: int, dtype: np.dtype
            ) -> tuple[np.ndarray, bool]:
    """``w * g`` along ``axis`` rounded once to ``dtype``, and whether it fits fp16."""
    w, vec = np.asarray(w), np.asarray(vec)
    shape = [1] * w.ndim
    shape[axis] = vec.shape[0]
    f32 = np.dtype(np.float32)
    if w.dtype == vec.dtype == np.dtype(dtype) == f32:
        # the float64 product of two float32 is exact, so rounding it to float32 once is the
        # correctly rounded float32 product: computed directly, without the float64 copy
        # (most of the compile's gain-fold time at ModernBERT-base)
        out = w * vec.reshape(shape)
        out.setflags(write=False)        # a constant from here on (fold.py keeps it as is)
        top = float(np.abs(out).max(initial=0.0))
        if top != FP16_MAX:
            # rounding is monotonic and FP16_MAX is a float32: the comparison is the exact one
            return out, not top > FP16_MAX
        # exactly FP16_MAX after rounding: the exact product may lie just above it
        exact = np.asarray(w, np.float64) * vec.astype(np.float64).reshape(shape)
        return out, not np.abs(exact).max(initial=0.0) > FP16_MAX
    exact = np.asarray(w, np.float64) * vec.astype(np.float64).reshape(shape)
    out = exact.astype(dtype)
    out.setflags(write=False)
    return out, not np.abs(exact).max(initial=0.0) > FP16_MAX
